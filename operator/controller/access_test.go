package controller_test

// Proves, against a real apiserver and the MDS admin API (a real chimerad
// when $CHIMERAD is set): the export client list of a cluster's MDS follows
// the Kubernetes Nodes — a node that joins is admitted (its InternalIP and
// ExternalIP, not its host name), a node whose address changes is admitted
// at the new address only, a node that leaves is no longer admitted, a
// node's pod range is admitted once allocated — and
// spec.access and spec.network.podNetworkCIDRs widen it, user rules first.
// The rules reach the running MDS through PUT /api/v1/access/data and the
// ConfigMap (for the next start), while the pods' config hash stays the
// same: node churn restarts no server. Each change is told once as an
// ExportClientsUpdated event, not once per reconcile.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/render"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

type accessDoc struct {
	Mount  string `json:"mount"`
	Access *[]struct {
		Clients    []string `json:"clients"`
		AccessType string   `json:"access_type"`
		Squash     string   `json:"squash"`
	} `json:"access"`
}

// summary renders rules as "type/squash:client,client; ..." and drops the
// clients of nodes this test did not make (other tests' nodes may exist).
func (d accessDoc) summary(keep func(string) bool) string {
	if d.Access == nil {
		return "(open to all)"
	}
	var out []string
	for _, r := range *d.Access {
		var cl []string
		for _, c := range r.Clients {
			if keep(c) {
				cl = append(cl, c)
			}
		}
		if len(cl) > 0 {
			out = append(out, r.AccessType+"/"+r.Squash+":"+strings.Join(cl, ","))
		}
	}
	return strings.Join(out, "; ")
}

