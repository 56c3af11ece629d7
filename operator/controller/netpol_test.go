package controller_test

// Proves, against a real apiserver: a cluster's NetworkPolicy is controlled
// by the cluster, isolates its server pods for ingress, admits the admin API
// only from admin-client pods of the release namespace, and its NFS rule
// follows the Nodes' addresses as nodes join, change address and leave.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/chimera-k8s/chimera/operator/controller"
	"github.com/chimera-k8s/chimera/operator/render"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// nfsBlocks returns the ipBlock CIDRs of the policy's NFS rule (the one
// naming port 2049), "" while the policy does not exist.
func nfsBlocks(ns, name string) (string, error) {
	np := &networkingv1.NetworkPolicy{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, np); err != nil {
		return "", err
	}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 || r.Ports[0].Port == nil || r.Ports[0].Port.IntVal != render.PortNFSDefault {
			continue
		}
		var cidrs []string
		for _, p := range r.From {
			if p.IPBlock != nil {
				cidrs = append(cidrs, p.IPBlock.CIDR)
			}
		}
		slices.Sort(cidrs)
		return strings.Join(cidrs, " "), nil
	}
	return "", fmt.Errorf("no NFS rule in %v", np.Spec.Ingress)
}

func makeNode(t *testing.T, name string, ips ...string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8s.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), n) })
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	if err := k8s.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestNetworkPolicyFollowsNodes(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "fence")
	c := validCluster(ns, "fence")
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	// Other tests' nodes may exist: compare against the nodes this test adds.
	base := func() []string {
		nodes := &corev1.NodeList{}
		if err := k8s.List(ctx, nodes); err != nil {
			t.Fatal(err)
		}
		others := slices.DeleteFunc(nodes.Items, func(n corev1.Node) bool { return strings.HasPrefix(n.Name, "fence-node-") })
		var out []string
		for _, a := range render.NodeAddresses(others) {
			out = append(out, a+"/32")
		}
		return out
	}
	expect := func(what string, extra ...string) {
		t.Helper()
		eventually(t, what, func() error {
			want := append(base(), extra...)
			slices.Sort(want)
			got, err := nfsBlocks(ns, "fence-servers")
			if err != nil {
				return err
			}
			if got != strings.Join(want, " ") {
				return fmt.Errorf("NFS ipBlocks %q, want %q", got, strings.Join(want, " "))
			}
			return nil
		})
	}
	expect("policy without test nodes")

	np := &networkingv1.NetworkPolicy{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "fence-servers"}, np); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(np); ref == nil || ref.Kind != "ChimeraCluster" || ref.Name != "fence" {
		t.Fatalf("policy controller ref %+v", ref)
	}
	if np.Spec.PodSelector.MatchLabels[render.LabelInstance] != "fence" || len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		t.Fatalf("policy spec %+v", np.Spec)
	}
	admin := np.Spec.Ingress[1]
	if len(admin.Ports) != 1 || admin.Ports[0].Port.IntVal != render.PortAdmin || len(admin.From) != 1 ||
		admin.From[0].NamespaceSelector.MatchLabels[render.LabelNamespaceName] != adminClientNS ||
		admin.From[0].PodSelector.MatchLabels[render.LabelAdminClient] != "true" {
		t.Fatalf("admin rule %+v", admin)
	}

	n1 := makeNode(t, "fence-node-1", "10.77.0.1")
	expect("a node joins", "10.77.0.1/32")
	n2 := makeNode(t, "fence-node-2", "10.77.0.2")
	expect("a second node joins", "10.77.0.1/32", "10.77.0.2/32")

	n1.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.77.0.11"}}
	if err := k8s.Status().Update(ctx, n1); err != nil {
		t.Fatal(err)
	}
	expect("a node changes address", "10.77.0.11/32", "10.77.0.2/32")

	if err := k8s.Delete(ctx, n2); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	expect("a node leaves", "10.77.0.11/32")
}

// The Node cache keeps only what the policy and the export rules need
// (identity, addresses, pod ranges).
func TestNodeCacheKeepsOnlyAddresses(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1", ResourceVersion: "7", Labels: map[string]string{"big": "label"}, Annotations: map[string]string{"a": "b"}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24", "fd44::/64"}, ProviderID: "cloud://n1"},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.5"}},
			Images:    []corev1.ContainerImage{{Names: []string{"registry/image:tag"}, SizeBytes: 1 << 30}},
		},
	}
	out, err := controller.NodeAddressesOnly(n)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Node)
	if got.Name != "n1" || got.UID != "u1" || got.ResourceVersion != "7" || len(got.Status.Addresses) != 1 || got.Status.Addresses[0].Address != "10.0.0.5" {
		t.Fatalf("identity or addresses lost: %+v", got)
	}
	if got.Spec.PodCIDR != "10.244.0.0/24" || strings.Join(got.Spec.PodCIDRs, " ") != "10.244.0.0/24 fd44::/64" {
		t.Fatalf("pod ranges lost (the export rules admit them): %+v", got.Spec)
	}
	if len(got.Status.Images) != 0 || got.Labels != nil || got.Annotations != nil || got.Spec.ProviderID != "" {
		t.Fatalf("kept more than addresses: %+v", got)
	}
	pod := &corev1.Pod{}
	if o, _ := controller.NodeAddressesOnly(pod); o != any(pod) {
		t.Fatal("other kinds must pass through unchanged")
	}
}
