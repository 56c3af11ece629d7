package render

import (
	"fmt"
	"net/netip"
	"sort"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const (
	// LabelAdminClient marks the pods that may call a cluster's admin API
	// (the chart puts it on the operator's and the CSI controller's pods).
	LabelAdminClient = "storage.chimera.io/admin-client"
	// LabelNamespaceName is the label the apiserver sets on every namespace.
	LabelNamespaceName = "kubernetes.io/metadata.name"
)

// NetworkPolicyOptions say who may reach a cluster's servers besides the
// cluster's own pods. They come from the operator's flags (the chart's
// networkPolicy values), not from the ChimeraCluster.
type NetworkPolicyOptions struct {
	Enabled bool
	// AdminClientNamespace is where the admin clients run (the release
	// namespace); their pods carry LabelAdminClient=true.
	AdminClientNamespace string
	// NFSClientCIDRs are allowed on the NFS ports besides the nodes'
	// addresses (e.g. a CNI's tunnel addresses, sidecar-mode clients).
	NFSClientCIDRs []string
	// Metrics{Namespace,Pod}Selector pick the scrapers; both nil: every pod
	// of the cluster's own namespace.
	MetricsNamespaceSelector *metav1.LabelSelector
	MetricsPodSelector       *metav1.LabelSelector
}

// NetworkPolicyName names the policy of one cluster's server pods.
func NetworkPolicyName(c *chimerav1.ChimeraCluster) string { return c.Name + "-servers" }

// NetworkPolicy isolates the MDS and DS pods of c for ingress and admits:
//   - the NFS ports (nfs, mount, nfs-rdma) from the nodes' addresses (the
//     kernel client mounts from the host network), NFSClientCIDRs and the
//     cluster's own pods (the MDS reaches the DSes over NFSv3);
//   - the admin API only from admin-client pods of AdminClientNamespace;
//   - metrics from the configured scrapers (default: c's namespace).
//
// It governs the pod network only: a Multus storage attachment is not seen
// by NetworkPolicy (see operator/README.md). nodeAddrs are IPs; invalid ones
// and bad CIDRs are errors naming them.
func NetworkPolicy(c *chimerav1.ChimeraCluster, opts NetworkPolicyOptions, nodeAddrs []string) (*networkingv1.NetworkPolicy, error) {
	if opts.AdminClientNamespace == "" {
		return nil, fmt.Errorf("network policy: the admin clients' namespace is unknown (operator flag --namespace)")
	}
	blocks, err := ipBlocks(nodeAddrs, opts.NFSClientCIDRs)
	if err != nil {
		return nil, err
	}
	tcp := corev1.ProtocolTCP
	port := func(p int32) networkingv1.NetworkPolicyPort {
		v := intstr.FromInt32(p)
		return networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &v}
	}
	nfsPorts := []networkingv1.NetworkPolicyPort{port(TCPPort(c)), port(PortMount)}
	if Transport(c) == chimerav1.TransportRDMA {
		nfsPorts = append(nfsPorts, port(ClientPort(c)))
	}
	nfsFrom := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: clusterPodLabels(c)}}}
	for i := range blocks {
		nfsFrom = append(nfsFrom, networkingv1.NetworkPolicyPeer{IPBlock: &blocks[i]})
	}
	adminFrom := []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelNamespaceName: opts.AdminClientNamespace}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{LabelAdminClient: "true"}},
	}}
	metricsFrom := networkingv1.NetworkPolicyPeer{NamespaceSelector: opts.MetricsNamespaceSelector, PodSelector: opts.MetricsPodSelector}
	if metricsFrom.NamespaceSelector == nil && metricsFrom.PodSelector == nil {
		metricsFrom.PodSelector = &metav1.LabelSelector{} // every pod of c's namespace
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: objectMeta(c, NetworkPolicyName(c), ""),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: clusterPodLabels(c)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{Ports: nfsPorts, From: nfsFrom},
				{Ports: []networkingv1.NetworkPolicyPort{port(PortAdmin)}, From: adminFrom},
				{Ports: []networkingv1.NetworkPolicyPort{port(PortMetrics)}, From: []networkingv1.NetworkPolicyPeer{metricsFrom}},
			},
		},
	}, nil
}

// clusterPodLabels select every server pod (MDS and DSes) of c.
func clusterPodLabels(c *chimerav1.ChimeraCluster) map[string]string {
	return map[string]string{LabelName: "chimera", LabelInstance: c.Name}
}

// ipBlocks turns node IPs into host blocks (/32, /128) and checks the extra
// CIDRs; the result is sorted and deduplicated so the policy only changes
// when the set does.
func ipBlocks(addrs, cidrs []string) ([]networkingv1.IPBlock, error) {
	seen := map[string]bool{}
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, fmt.Errorf("network policy: node address %q: %w", a, err)
		}
		seen[netip.PrefixFrom(ip, ip.BitLen()).String()] = true
	}
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("network policy: NFS client CIDR %q: %w", s, err)
		}
		seen[p.Masked().String()] = true
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]networkingv1.IPBlock, len(keys))
	for i, k := range keys {
		out[i] = networkingv1.IPBlock{CIDR: k}
	}
	return out, nil
}

// NodeAddresses returns the InternalIP and ExternalIP addresses of nodes:
// the sources a kernel NFS client on the host network connects from.
func NodeAddresses(nodes []corev1.Node) []string {
	var out []string
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if _, err := netip.ParseAddr(a.Address); err == nil { // a hostname-like value is no source address
				out = append(out, a.Address)
			}
		}
	}
	return out
}
