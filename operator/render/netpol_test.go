package render

// Proves the servers' NetworkPolicy admits exactly who the design says and
// nobody else: the policy is evaluated by allows() below, which follows the
// NetworkPolicy semantics (a rule without peers or ports admits all, an
// ipBlock matches by prefix minus except, a podSelector alone means the
// policy's namespace), so a builder that let everything in would fail here.
// Also: the disruption budgets, and that server pods stay off the host
// network (NetworkPolicy does not govern hostNetwork pods).

import (
	"net/netip"
	"strings"
	"testing"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// source is one connecting party: a pod (namespace + labels) or a host IP.
type source struct {
	ns       string
	nsLabels map[string]string
	pod      map[string]string
	ip       string
}

func podIn(ns string, l map[string]string) source {
	return source{ns: ns, nsLabels: map[string]string{LabelNamespaceName: ns}, pod: l}
}

func host(ip string) source { return source{ip: ip} }

// allows reports whether np lets src reach a pod with podLabels (in np's
// namespace) on TCP port.
func allows(t *testing.T, np *networkingv1.NetworkPolicy, podLabels map[string]string, src source, port int32) bool {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(podLabels)) {
		return true // the policy does not isolate this pod
	}
	for _, r := range np.Spec.Ingress {
		if portMatches(r.Ports, port) && peersMatch(t, np.Namespace, r.From, src) {
			return true
		}
	}
	return false
}

func portMatches(ports []networkingv1.NetworkPolicyPort, port int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) && (p.Port == nil || p.Port.IntVal == port) {
			return true
		}
	}
	return false
}

func peersMatch(t *testing.T, policyNS string, peers []networkingv1.NetworkPolicyPeer, src source) bool {
	t.Helper()
	if len(peers) == 0 {
		return true
	}
	match := func(s *metav1.LabelSelector, l map[string]string) bool {
		sel, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return sel.Matches(labels.Set(l))
	}
	for _, p := range peers {
		switch {
		case p.IPBlock != nil:
			if src.ip == "" {
				continue
			}
			ip := netip.MustParseAddr(src.ip)
			if netip.MustParsePrefix(p.IPBlock.CIDR).Contains(ip) && !inAny(p.IPBlock.Except, ip) {
				return true
			}
		case src.ip != "":
			continue // pod peers never match a host address
		case p.NamespaceSelector == nil:
			if src.ns == policyNS && match(p.PodSelector, src.pod) {
				return true
			}
		default:
			if match(p.NamespaceSelector, src.nsLabels) && (p.PodSelector == nil || match(p.PodSelector, src.pod)) {
				return true
			}
		}
	}
	return false
}

func inAny(cidrs []string, ip netip.Addr) bool {
	for _, c := range cidrs {
		if netip.MustParsePrefix(c).Contains(ip) {
			return true
		}
	}
	return false
}

func defaultNetpolOptions() NetworkPolicyOptions {
	return NetworkPolicyOptions{Enabled: true, AdminClientNamespace: "chimera-system"}
}

