package render

// Proves the chart's monitoring objects fit what the operator creates: the
// ServiceMonitor (rendered by the real helm with the Prometheus Operator's
// API versions declared) selects the MDS and DS Services that Build returns
// and no other Service, scrapes a port both of them name, and copies into
// target labels the Service labels the operator sets (the alert rules and the
// dashboard group by them); without those API versions neither the
// ServiceMonitor nor the PrometheusRule is rendered, while the Grafana
// dashboard ConfigMap always is (labelled for the Grafana sidecar).

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart sets (decoded strictly: a field the chart adds must be added here).
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any"`
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Scheme        string `json:"scheme"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
			Relabelings   []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

var monitoringAPIs = []string{
	"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
	"--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
}

// promLabel is how Prometheus's Kubernetes discovery names a Service label.
func promLabel(k string) string {
	return "__meta_kubernetes_service_label_" + regexp.MustCompile(`[^a-zA-Z0-9_]`).ReplaceAllString(k, "_")
}

func TestChartServiceMonitorSelectsTheOperatorsServices(t *testing.T) {
	objs := renderChart(t, monitoringAPIs...)
	sm := decode[serviceMonitor](t, objs, "ServiceMonitor/chimera-chimerad")
	if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Metadata.Namespace != "chimera-system" {
		t.Errorf("ServiceMonitor apiVersion %q namespace %q", sm.APIVersion, sm.Metadata.Namespace)
	}
	if !sm.Spec.NamespaceSelector.Any {
		t.Errorf("default namespaceSelector should take clusters in any namespace: %+v", sm.Spec.NamespaceSelector)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("want one endpoint, got %d", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	ch, err := Build(productionCluster(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range []*corev1.Service{ch.MDSService, ch.DSService} {
		if !sel.Matches(labels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor selector %s does not select Service %s %v", sel, svc.Name, svc.Labels)
		}
		found := false
		for _, p := range svc.Spec.Ports {
			found = found || (p.Name == ep.Port && p.Port == PortMetrics)
		}
		if !found {
			t.Errorf("Service %s has no port %q on %d", svc.Name, ep.Port, PortMetrics)
		}
	}
	// Not every object of the cluster carries a component: nothing else is selected.
	other := objectMeta(productionCluster(), "x", "")
	if sel.Matches(labels.Set(other.Labels)) {
		t.Errorf("selector %s also selects component-less objects %v", sel, other.Labels)
	}
	if sel.Matches(labels.Set{LabelName: "chimera", LabelManagedBy: "someone-else", LabelComponent: ComponentMDS}) {
		t.Errorf("selector %s selects Services the operator did not create", sel)
	}
	// The target labels the rules and dashboard use come from labels the Services carry.
	want := map[string]string{"chimera_cluster": LabelCluster, "component": LabelComponent}
	for _, r := range ep.Relabelings {
		if k, ok := want[r.TargetLabel]; ok && len(r.SourceLabels) == 1 && r.SourceLabels[0] == promLabel(k) {
			if ch.MDSService.Labels[k] == "" || ch.DSService.Labels[k] == "" {
				t.Errorf("target label %s comes from Service label %s, which the Services lack", r.TargetLabel, k)
			}
			delete(want, r.TargetLabel)
		}
	}
	if len(want) != 0 {
		t.Errorf("relabelings %+v do not set target labels %v", ep.Relabelings, want)
	}

	// The PrometheusRule carries the rule file as it is, {{ $labels }} intact.
	pr, ok := objs["PrometheusRule/chimera-chimerad"]
	if !ok {
		t.Fatal("no PrometheusRule with the Prometheus Operator's API versions declared")
	}
	if !strings.Contains(string(pr), "{{ $labels.chimera_cluster }}") || !strings.Contains(string(pr), "alert: ChimeraMDSNotReady") {
		t.Errorf("PrometheusRule lost the rules' templates or alerts:\n%s", pr)
	}
}

func TestChartMonitoringNeedsTheCRDsButTheDashboardDoesNot(t *testing.T) {
	for name, objs := range map[string]map[string][]byte{
		"without the CRDs":       renderChart(t),
		"switched off with CRDs": renderChart(t, append(monitoringAPIs, "--set", "monitoring.serviceMonitor.enabled=false", "--set", "monitoring.prometheusRule.enabled=false")...),
	} {
		for k := range objs {
			if strings.HasPrefix(k, "ServiceMonitor/") || strings.HasPrefix(k, "PrometheusRule/") {
				t.Errorf("%s: renders %s", name, k)
			}
		}
		cm := decode[corev1.ConfigMap](t, objs, "ConfigMap/chimera-grafana-dashboard")
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("%s: dashboard ConfigMap labels %v lack grafana_dashboard=\"1\"", name, cm.Labels)
		}
		var dash struct {
			UID    string            `json:"uid"`
			Panels []json.RawMessage `json:"panels"`
		}
		if err := json.Unmarshal([]byte(cm.Data["chimera.json"]), &dash); err != nil || dash.UID == "" || len(dash.Panels) == 0 {
			t.Errorf("%s: dashboard JSON invalid (%v) or empty (uid %q, %d panels)", name, err, dash.UID, len(dash.Panels))
		}
	}
	off := renderChart(t, "--set", "monitoring.dashboard.enabled=false")
	if _, ok := off["ConfigMap/chimera-grafana-dashboard"]; ok {
		t.Error("monitoring.dashboard.enabled=false still renders the dashboard")
	}
	// Only the ServiceMonitor's CRD: no PrometheusRule (its own CRD is checked).
	only := renderChart(t, "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")
	if _, ok := only["PrometheusRule/chimera-chimerad"]; ok {
		t.Error("PrometheusRule rendered while only ServiceMonitor is served")
	}
	if _, ok := only["ServiceMonitor/chimera-chimerad"]; !ok {
		t.Error("ServiceMonitor missing while its API version is served")
	}
}