func TestExportClientsFollowNodes(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "clients")
	c := validCluster(ns, "clients")
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{}
	eventually(t, "admin Secret", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "clients-admin-token"}, sec)
	})
	token := string(sec.Data["token"])
	url := startChimerad(t, c, token)
	read := func() (accessDoc, error) {
		req, _ := http.NewRequest(http.MethodGet, url+"/api/v1/access/data", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := adminTestClient(c).Do(req)
		if err != nil {
			return accessDoc{}, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return accessDoc{}, fmt.Errorf("GET access: HTTP %d", resp.StatusCode)
		}
		var d accessDoc
		err = json.NewDecoder(resp.Body).Decode(&d)
		return d, err
	}
	if url == "" {
		t.Log("CHIMERAD not set: using a fake admin endpoint")
		var last func() string
		url, _, last = fakeMDS(t, c, token)
		read = func() (accessDoc, error) {
			var d accessDoc
			err := json.Unmarshal([]byte(last()), &d)
			return d, err
		}
	}
	adminURL.url.Store(url)
	if d, err := read(); err != nil || d.Access != nil {
		t.Fatalf("the MDS must start open (no rules) for this test to mean anything: %+v %v", d, err)
	}
	makePod(t, c, "clients-mds-0", render.ComponentMDS, "10.0.3.10", "", true)

	ours := func(a string) bool {
		return strings.HasPrefix(a, "10.78.") || strings.HasPrefix(a, "fd78:") || strings.Contains(a, "/")
	}
	hash := func() string {
		sts := &appsv1.StatefulSet{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "clients-mds"}, sts); err != nil {
			return "error: " + err.Error()
		}
		return sts.Spec.Template.Annotations[render.AnnotationConfigHash]
	}
	expect := func(what, want string) {
		t.Helper()
		eventually(t, what, func() error {
			d, err := read()
			if err != nil {
				return err
			}
			if got := d.summary(ours); got != want {
				return fmt.Errorf("MDS rules %q, want %q", got, want)
			}
			// The ConfigMap carries the same rules for the MDS's next start.
			cm := &corev1.ConfigMap{}
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "clients-config"}, cm); err != nil {
				return err
			}
			var cfg struct {
				Exports map[string]accessDoc `json:"exports"`
			}
			if err := json.Unmarshal([]byte(cm.Data[render.ConfigKeyMDS]), &cfg); err != nil {
				return err
			}
			if got := cfg.Exports[render.ExportPath].summary(ours); got != want {
				return fmt.Errorf("ConfigMap rules %q, want %q", got, want)
			}
			return nil
		})
	}
	expect("rules pushed without test nodes", "")
	hash0 := hash()

	n1 := makeNode(t, "clients-node-1", "10.78.0.1")
	expect("a node joins", "rw/no_root_squash:10.78.0.1")
	n2 := makeNode(t, "clients-node-2")
	n2.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.78.0.2"},
		{Type: corev1.NodeExternalIP, Address: "fd78::2"},
		{Type: corev1.NodeHostName, Address: "clients-node-2"},
	}
	if err := k8s.Status().Update(ctx, n2); err != nil {
		t.Fatal(err)
	}
	expect("a second node joins with two addresses", "rw/no_root_squash:10.78.0.1,10.78.0.2,fd78::2")

	n1.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.78.0.11"}}
	if err := k8s.Status().Update(ctx, n1); err != nil {
		t.Fatal(err)
	}
	expect("a node changes address", "rw/no_root_squash:10.78.0.11,10.78.0.2,fd78::2")

	if err := k8s.Delete(ctx, n2); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	expect("a node leaves", "rw/no_root_squash:10.78.0.11")
	// Each change of the rules was told once as an event on the cluster.
	eventually(t, "ExportClientsUpdated events", func() error {
		evs := &corev1.EventList{}
		if err := k8s.List(ctx, evs, client.InNamespace(ns)); err != nil {
			return err
		}
		n := 0
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "clients" && e.Reason == "ExportClientsUpdated" {
				n += int(max(e.Count, 1))
			}
		}
		// first push, node 1 joins, node 2 joins (its status may land in one
		// or two updates), node 1 moves, node 2 leaves: 5 changes or more,
		// but never one per reconcile (the resync pushes the same rules).
		if n < 5 || n > 8 {
			return fmt.Errorf("%d ExportClientsUpdated events, want 5..8", n)
		}
		return nil
	})

	// A node's pod range, once allocated, is admitted: a kernel client on
	// the node reaches pods through the CNI from the node's address in it.
	n1.Spec.PodCIDR, n1.Spec.PodCIDRs = "10.78.32.0/24", []string{"10.78.32.0/24"}
	if err := k8s.Update(ctx, n1); err != nil {
		t.Fatal(err)
	}
	expect("a node's pod range is allocated", "rw/no_root_squash:10.78.0.11,10.78.32.0/24")
	if h := hash(); h != hash0 || h == "" {
		t.Fatalf("node churn changed the MDS config hash %q → %q: the servers would restart", hash0, h)
	}

	// spec.access widens (first, so it decides for the clients it names);
	// the pod network comes last.
	cur := &chimerav1.ChimeraCluster{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"10.78.0.11", "10.78.128.0/17"}, Access: chimerav1.AccessRO}}
	cur.Spec.Network.PodNetworkCIDRs = []string{"10.78.64.0/18"}
	if err := k8s.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	expect("spec.access and the pod network", "ro/root_squash:10.78.0.11,10.78.128.0/17; rw/no_root_squash:10.78.0.11,10.78.32.0/24; rw/no_root_squash:10.78.64.0/18")
	if h := hash(); h != hash0 {
		t.Fatalf("an access change restarted the servers (config hash %q → %q)", hash0, h)
	}

	// A rule chimerad would refuse never gets that far: the webhook names it.
	cur = &chimerav1.ChimeraCluster{}
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(c), cur)
	cur.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"nodes.example.com"}}}
	if err := k8s.Update(ctx, cur); err == nil || !strings.Contains(err.Error(), "spec.access[0].clients[0]") {
		t.Fatalf("a host-name client was not refused naming the field: %v", err)
	}
}