func TestNetworkPolicyAdmitsExactlyTheDesignedPeers(t *testing.T) {
	c := smallCluster() // namespace "storage", TCP
	np, err := NetworkPolicy(c, defaultNetpolOptions(), []string{"10.0.0.5", "10.0.0.6", "fd00::7"})
	if err != nil {
		t.Fatal(err)
	}
	if np.Name != "small-servers" || np.Namespace != "storage" || np.Labels[LabelCluster] != "small" || np.Labels[LabelManagedBy] != ManagedBy {
		t.Fatalf("metadata %s/%s labels %v", np.Namespace, np.Name, np.Labels)
	}
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		t.Fatalf("policy types %v, want [Ingress] (egress stays open: the MDS calls the DSes)", np.Spec.PolicyTypes)
	}
	mds, ds := Labels(c, ComponentMDS), Labels(c, ComponentDS)
	admin := map[string]string{LabelAdminClient: "true", "app.kubernetes.io/name": "chimera-operator"}
	other := smallCluster()
	other.Name = "other"

	cases := []struct {
		what   string
		to     map[string]string
		src    source
		port   int32
		wanted bool
	}{
		{"operator → MDS admin", mds, podIn("chimera-system", admin), PortAdmin, true},
		{"operator → MDS NFS", mds, podIn("chimera-system", admin), PortNFSDefault, false},
		{"operator → MDS metrics (another namespace)", mds, podIn("chimera-system", admin), PortMetrics, false},
		{"unlabelled pod of the release namespace → admin", mds, podIn("chimera-system", map[string]string{"app": "x"}), PortAdmin, false},
		{"admin-client label in another namespace → admin", mds, podIn("storage", admin), PortAdmin, false},
		{"admin-client label in a third namespace → admin", mds, podIn("evil", admin), PortAdmin, false},
		{"DS pod → MDS admin", mds, podIn("storage", ds), PortAdmin, false},
		{"node → MDS admin", mds, host("10.0.0.5"), PortAdmin, false},
		{"node → MDS NFS", mds, host("10.0.0.5"), PortNFSDefault, true},
		{"node → MDS MOUNT", mds, host("10.0.0.6"), PortMount, true},
		{"IPv6 node → DS NFS", ds, host("fd00::7"), PortNFSDefault, true},
		{"node → DS NFS", ds, host("10.0.0.6"), PortNFSDefault, true},
		{"node → MDS metrics", mds, host("10.0.0.5"), PortMetrics, false},
		{"node → MDS on another port", mds, host("10.0.0.5"), 22, false},
		{"host that is no node → MDS NFS", mds, host("10.0.0.7"), PortNFSDefault, false},
		{"host that is no node → DS NFS", ds, host("192.168.1.1"), PortNFSDefault, false},
		{"MDS pod → DS NFS (I/O through the MDS)", ds, podIn("storage", mds), PortNFSDefault, true},
		{"another cluster's MDS → DS NFS", ds, podIn("storage", Labels(other, ComponentMDS)), PortNFSDefault, false},
		{"app pod of the namespace → DS NFS", ds, podIn("storage", map[string]string{"app": "fio"}), PortNFSDefault, false},
		{"app pod of the namespace → metrics", ds, podIn("storage", map[string]string{"app": "prometheus"}), PortMetrics, true},
		{"pod of another namespace → metrics", ds, podIn("monitoring", map[string]string{"app": "prometheus"}), PortMetrics, false},
	}
	for _, tc := range cases {
		if got := allows(t, np, tc.to, tc.src, tc.port); got != tc.wanted {
			t.Errorf("%s (port %d): allowed=%v, want %v", tc.what, tc.port, got, tc.wanted)
		}
	}
	// The policy isolates both components of this cluster and nothing else.
	sel, _ := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if !sel.Matches(labels.Set(mds)) || !sel.Matches(labels.Set(ds)) || sel.Matches(labels.Set(Labels(other, ComponentDS))) || sel.Empty() {
		t.Errorf("pod selector %v must select this cluster's MDS and DSes only", np.Spec.PodSelector)
	}
}

func TestNetworkPolicyRDMAAndOptions(t *testing.T) {
	c := productionCluster() // rdma on 20049, TCP fallback on 2049
	opts := defaultNetpolOptions()
	opts.NFSClientCIDRs = []string{"100.64.0.0/16", "100.64.3.3/16"} // the second masks to the first
	opts.MetricsNamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{LabelNamespaceName: "monitoring"}}
	opts.MetricsPodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "prometheus"}}
	np, err := NetworkPolicy(c, opts, []string{"10.0.0.5"})
	if err != nil {
		t.Fatal(err)
	}
	ds := Labels(c, ComponentDS)
	prom := map[string]string{"app": "prometheus"}
	for _, tc := range []struct {
		what   string
		src    source
		port   int32
		wanted bool
	}{
		{"node → RDMA port", host("10.0.0.5"), PortRDMADefault, true},
		{"node → TCP fallback", host("10.0.0.5"), PortNFSDefault, true},
		{"extra CIDR → NFS", host("100.64.9.9"), PortNFSDefault, true},
		{"extra CIDR → metrics", host("100.64.9.9"), PortMetrics, false},
		{"outside every CIDR → RDMA port", host("100.65.0.1"), PortRDMADefault, false},
		{"prometheus in monitoring → metrics", podIn("monitoring", prom), PortMetrics, true},
		{"other pod in monitoring → metrics", podIn("monitoring", map[string]string{"app": "grafana"}), PortMetrics, false},
		{"prometheus-labelled pod in the cluster's namespace → metrics", podIn("storage", prom), PortMetrics, false},
		{"pod of the cluster's namespace → metrics (no longer the default)", podIn("storage", map[string]string{"app": "x"}), PortMetrics, false},
	} {
		if got := allows(t, np, ds, tc.src, tc.port); got != tc.wanted {
			t.Errorf("%s (port %d): allowed=%v, want %v", tc.what, tc.port, got, tc.wanted)
		}
	}
	var cidrs []string
	for _, p := range np.Spec.Ingress[0].From {
		if p.IPBlock != nil {
			cidrs = append(cidrs, p.IPBlock.CIDR)
		}
	}
	if strings.Join(cidrs, " ") != "10.0.0.5/32 100.64.0.0/16" {
		t.Errorf("ipBlocks %v, want the node /32 and the masked, deduplicated extra CIDR", cidrs)
	}
}

