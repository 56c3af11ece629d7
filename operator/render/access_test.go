package render

// Proves the MDS export's client rules: the user's spec.access first, then
// the nodes' addresses and pod ranges (sorted, deduplicated, IPv4-mapped
// unmapped, split at chimerad's clients-per-rule bound), then the pod
// network; bad node clients and too many rules are errors; the rules land in the MDS config
// only (data servers have no rules) and never in the config hash, so node
// churn does not restart the servers. With $CHIMERAD, chimerad accepts the
// rendered rules.

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
)

func TestExportAccess(t *testing.T) {
	c := smallCluster()
	uid := int64(1000)
	c.Spec.Access = []chimerav1.AccessRule{
		{Clients: []string{"10.9.0.7"}, Access: chimerav1.AccessNone},
		{Clients: []string{"192.168.0.0/16", "FD00::/8"}, Access: chimerav1.AccessRO, Squash: chimerav1.SquashAll, AnonUID: &uid},
		{Clients: []string{"*"}}, // access and squash left to their defaults
	}
	c.Spec.Network.PodNetworkCIDRs = []string{"10.244.0.0/16"}
	rules, err := ExportAccess(c, []string{"10.0.0.2", "10.0.0.1", "::ffff:10.0.0.2", "fd00::5", "10.244.1.0/24", "10.244.1.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rules)
	want := `[{"clients":["10.9.0.7"],"access_type":"none","squash":"root_squash"},` +
		`{"clients":["192.168.0.0/16","fd00::/8"],"access_type":"ro","squash":"all_squash","anonymous_uid":1000},` +
		`{"clients":["*"],"access_type":"rw","squash":"root_squash"},` +
		`{"clients":["10.0.0.1","10.0.0.2","10.244.1.0/24","fd00::5"],"access_type":"rw","squash":"no_root_squash"},` +
		`{"clients":["10.244.0.0/16"],"access_type":"rw","squash":"no_root_squash"}]`
	if string(b) != want {
		t.Fatalf("rules\n got %s\nwant %s", b, want)
	}

	// No node, nothing else: an empty list (nobody), not nil (open to all).
	none, err := ExportAccess(smallCluster(), nil)
	if err != nil || none == nil || len(none) != 0 {
		t.Fatalf("no nodes: %v %v", none, err)
	}

	// Many nodes: rules of at most 256 clients.
	var many []string
	for i := range 600 {
		many = append(many, fmt.Sprintf("10.1.%d.%d", i/250, i%250))
	}
	rules, err = ExportAccess(smallCluster(), many)
	if err != nil || len(rules) != 3 || len(rules[0].Clients) != 256 || len(rules[2].Clients) != 600-512 {
		t.Fatalf("600 nodes: %d rules, err %v", len(rules), err)
	}
	// Beyond chimerad's 256 rules: an error, not a config chimerad refuses.
	var huge []string
	for i := range 256*256 + 1 {
		huge = append(huge, fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255))
	}
	if _, err := ExportAccess(smallCluster(), huge); err == nil || !strings.Contains(err.Error(), "256") {
		t.Errorf("65537 node addresses: %v", err)
	}
	for _, bad := range []string{"node-1", "10.0.0.300", "", "*", "10.244.1.1/24"} {
		if _, err := ExportAccess(smallCluster(), []string{bad}); err == nil {
			t.Errorf("node address %q accepted", bad)
		}
	}
	c = smallCluster()
	c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"10.0.0.1/8"}}}
	if _, err := ExportAccess(c, nil); err == nil || !strings.Contains(err.Error(), "spec.access[0].clients[0]") {
		t.Errorf("a rule with host bits (webhook bypassed): %v", err)
	}
}

// NodeClients: the nodes' InternalIP/ExternalIP and pod ranges, nothing else.
func TestNodeClients(t *testing.T) {
	nodes := []corev1.Node{
		{Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd44:0:0:1::/64"}}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "172.18.0.2"}, {Type: corev1.NodeHostName, Address: "kind-worker"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.7"}, {Type: corev1.NodeInternalDNS, Address: "10.1.1.1"},
		}}},
		{Spec: corev1.NodeSpec{PodCIDRs: []string{"not-a-cidr"}}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.18.0.3"}}}},
	}
	got := strings.Join(NodeClients(nodes), " ")
	if got != "172.18.0.2 203.0.113.7 172.18.0.3 10.244.1.0/24 fd44:0:0:1::/64" {
		t.Fatalf("node clients %q", got)
	}
}

func TestAccessInConfigButNotInHash(t *testing.T) {
	c := smallCluster()
	one, _ := ExportAccess(c, []string{"10.0.0.1"})
	two, _ := ExportAccess(c, []string{"10.0.0.1", "10.0.0.2"})
	a, err := Build(c, one)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Build(c, two)
	if !strings.Contains(b.ConfigMap.Data[ConfigKeyMDS], `"10.0.0.2"`) || strings.Contains(a.ConfigMap.Data[ConfigKeyMDS], `"10.0.0.2"`) {
		t.Fatalf("MDS config does not carry the rules:\n%s", b.ConfigMap.Data[ConfigKeyMDS])
	}
	if strings.Contains(b.ConfigMap.Data[ConfigKeyDS], "access") {
		t.Errorf("data servers have no export rules:\n%s", b.ConfigMap.Data[ConfigKeyDS])
	}
	for _, pair := range [][2]string{
		{a.MDS.Spec.Template.Annotations[AnnotationConfigHash], b.MDS.Spec.Template.Annotations[AnnotationConfigHash]},
		{a.DSStatefulSet.Spec.Template.Annotations[AnnotationConfigHash], b.DSStatefulSet.Spec.Template.Annotations[AnnotationConfigHash]},
	} {
		if pair[0] == "" || pair[0] != pair[1] {
			t.Errorf("a node joining changed the config hash (%q → %q): the servers would restart", pair[0], pair[1])
		}
	}
	// The hash still follows what does need a restart.
	c2 := smallCluster()
	c2.Spec.Storage.MemfsCapacityBytes = 512 << 20
	d, _ := Build(c2, one)
	if d.MDS.Spec.Template.Annotations[AnnotationConfigHash] == a.MDS.Spec.Template.Annotations[AnnotationConfigHash] {
		t.Error("a capacity change must change the hash")
	}
	var doc struct {
		Exports map[string]struct {
			Access *[]AccessRule `json:"access"`
		} `json:"exports"`
	}
	none, _ := Build(c, []AccessRule{})
	_ = json.Unmarshal([]byte(none.ConfigMap.Data[ConfigKeyMDS]), &doc)
	if r := doc.Exports[ExportPath].Access; r == nil || len(*r) != 0 {
		t.Errorf("an empty rule list must render as [] (nobody), not be left out (everybody): %s", none.ConfigMap.Data[ConfigKeyMDS])
	}
	if os.Getenv("CHIMERAD") != "" {
		checkConfig(t, t.TempDir(), "mds-access", []byte(b.ConfigMap.Data[ConfigKeyMDS]))
		checkConfig(t, t.TempDir(), "mds-nobody", []byte(none.ConfigMap.Data[ConfigKeyMDS]))
	}
}
