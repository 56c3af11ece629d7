package main

// Proves the --network-policy* flags parse as the chart passes them (JSON
// LabelSelectors from toJson, comma-separated CIDRs) and that bad values
// stop the operator with the flag's name instead of rendering a policy.

import (
	"strings"
	"testing"
)

func TestNetworkPolicyFlags(t *testing.T) {
	o, err := networkPolicyOptions(true, "chimera-system", " 10.0.0.0/8, ,fd00::/64", `{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}`, "{}")
	if err != nil {
		t.Fatal(err)
	}
	if !o.Enabled || o.AdminClientNamespace != "chimera-system" || strings.Join(o.NFSClientCIDRs, " ") != "10.0.0.0/8 fd00::/64" {
		t.Fatalf("options %+v", o)
	}
	if o.MetricsNamespaceSelector == nil || o.MetricsNamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
		t.Fatalf("namespace selector %+v", o.MetricsNamespaceSelector)
	}
	if o.MetricsPodSelector == nil || len(o.MetricsPodSelector.MatchLabels) != 0 {
		t.Fatalf("{} must be an empty (select-all) pod selector, got %+v", o.MetricsPodSelector)
	}
	if o, err = networkPolicyOptions(true, "ns", "", "", "null"); err != nil || o.MetricsNamespaceSelector != nil || o.MetricsPodSelector != nil {
		t.Fatalf("empty selectors: %+v %v", o, err)
	}
	if o, err = networkPolicyOptions(false, "", "", "not json", ""); err != nil || o.Enabled {
		t.Fatalf("disabled policies must ignore the rest: %+v %v", o, err)
	}
	for _, tc := range []struct{ ns, metricsNS, metricsPods, want string }{
		{"", "", "", "--namespace"},
		{"ns", "app=prometheus", "", "--network-policy-metrics-namespaces"},
		{"ns", "", `{"matchLabel":{"a":"b"}}`, "--network-policy-metrics-pods"},
		{"ns", "", `{"matchExpressions":[{"key":"a","operator":"Bogus"}]}`, "--network-policy-metrics-pods"},
	} {
		if _, err := networkPolicyOptions(true, tc.ns, "", tc.metricsNS, tc.metricsPods); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one naming %s", tc, err, tc.want)
		}
	}
}