func TestNetworkPolicyIsStableAndRejectsBadInput(t *testing.T) {
	c := smallCluster()
	a, err := NetworkPolicy(c, defaultNetpolOptions(), []string{"10.0.0.6", "10.0.0.5", "10.0.0.6"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := NetworkPolicy(c, defaultNetpolOptions(), []string{"10.0.0.5", "10.0.0.6"})
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(a, b) {
		t.Error("the same node set in another order (or repeated) must render the same policy")
	}
	bad := []struct {
		opts  NetworkPolicyOptions
		nodes []string
		want  string
	}{
		{NetworkPolicyOptions{Enabled: true}, nil, "--namespace"},
		{NetworkPolicyOptions{Enabled: true, AdminClientNamespace: "x", NFSClientCIDRs: []string{"10.0.0.0/33"}}, nil, `"10.0.0.0/33"`},
		{NetworkPolicyOptions{Enabled: true, AdminClientNamespace: "x", NFSClientCIDRs: []string{"0.0.0.0"}}, nil, `"0.0.0.0"`},
		{defaultNetpolOptions(), []string{"node-1.example"}, `"node-1.example"`},
	}
	for _, tc := range bad {
		if _, err := NetworkPolicy(c, tc.opts, tc.nodes); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("opts %+v nodes %v: error %v, want one naming %s", tc.opts, tc.nodes, err, tc.want)
		}
	}
}

func TestNodeAddressesAreTheNodesIPs(t *testing.T) {
	nodes := []corev1.Node{
		{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "n1"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.5"}, {Type: corev1.NodeInternalDNS, Address: "n1.internal"},
		}}},
		{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "fd00::6"}, {Type: corev1.NodeInternalIP, Address: "not-an-ip"}}}},
	}
	if got := strings.Join(NodeAddresses(nodes), " "); got != "10.0.0.5 203.0.113.5 fd00::6" {
		t.Errorf("node addresses %q", got)
	}
}

func TestBudgetsAndHostNetwork(t *testing.T) {
	for _, mode := range []chimerav1.DataServerMode{chimerav1.DataServerModeStatefulSet, chimerav1.DataServerModeDaemonSet} {
		c := smallCluster()
		c.Spec.DataServers.Mode = mode
		ch, err := Build(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The single MDS is never evicted voluntarily (memfs loses every
		// file with it; a drain waits for a human); DSes go one at a time,
		// and a DS that is not ready does not hold a drain up.
		m, d := ch.MDSBudget.Spec, ch.DSBudget.Spec
		if m.MinAvailable == nil || m.MinAvailable.IntValue() != 1 || m.MaxUnavailable != nil {
			t.Errorf("MDS budget %+v, want minAvailable 1", m)
		}
		if d.MaxUnavailable == nil || d.MaxUnavailable.IntValue() != 1 || d.MinAvailable != nil {
			t.Errorf("DS budget %+v, want maxUnavailable 1", d)
		}
		if d.UnhealthyPodEvictionPolicy == nil || *d.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow {
			t.Error("DS budget must let a not-ready DS be evicted")
		}
		for comp, pdb := range map[string]*policyv1.PodDisruptionBudget{ComponentMDS: ch.MDSBudget, ComponentDS: ch.DSBudget} {
			if !equality.Semantic.DeepEqual(pdb.Spec.Selector.MatchLabels, SelectorLabels(c, comp)) {
				t.Errorf("%s budget selects %v", comp, pdb.Spec.Selector.MatchLabels)
			}
		}
		pods := []corev1.PodTemplateSpec{ch.MDS.Spec.Template}
		if ch.DSDaemonSet != nil {
			pods = append(pods, ch.DSDaemonSet.Spec.Template)
		} else {
			pods = append(pods, ch.DSStatefulSet.Spec.Template)
		}
		for _, p := range pods {
			if p.Spec.HostNetwork {
				t.Errorf("%s pod on the host network: NetworkPolicy would not apply to it", p.Labels[LabelComponent])
			}
			sc := p.Spec.Containers[0].SecurityContext
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s security context loosened: %+v", p.Labels[LabelComponent], sc)
			}
		}
	}
}
