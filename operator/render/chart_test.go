package render

// Proves the chart and the operator agree on who is an admin client and what
// the chart's own NetworkPolicies admit: the chart is rendered by the real
// helm ($HELM, else the cache's; required when $CHIMERA_REQUIRE_ENVTEST is
// set, as make test-operator does), the operator's and the CSI controller's
// pods must carry LabelAdminClient (else the operator's policies would lock
// them out of every admin API), and the chart's policies are evaluated with
// allows() for the webhook, metrics and an arbitrary port.

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

func helmBinary(t *testing.T) string {
	t.Helper()
	h := os.Getenv("HELM")
	if h == "" {
		cache := os.Getenv("CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "chimera-test")
		}
		h = filepath.Join(cache, "bin", "helm")
	}
	if _, err := os.Stat(h); err != nil {
		if os.Getenv("CHIMERA_REQUIRE_ENVTEST") != "" {
			t.Fatalf("helm not found at %s (make setup-operator installs it)", h)
		}
		t.Skipf("helm not found at %s", h)
	}
	return h
}

// renderChart returns the chart's objects by kind/name.
func renderChart(t *testing.T, args ...string) map[string][]byte {
	t.Helper()
	cmd := exec.Command(helmBinary(t), append([]string{"template", "chimera", filepath.Join("..", "..", "charts", "chimera"), "--namespace", "chimera-system"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	objs := map[string][]byte{}
	for _, doc := range strings.Split(string(out), "\n---") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if meta.Kind != "" {
			objs[meta.Kind+"/"+meta.Metadata.Name] = []byte(doc)
		}
	}
	return objs
}

func decode[T any](t *testing.T, objs map[string][]byte, key string) *T {
	t.Helper()
	doc, ok := objs[key]
	if !ok {
		t.Fatalf("chart renders no %s", key)
	}
	v := new(T)
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return v
}

func TestChartAdminClientsAndPolicies(t *testing.T) {
	objs := renderChart(t)
	op := decode[appsv1.Deployment](t, objs, "Deployment/chimera-operator")
	csi := decode[appsv1.Deployment](t, objs, "Deployment/chimera-csi-controller")
	for _, d := range []*appsv1.Deployment{op, csi} {
		if d.Spec.Template.Labels[LabelAdminClient] != "true" {
			t.Errorf("%s pods lack %s=true: the clusters' policies would refuse their admin calls", d.Name, LabelAdminClient)
		}
		if d.Spec.Selector.MatchLabels[LabelAdminClient] != "" {
			t.Errorf("%s: the admin-client label must not be in the (immutable) selector", d.Name)
		}
	}
	if args := strings.Join(op.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--network-policy=true") {
		t.Errorf("operator args %q lack --network-policy=true", args)
	}
	// The operator's own admin-client peer must match the chart's pods.
	np, err := NetworkPolicy(smallCluster(), NetworkPolicyOptions{Enabled: true, AdminClientNamespace: "chimera-system"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []*appsv1.Deployment{op, csi} {
		if !allows(t, np, Labels(smallCluster(), ComponentMDS), podIn("chimera-system", d.Spec.Template.Labels), PortAdmin) {
			t.Errorf("%s pods are refused by a cluster's admin rule", d.Name)
		}
	}

	opNP := decode[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy/chimera-operator")
	csiNP := decode[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy/chimera-csi-controller")
	opPod, csiPod := op.Spec.Template.Labels, csi.Spec.Template.Labels
	for _, tc := range []struct {
		what   string
		np     *networkingv1.NetworkPolicy
		to     map[string]string
		src    source
		port   int32
		wanted bool
	}{
		{"apiserver (a host) → operator webhook", opNP, opPod, host("192.0.2.1"), 9443, true},
		{"host → operator metrics", opNP, opPod, host("192.0.2.1"), 8443, false},
		{"pod of the release namespace → operator metrics", opNP, opPod, podIn("chimera-system", map[string]string{"app": "prom"}), 8443, true},
		{"pod of another namespace → operator metrics", opNP, opPod, podIn("monitoring", map[string]string{"app": "prom"}), 8443, false},
		{"pod → operator health port", opNP, opPod, podIn("chimera-system", map[string]string{"app": "x"}), 8081, false},
		{"pod → CSI controller health port", csiNP, csiPod, podIn("chimera-system", map[string]string{"app": "x"}), 9808, false},
		{"host → CSI controller", csiNP, csiPod, host("192.0.2.1"), 9808, false},
	} {
		if got := allows(t, tc.np, tc.to, tc.src, tc.port); got != tc.wanted {
			t.Errorf("%s (port %d): allowed=%v, want %v", tc.what, tc.port, got, tc.wanted)
		}
	}

	// Switched off: no policy from the chart, none from the operator.
	off := renderChart(t, "--set", "networkPolicy.enabled=false")
	for k := range off {
		if strings.HasPrefix(k, "NetworkPolicy/") {
			t.Errorf("networkPolicy.enabled=false still renders %s", k)
		}
	}
	op = decode[appsv1.Deployment](t, off, "Deployment/chimera-operator")
	if args := strings.Join(op.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--network-policy=false") {
		t.Errorf("operator args %q lack --network-policy=false", args)
	}
}

// TestChartAdminCA: the chart and the operator agree on the admin API's CA.
// The chart creates the (empty) CA Secret and bundle ConfigMap the operator
// is told to fill (--admin-ca), and the CSI controller mounts that ConfigMap
// where its --admin-ca-file points, so it verifies every MDS the operator
// issued a certificate for; --admin-tls-server-name appears only when set.
func TestChartAdminCA(t *testing.T) {
	objs := renderChart(t)
	op := decode[appsv1.Deployment](t, objs, "Deployment/chimera-operator")
	csi := decode[appsv1.Deployment](t, objs, "Deployment/chimera-csi-controller")
	var caName string
	for _, a := range op.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--admin-ca="); ok {
			caName = v
		}
	}
	if caName == "" {
		t.Fatalf("operator args %v lack --admin-ca", op.Spec.Template.Spec.Containers[0].Args)
	}
	sec := decode[corev1.Secret](t, objs, "Secret/"+caName)
	cm := decode[corev1.ConfigMap](t, objs, "ConfigMap/"+caName)
	if len(sec.Data)+len(sec.StringData) != 0 || len(cm.Data) != 0 || sec.Namespace != "chimera-system" || cm.Namespace != "chimera-system" {
		t.Errorf("the chart must create the CA objects empty in the release namespace (upgrades keep what the operator wrote): %+v %+v", sec, cm)
	}
	c := csi.Spec.Template.Spec.Containers[0]
	var caFile string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--admin-ca-file="); ok {
			caFile = v
		}
		if strings.HasPrefix(a, "--admin-tls-server-name") {
			t.Errorf("CSI args carry %s without adminTLSServerName set", a)
		}
	}
	var vol string
	for _, m := range c.VolumeMounts {
		if caFile != "" && filepath.Dir(caFile) == m.MountPath {
			vol = m.Name
		}
	}
	mounted := false
	for _, v := range csi.Spec.Template.Spec.Volumes {
		if v.Name == vol && v.ConfigMap != nil && v.ConfigMap.Name == caName {
			mounted = filepath.Base(caFile) == "ca.crt"
		}
	}
	if !mounted {
		t.Errorf("CSI controller: --admin-ca-file=%q must be ca.crt of ConfigMap %s, mounted (volume %q)", caFile, caName, vol)
	}
	set := renderChart(t, "--set", "csi.adminTLSServerName=chimera-mds.storage.svc")
	csi = decode[appsv1.Deployment](t, set, "Deployment/chimera-csi-controller")
	if args := strings.Join(csi.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--admin-tls-server-name=chimera-mds.storage.svc") {
		t.Errorf("csi.adminTLSServerName does not reach the CSI controller: %s", args)
	}
}

// The chimera-fuse sidecar injector (operator/webhook/sidecar.go): the chart
// renders a MutatingWebhookConfiguration for pod CREATEs that fails open
// (Ignore), selects no namespaces or objects (an objectSelector cannot see
// annotations) but has the API server call it only for pods annotated
// chimera.io/fuse-sidecar: "true" (matchConditions), at the handler's path;
// the operator gets the dataplane image and the configuration's name (whose
// caBundle it patches, hence the RBAC rule). Disabled: none of it.
func TestChartFuseSidecarInjector(t *testing.T) {
	objs := renderChart(t)
	mwc := decode[admissionregistrationv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration/chimera-fuse-sidecar-injector")
	if len(mwc.Webhooks) != 1 {
		t.Fatalf("%d webhooks", len(mwc.Webhooks))
	}
	w := mwc.Webhooks[0]
	if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Ignore {
		t.Errorf("failurePolicy %v, want Ignore", w.FailurePolicy)
	}
	if w.ObjectSelector != nil || w.NamespaceSelector != nil {
		t.Errorf("selectors %v %v: want none", w.ObjectSelector, w.NamespaceSelector)
	}
	if w.ClientConfig.Service == nil || w.ClientConfig.Service.Path == nil || *w.ClientConfig.Service.Path != "/mutate-v1-pod-chimera-fuse" {
		t.Errorf("clientConfig %+v", w.ClientConfig)
	}
	if len(w.Rules) != 1 || !reflect.DeepEqual(w.Rules[0].Resources, []string{"pods"}) ||
		!reflect.DeepEqual(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) {
		t.Errorf("rules %+v: want pod CREATE", w.Rules)
	}
	if len(w.MatchConditions) != 1 || !strings.Contains(w.MatchConditions[0].Expression, "'chimera.io/fuse-sidecar'] == 'true'") {
		t.Errorf("matchConditions %+v: want the annotation's test", w.MatchConditions)
	}
	op := decode[appsv1.Deployment](t, objs, "Deployment/chimera-operator")
	args := strings.Join(op.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--fuse-sidecar-image=chimera/chimerad:", "--mutating-webhook-config-name=chimera-fuse-sidecar-injector"} {
		if !strings.Contains(args, want) {
			t.Errorf("operator args %q lack %s", args, want)
		}
	}
	if !strings.Contains(string(objs["ClusterRole/chimera-operator"]), "mutatingwebhookconfigurations") {
		t.Error("the operator's ClusterRole cannot patch the injector's caBundle")
	}

	off := renderChart(t, "--set", "fuseSidecar.enabled=false")
	if _, ok := off["MutatingWebhookConfiguration/chimera-fuse-sidecar-injector"]; ok {
		t.Error("fuseSidecar.enabled=false still renders the injector")
	}
	op = decode[appsv1.Deployment](t, off, "Deployment/chimera-operator")
	if args := strings.Join(op.Spec.Template.Spec.Containers[0].Args, " "); strings.Contains(args, "--fuse-sidecar-image") {
		t.Errorf("fuseSidecar.enabled=false: operator args %q", args)
	}
}
