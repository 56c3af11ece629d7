package controller_test

// Proves, against a real apiserver: invalid specs are rejected at admission
// with a message naming the field (CRD schema, CEL and webhook rules); a
// cluster gets exactly its children, owned by it, and reconciling again
// changes nothing; DS storage addresses from the Multus network-status
// annotation reach the MDS admin API (a real chimerad when $CHIMERAD is set)
// and a new address is re-pushed; conditions progress Pending → Available →
// Degraded; deletion tears down data servers before the metadata server.

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/internal/testutil"
	"github.com/chimera-k8s/chimera/operator/render"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

func i32(v int32) *int32 { return &v }

func namespace(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8s.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return name
}

func validCluster(ns, name string) *chimerav1.ChimeraCluster {
	return &chimerav1.ChimeraCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: chimerav1.ChimeraClusterSpec{
			Image:       "localhost/chimera/chimerad:dev",
			DataServers: chimerav1.DataServersSpec{Count: i32(2)},
			Storage:     chimerav1.StorageSpec{MemfsCapacityBytes: 64 << 20},
		},
	}
}

// durable turns c into a valid backend nvme cluster (device plugin, metadata volume).
func durable(c *chimerav1.ChimeraCluster) {
	c.Spec.Storage = chimerav1.StorageSpec{Backend: chimerav1.BackendNVMe, NVMe: &chimerav1.NVMeSpec{ResourceName: "chimera.io/nvme"}}
	c.Spec.MetadataServer.Storage = &chimerav1.MetadataStorageSpec{StorageClassName: "local-path", Size: resource.MustParse("10Gi")}
}

// eventually polls f until it returns nil or waitTimeout passes.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s: %v", waitTimeout, what, err)
}

func TestInvalidSpecsAreRejectedNamingTheField(t *testing.T) {
	ns := namespace(t, "invalid")
	hp := func(req, lim string) corev1.ResourceRequirements {
		r := corev1.ResourceRequirements{Requests: corev1.ResourceList{"hugepages-2Mi": resource.MustParse(req)}}
		if lim != "" {
			r.Limits = corev1.ResourceList{"hugepages-2Mi": resource.MustParse(lim)}
		}
		return r
	}
	cases := []struct {
		name   string
		mutate func(c *chimerav1.ChimeraCluster)
		field  string // the error must name this field
	}{
		{"empty image", func(c *chimerav1.ChimeraCluster) { c.Spec.Image = "" }, "spec.image"},
		{"zero data servers", func(c *chimerav1.ChimeraCluster) { c.Spec.DataServers.Count = i32(0) }, "spec.dataServers.count"},
		{"too many data servers", func(c *chimerav1.ChimeraCluster) { c.Spec.DataServers.Count = i32(257) }, "spec.dataServers.count"},
		{"count in DaemonSet mode", func(c *chimerav1.ChimeraCluster) { c.Spec.DataServers.Mode = "DaemonSet" }, "spec.dataServers.count"},
		{"four mirrors", func(c *chimerav1.ChimeraCluster) { c.Spec.PNFS.Mirrors = 4 }, "spec.pnfs.mirrors"},
		{"more mirrors than DSes (webhook)", func(c *chimerav1.ChimeraCluster) { c.Spec.PNFS.Mirrors = 3 }, "spec.pnfs.mirrors"},
		{"stripe unit not 4K-aligned", func(c *chimerav1.ChimeraCluster) { c.Spec.PNFS.StripeUnitBytes = 5000 }, "spec.pnfs.stripeUnitBytes"},
		{"stripe unit too large", func(c *chimerav1.ChimeraCluster) { c.Spec.PNFS.StripeUnitBytes = 128 << 20 }, "spec.pnfs.stripeUnitBytes"},
		{"unknown transport", func(c *chimerav1.ChimeraCluster) { c.Spec.Network.Transport = "udp" }, "spec.network.transport"},
		{"rdma without RDMA resource", func(c *chimerav1.ChimeraCluster) { c.Spec.Network.Transport = "rdma" }, "spec.network.rdmaResourceName"},
		{"TOS out of range", func(c *chimerav1.ChimeraCluster) { c.Spec.Network.TOS = i32(300) }, "spec.network.tos"},
		{"port above 65535", func(c *chimerav1.ChimeraCluster) { c.Spec.Network.Port = 70000 }, "spec.network.port"},
		{"port on the admin port (webhook)", func(c *chimerav1.ChimeraCluster) { c.Spec.Network.Port = 8080 }, "spec.network.port"},
		{"bad NAD name", func(c *chimerav1.ChimeraCluster) { c.Spec.Network.NetworkAttachment = "Bad_Name" }, "spec.network.networkAttachment"},
		{"nvme backend without devices", func(c *chimerav1.ChimeraCluster) { c.Spec.Storage.Backend = "nvme" }, "spec.storage.nvme"},
		{"nvme resource and PCI list both set", func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage = chimerav1.StorageSpec{Backend: "nvme", NVMe: &chimerav1.NVMeSpec{ResourceName: "chimera.io/nvme", PCIAddresses: []chimerav1.PCIAddress{"0000:3b:00.0"}}}
		}, "spec.storage.nvme"},
		{"malformed PCI address", func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage = chimerav1.StorageSpec{Backend: "nvme", NVMe: &chimerav1.NVMeSpec{PCIAddresses: []chimerav1.PCIAddress{"3b:00.0"}}}
		}, "spec.storage.nvme.pciAddresses[0]"},
		{"unknown backend", func(c *chimerav1.ChimeraCluster) { c.Spec.Storage.Backend = "zfs" }, "spec.storage.backend"},
		{"name too long", func(c *chimerav1.ChimeraCluster) { c.Name = strings.Repeat("a", 41) }, "metadata.name"},
		{"name not a DNS-1035 label (webhook)", func(c *chimerav1.ChimeraCluster) { c.Name = "1cluster" }, "metadata.name"},
		{"hugepage size without hugepages (webhook)", func(c *chimerav1.ChimeraCluster) { c.Spec.Tuning.HugePageSize = "1Gi" }, "spec.metadataServer.resources.limits[hugepages-1Gi]"},
		{"hugepages request without limit (webhook)", func(c *chimerav1.ChimeraCluster) { c.Spec.DataServers.Resources = hp("2Gi", "") }, "spec.dataServers.resources.limits[hugepages-2Mi]"},
		{"too many threads", func(c *chimerav1.ChimeraCluster) { c.Spec.Tuning.Threads = 2000 }, "spec.tuning.threads"},
		{"nvme without a metadata volume (CEL and webhook)", func(c *chimerav1.ChimeraCluster) { durable(c); c.Spec.MetadataServer.Storage = nil }, "spec.metadataServer.storage"},
		{"metadata volume with memfs (webhook)", func(c *chimerav1.ChimeraCluster) {
			c.Spec.MetadataServer.Storage = &chimerav1.MetadataStorageSpec{StorageClassName: "local-path", Size: resource.MustParse("10Gi")}
		}, "spec.metadataServer.storage"},
		{"metadata volume below 1Gi (webhook)", func(c *chimerav1.ChimeraCluster) {
			durable(c)
			c.Spec.MetadataServer.Storage.Size = resource.MustParse("512Mi")
		}, "spec.metadataServer.storage.size"},
		{"device plugin and block devices both set", func(c *chimerav1.ChimeraCluster) {
			durable(c)
			c.Spec.Storage.NVMe.DevicePaths = []chimerav1.DevicePath{"/dev/nvme0n1"}
		}, "spec.storage.nvme"},
		{"block devices and a data volume both set", func(c *chimerav1.ChimeraCluster) {
			durable(c)
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/dev/nvme0n1"}, VolumeClaim: &chimerav1.DataVolumeClaimSpec{StorageClassName: "local-path", Size: resource.MustParse("1Gi")}}
		}, "spec.storage.nvme"},
		{"data volume with a DaemonSet (CEL and webhook)", func(c *chimerav1.ChimeraCluster) {
			durable(c)
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{VolumeClaim: &chimerav1.DataVolumeClaimSpec{StorageClassName: "local-path", Size: resource.MustParse("1Gi")}}
			c.Spec.DataServers.Mode = chimerav1.DataServerModeDaemonSet
			c.Spec.DataServers.Count = nil
		}, "spec.storage.nvme.volumeClaim"},
		{"block device outside /dev", func(c *chimerav1.ChimeraCluster) {
			durable(c)
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/etc/shadow"}}
		}, "spec.storage.nvme.devicePaths[0]"},
		{"block device path escaping /dev (webhook)", func(c *chimerav1.ChimeraCluster) {
			durable(c)
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/dev/../etc/shadow"}}
		}, "spec.storage.nvme.devicePaths[0]"},
		{"diskfs block cache too small", func(c *chimerav1.ChimeraCluster) {
			durable(c)
			c.Spec.Storage.Diskfs = &chimerav1.DiskfsSpec{BlockCacheBlocks: 10}
		}, "spec.storage.diskfs.blockCacheBlocks"},
		{"access client is a host name (webhook)", func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"node-1.example.com"}}}
		}, "spec.access[0].clients[0]"},
		{"access type unknown", func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"*"}, Access: "write"}}
		}, "spec.access[0].access"},
		{"anonymous uid above 2^32-2", func(c *chimerav1.ChimeraCluster) {
			big := int64(1) << 32
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"*"}, AnonUID: &big}}
		}, "spec.access[0].anonUid"},
		{"pod network with host bits (webhook)", func(c *chimerav1.ChimeraCluster) { c.Spec.Network.PodNetworkCIDRs = []string{"10.244.1.1/16"} }, "spec.network.podNetworkCIDRs[0]"},
		{"issuer kind neither Issuer nor ClusterIssuer", func(c *chimerav1.ChimeraCluster) {
			c.Spec.AdminTLS.IssuerRef = &chimerav1.IssuerReference{Name: "vault", Kind: "VaultIssuer"}
		}, "spec.adminTLS.issuerRef.kind"},
		{"issuer without a name", func(c *chimerav1.ChimeraCluster) {
			c.Spec.AdminTLS.IssuerRef = &chimerav1.IssuerReference{Kind: "ClusterIssuer"}
		}, "spec.adminTLS.issuerRef.name"},
		{"issuer group not a DNS name", func(c *chimerav1.ChimeraCluster) {
			c.Spec.AdminTLS.IssuerRef = &chimerav1.IssuerReference{Name: "ca", Group: "Cert Manager"}
		}, "spec.adminTLS.issuerRef.group"},
	}
	if len(cases) < 10 {
		t.Fatal("the suite promises at least ten invalid specs")
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validCluster(ns, fmt.Sprintf("bad-%d", i))
			tc.mutate(c)
			err := k8s.Create(context.Background(), c)
			if err == nil {
				_ = k8s.Delete(context.Background(), c)
				t.Fatalf("accepted an invalid spec (%s)", tc.name)
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) && !apierrors.IsBadRequest(err) {
				t.Fatalf("want an Invalid error, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error does not name %s: %v", tc.field, err)
			}
		})
	}

	// The valid base is accepted (so the rejections above are about the mutation).
	ok := validCluster(ns, "good")
	if err := k8s.Create(context.Background(), ok); err != nil {
		t.Fatalf("valid spec rejected: %v", err)
	}
	// Update rule: the backend may not change (data loss).
	eventually(t, "backend change rejected", func() error {
		cur := &chimerav1.ChimeraCluster{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(ok), cur); err != nil {
			return err
		}
		durable(cur) // a valid nvme spec: only the change itself is wrong
		err := k8s.Update(context.Background(), cur)
		if err == nil {
			t.Fatal("backend change accepted")
		}
		if !strings.Contains(err.Error(), "spec.storage.backend") {
			return err // a conflict with the reconciler's finalizer update: retry
		}
		return nil
	})
	// Update rule: the MDS's metadata volume may not change (the StatefulSet's
	// claim cannot; the namespace lives on it) — said by CEL and the webhook.
	dur := validCluster(ns, "durable")
	durable(dur)
	if err := k8s.Create(context.Background(), dur); err != nil {
		t.Fatalf("valid durable spec rejected: %v", err)
	}
	eventually(t, "metadata volume change rejected", func() error {
		cur := &chimerav1.ChimeraCluster{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(dur), cur); err != nil {
			return err
		}
		cur.Spec.MetadataServer.Storage.StorageClassName = "other-class"
		err := k8s.Update(context.Background(), cur)
		if err == nil {
			t.Fatal("metadata volume change accepted")
		}
		if !strings.Contains(err.Error(), "spec.metadataServer.storage") || !strings.Contains(err.Error(), "immutable") {
			return err // a conflict with the reconciler's finalizer update: retry
		}
		return nil
	})
}

// children lists every object of the kinds the operator creates that carry
// the cluster label, as "Kind/name".
func children(t *testing.T, ns, cluster string) []string {
	t.Helper()
	sel := client.MatchingLabels{render.LabelCluster: cluster}
	var out []string
	lists := map[string]client.ObjectList{
		"ConfigMap": &corev1.ConfigMapList{}, "Secret": &corev1.SecretList{}, "Service": &corev1.ServiceList{},
		"StatefulSet": &appsv1.StatefulSetList{}, "DaemonSet": &appsv1.DaemonSetList{}, "PodDisruptionBudget": &policyv1.PodDisruptionBudgetList{},
		"NetworkPolicy": &networkingv1.NetworkPolicyList{},
	}
	for kind, l := range lists {
		if err := k8s.List(context.Background(), l, client.InNamespace(ns), sel); err != nil {
			t.Fatal(err)
		}
		items, _ := meta.ExtractList(l)
		for _, it := range items {
			o := it.(client.Object)
			if o.GetDeletionTimestamp() != nil {
				continue
			}
			out = append(out, kind+"/"+o.GetName())
		}
	}
	sort.Strings(out)
	return out
}

func TestReconcileCreatesExactlyTheChildren(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "kids")
	c := validCluster(ns, "kids")
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	want := "ConfigMap/kids-config NetworkPolicy/kids-servers PodDisruptionBudget/kids-ds PodDisruptionBudget/kids-mds Secret/kids-admin-tls Secret/kids-admin-token Service/kids-ds Service/kids-mds StatefulSet/kids-ds StatefulSet/kids-mds"
	eventually(t, "children", func() error {
		if got := strings.Join(children(t, ns, "kids"), " "); got != want {
			return fmt.Errorf("children %q, want %q", got, want)
		}
		return nil
	})
	// Every child is controlled by the cluster (garbage collection, watches).
	sts := &appsv1.StatefulSet{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "kids-ds"}, sts); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(sts); ref == nil || ref.Kind != "ChimeraCluster" || ref.Name != "kids" {
		t.Fatalf("DS StatefulSet controller ref %+v", ref)
	}
	if *sts.Spec.Replicas != 2 {
		t.Fatalf("DS replicas %d, want 2", *sts.Spec.Replicas)
	}
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "kids-config"}, cm); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cm.Data["mds.json"], `"role": "mds"`) || !strings.Contains(cm.Data["ds.json"], `"role": "ds"`) {
		t.Fatalf("config map data %v", cm.Data)
	}
	// Defaults from the schema were applied.
	cur := &chimerav1.ChimeraCluster{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
		t.Fatal(err)
	}
	if cur.Spec.PNFS.StripeUnitBytes != 1<<20 || cur.Spec.Network.Transport != "tcp" || cur.Spec.Storage.Backend != "memfs" || cur.Spec.DataServers.Mode != "StatefulSet" {
		t.Fatalf("schema defaults not applied: %+v", cur.Spec)
	}

	// Reconciling again (a spec-neutral change triggers it) changes nothing.
	rv := cm.ResourceVersion
	stsRV := sts.ResourceVersion
	cur.Annotations = map[string]string{"poke": "1"}
	if err := k8s.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // let the triggered reconcile run; then nothing may have changed
	_ = k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "kids-config"}, cm)
	_ = k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "kids-ds"}, sts)
	if cm.ResourceVersion != rv || sts.ResourceVersion != stsRV {
		t.Fatalf("a no-op reconcile rewrote children (ConfigMap rv %s→%s, StatefulSet rv %s→%s)", rv, cm.ResourceVersion, stsRV, sts.ResourceVersion)
	}

	// Switching to DaemonSet mode replaces the DS StatefulSet with a DaemonSet.
	eventually(t, "mode switch accepted", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
			return err
		}
		cur.Spec.DataServers.Mode = chimerav1.DataServerModeDaemonSet
		cur.Spec.DataServers.Count = nil
		cur.Spec.PNFS.Mirrors = 1
		return k8s.Update(ctx, cur)
	})
	want = strings.Replace(want, "StatefulSet/kids-ds ", "", 1)
	want = strings.Replace(want, "ConfigMap/kids-config ", "ConfigMap/kids-config DaemonSet/kids-ds ", 1)
	eventually(t, "DaemonSet mode children", func() error {
		if got := strings.Join(children(t, ns, "kids"), " "); got != want {
			return fmt.Errorf("children %q, want %q", got, want)
		}
		return nil
	})
}

// startChimerad runs the real chimerad as an MDS with only its admin API on
// 127.0.0.1, and returns the admin base URL. It returns "" when $CHIMERAD is
// not set (the caller then uses a strict fake).
func startChimerad(t *testing.T, c *chimerav1.ChimeraCluster, token string) string {
	bin := os.Getenv("CHIMERAD")
	if bin == "" {
		if os.Getenv("CHIMERA_REQUIRE_CHIMERAD") != "" {
			t.Fatal("CHIMERA_REQUIRE_CHIMERAD is set but CHIMERAD is not")
		}
		return ""
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The certificate the operator issued, as the MDS pod mounts it.
	certFile, keyFile := adminTLSFiles(t, c, dir)
	// Every listener binds port 0; the ports are read back from the log
	// (testutil.ChimeradPorts), so none is guessed and none can be taken first.
	cfg := fmt.Sprintf(`{
  "common": {"log_level": "info"},
  "server": {"role": "mds", "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0,
             "pnfs": {"enabled": true, "mirrors": 1}},
  "mounts": {"data": {"module": "memfs", "path": "/", "capacity_bytes": "16M"}},
  "exports": {"/data": {"path": "/data"}},
  "admin": {"bind": "127.0.0.1", "port": 0, "token_file": %q, "tls": {"cert_file": %q, "key_file": %q}},
  "metrics": {"bind": "127.0.0.1", "port": 0}
}`, tokenFile, certFile, keyFile)
	cfgFile := filepath.Join(dir, "mds.json")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	cmd := exec.CommandContext(ctx, bin, "--config", cfgFile)
	logPath := filepath.Join(dir, "chimerad.log")
	logf, _ := os.Create(logPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cancel()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("chimerad log:\n%s", b)
		}
	})
	ports, err := testutil.ChimeradPorts(logPath, []string{"admin", "metrics"}, exited, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("https://127.0.0.1:%d", ports["admin"])
	eventually(t, "chimerad /healthz", func() error {
		resp, err := adminTestClient(c).Get(url + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	return url
}

// fakeMDS is used only without $CHIMERAD: it checks the token and keeps the
// last data-server list and the last access rules of mount "data" (answered
// on GET /api/v1/access/data as chimerad does), nothing more.
func fakeMDS(t *testing.T, c *chimerav1.ChimeraCluster, token string) (string, func() string, func() string) {
	var last, access atomicString
	access.Store(`{"mount": "data", "access": null}`)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if strings.HasPrefix(r.URL.Path, "/api/v1/access/") {
			if r.URL.Path != "/api/v1/access/data" {
				http.Error(w, "no such mount", http.StatusNotFound)
				return
			}
			if r.Method == http.MethodPut {
				var in struct {
					Access *[]json.RawMessage `json:"access"`
				}
				if err := json.Unmarshal(b, &in); err != nil || in.Access == nil {
					http.Error(w, "access: required", http.StatusBadRequest)
					return
				}
				out, _ := json.Marshal(map[string]any{"mount": "data", "access": in.Access})
				access.Store(string(out))
			}
			_, _ = w.Write([]byte(access.Load()))
			return
		}
		if r.URL.Path != "/api/v1/dataservers" {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		if r.Method == http.MethodPut {
			// Answer as chimerad does: address as host:port.
			var in struct {
				DataServers []struct {
					Name    string `json:"name"`
					Address string `json:"address"`
					Port    int    `json:"port"`
					Ready   bool   `json:"ready"`
				} `json:"dataServers"`
			}
			if err := json.Unmarshal(b, &in); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			for i := range in.DataServers {
				in.DataServers[i].Address = fmt.Sprintf("%s:%d", in.DataServers[i].Address, in.DataServers[i].Port)
			}
			out, _ := json.Marshal(in)
			last.Store(string(out))
		}
		_, _ = w.Write([]byte(last.Load()))
	})}
	return serveAdminTLS(t, c, srv), last.Load, access.Load
}

// serveAdminTLS serves srv on 127.0.0.1 (a port the kernel picks) with a
// certificate from the operator's CA for the cluster's names, as the real
// MDS is served, and returns its https base URL.
func serveAdminTLS(t *testing.T, c *chimerav1.ChimeraCluster, srv *http.Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Served with a certificate from the operator's CA for the cluster's
	// names, as the real MDS is.
	certPEM, keyPEM, err := suiteCA.IssueServer(render.AdminTLSNames(c), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return serveTLSListener(t, srv, l, pair)
}

// serveTLSPair serves srv on 127.0.0.1 with pair and returns its https URL.
func serveTLSPair(t *testing.T, srv *http.Server, pair tls.Certificate) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveTLSListener(t, srv, l, pair)
}

func serveTLSListener(t *testing.T, srv *http.Server, l net.Listener, pair tls.Certificate) string {
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pair}}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + l.Addr().String()
}

// adminTLSFiles writes the cluster's admin TLS Secret (issued by the
// operator) to dir as tls.crt and tls.key.
func adminTLSFiles(t *testing.T, c *chimerav1.ChimeraCluster, dir string) (string, string) {
	t.Helper()
	sec := &corev1.Secret{}
	eventually(t, "admin TLS Secret", func() error {
		return k8s.Get(context.Background(), types.NamespacedName{Namespace: c.Namespace, Name: render.AdminTLSSecretName(c)}, sec)
	})
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, sec.Data[corev1.TLSCertKey], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, sec.Data[corev1.TLSPrivateKeyKey], 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// adminTestClient trusts only the operator's CA and checks the MDS's
// certificate against the cluster's admin server name, as the operator does.
func adminTestClient(c *chimerav1.ChimeraCluster) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: suiteCA.Pool(), ServerName: render.MDSAdminServerName(c), MinVersion: tls.VersionTLS12},
	}}
}

// makePod creates a pod as the StatefulSet controller and kubelet would
// have: labels, then a Running status with readiness and an IP.
func makePod(t *testing.T, c *chimerav1.ChimeraCluster, name, component, podIP, storageIP string, ready bool) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: name, Labels: render.Labels(c, component),
			Annotations: map[string]string{render.AnnotationRevision: templateRevision(t, c, component)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "chimerad", Image: c.Spec.Image}}},
	}
	if storageIP != "" {
		p.Annotations[render.AnnotationNetworkStatus] = fmt.Sprintf(`[{"name":"kindnet","interface":"eth0","ips":[%q],"default":true},{"name":"%s/storage-net","interface":"net1","ips":[%q]}]`, podIP, c.Namespace, storageIP)
	}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	setPodStatus(t, p, podIP, ready)
}

// templateRevision waits for the component's StatefulSet and returns the
// revision its pod template carries (what its controller stamps on pods).
func templateRevision(t *testing.T, c *chimerav1.ChimeraCluster, component string) string {
	t.Helper()
	var rev string
	eventually(t, "the "+component+" StatefulSet's revision", func() error {
		var err error
		rev, err = stsRevision(context.Background(), c, component)
		return err
	})
	return rev
}

func stsRevision(ctx context.Context, c *chimerav1.ChimeraCluster, component string) (string, error) {
	name := render.DSName(c)
	if component == render.ComponentMDS {
		name = render.MDSName(c)
	}
	sts := &appsv1.StatefulSet{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: name}, sts); err != nil {
		return "", err
	}
	rev := sts.Spec.Template.Annotations[render.AnnotationRevision]
	if rev == "" {
		return "", fmt.Errorf("StatefulSet %s has no %s annotation", name, render.AnnotationRevision)
	}
	return rev, nil
}

func setPodStatus(t *testing.T, p *corev1.Pod, podIP string, ready bool) {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}
	if err := k8s.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

type dsList struct {
	DataServers []struct {
		Name    string `json:"name"`
		Address string `json:"address"`
		Ready   bool   `json:"ready"`
	} `json:"dataServers"`
}

func TestStorageAddressesReachTheMDSAndConditionsProgress(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "push")
	c := validCluster(ns, "push")
	c.Spec.Network.NetworkAttachment = "storage-net"
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	cond := func(typ string) *metav1.Condition {
		cur := &chimerav1.ChimeraCluster{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
			return nil
		}
		return meta.FindStatusCondition(cur.Status.Conditions, typ)
	}
	status := func() chimerav1.ChimeraClusterStatus {
		cur := &chimerav1.ChimeraCluster{}
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(c), cur)
		return cur.Status
	}
	eventually(t, "phase Pending, Progressing", func() error {
		st := status()
		if st.Phase != chimerav1.PhasePending || cond("Progressing") == nil || cond("Progressing").Status != metav1.ConditionTrue {
			return fmt.Errorf("phase %q conditions %+v", st.Phase, st.Conditions)
		}
		if st.MetadataServerEndpoint != "push-mds.push.svc:2049" {
			return fmt.Errorf("endpoint %q", st.MetadataServerEndpoint)
		}
		return nil
	})

	sec := &corev1.Secret{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "push-admin-token"}, sec); err != nil {
		t.Fatal(err)
	}
	token := string(sec.Data["token"])
	url := startChimerad(t, c, token)
	read := func() (dsList, error) {
		req, _ := http.NewRequest(http.MethodGet, url+"/api/v1/dataservers", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := adminTestClient(c).Do(req)
		if err != nil {
			return dsList{}, err
		}
		defer resp.Body.Close()
		var l dsList
		err = json.NewDecoder(resp.Body).Decode(&l)
		return l, err
	}
	if url == "" {
		t.Log("CHIMERAD not set: using a fake admin endpoint")
		var last func() string
		url, last, _ = fakeMDS(t, c, token)
		read = func() (dsList, error) {
			var l dsList
			err := json.Unmarshal([]byte(last()), &l)
			return l, err
		}
	}
	adminURL.url.Store(url)

	makePod(t, c, "push-mds-0", render.ComponentMDS, "10.0.0.10", "", true)
	makePod(t, c, "push-ds-0", render.ComponentDS, "10.0.0.11", "192.168.50.11", true)
	makePod(t, c, "push-ds-1", render.ComponentDS, "10.0.0.12", "192.168.50.12", true)

	addrs := func(l dsList) string {
		var a []string
		for _, d := range l.DataServers {
			a = append(a, d.Name+"="+d.Address)
		}
		return strings.Join(a, ",")
	}
	eventually(t, "DS storage addresses at the MDS", func() error {
		l, err := read()
		if err != nil {
			return err
		}
		if got := addrs(l); got != "push-ds-0=192.168.50.11:2049,push-ds-1=192.168.50.12:2049" {
			return fmt.Errorf("MDS has %q", got)
		}
		return nil
	})
	eventually(t, "phase Available", func() error {
		st := status()
		if st.Phase != chimerav1.PhaseAvailable || st.DataServersReady != 2 || cond("Available").Status != metav1.ConditionTrue ||
			cond("Degraded").Status != metav1.ConditionFalse || cond("Progressing").Status != metav1.ConditionFalse {
			return fmt.Errorf("phase %q ready %d conditions %+v", st.Phase, st.DataServersReady, st.Conditions)
		}
		if len(st.DataServers) != 2 || st.DataServers[1].StorageAddress != "192.168.50.12" {
			return fmt.Errorf("per-DS status %+v", st.DataServers)
		}
		return nil
	})

	// A DS rescheduled with a new storage address is re-pushed.
	p := &corev1.Pod{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "push-ds-1"}, p); err != nil {
		t.Fatal(err)
	}
	p.Annotations[render.AnnotationNetworkStatus] = `[{"name":"push/storage-net","interface":"net1","ips":["192.168.50.99"]}]`
	if err := k8s.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new DS address at the MDS", func() error {
		l, err := read()
		if err != nil {
			return err
		}
		if got := addrs(l); got != "push-ds-0=192.168.50.11:2049,push-ds-1=192.168.50.99:2049" {
			return fmt.Errorf("MDS has %q", got)
		}
		return nil
	})

	// A DS that stops being ready degrades the cluster and tells the MDS.
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "push-ds-0"}, p); err != nil {
		t.Fatal(err)
	}
	setPodStatus(t, p, "10.0.0.11", false)
	eventually(t, "phase Degraded", func() error {
		st := status()
		d := cond("Degraded")
		if st.Phase != chimerav1.PhaseDegraded || d == nil || d.Status != metav1.ConditionTrue || d.Reason != "DataServersNotReady" {
			return fmt.Errorf("phase %q conditions %+v", st.Phase, st.Conditions)
		}
		l, err := read()
		if err != nil {
			return err
		}
		if len(l.DataServers) != 2 || l.DataServers[0].Ready {
			return fmt.Errorf("MDS still thinks push-ds-0 is ready: %+v", l)
		}
		return nil
	})

	// A wrong token is refused by the MDS and reported as Degraded with the reason.
	sec.Data["token"] = []byte("wrong-token")
	if err := k8s.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	eventually(t, "push failure reported", func() error {
		d := cond("Degraded")
		if d == nil || d.Reason != "DataServerPushFailed" || !strings.Contains(d.Message, "401") {
			return fmt.Errorf("Degraded %+v", d)
		}
		return nil
	})
}

func TestDeletionTearsDownDataServersFirst(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "bye")
	c := validCluster(ns, "bye")
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	eventually(t, "children", func() error {
		if n := len(children(t, ns, "bye")); n != 10 { // every child, the admin TLS Secret included
			return fmt.Errorf("%d children", n)
		}
		return nil
	})
	makePod(t, c, "bye-mds-0", render.ComponentMDS, "10.0.1.10", "", true)
	makePod(t, c, "bye-ds-0", render.ComponentDS, "10.0.1.11", "", true)

	if err := k8s.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	exists := func(o client.Object, name string) bool {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, o)
		return err == nil && o.GetDeletionTimestamp() == nil
	}
	eventually(t, "DS StatefulSet deleted first", func() error {
		if exists(&appsv1.StatefulSet{}, "bye-ds") {
			return fmt.Errorf("DS StatefulSet still there")
		}
		return nil
	})
	// While a DS pod is still running the MDS must stay.
	time.Sleep(3 * time.Second) // > TeardownPollInterval: at least one more teardown pass ran
	if !exists(&appsv1.StatefulSet{}, "bye-mds") {
		t.Fatal("MDS deleted while a data server was still running")
	}
	cur := &chimerav1.ChimeraCluster{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil || cur.Status.Phase != chimerav1.PhaseDeleting {
		t.Fatalf("cluster during teardown: phase %q err %v", cur.Status.Phase, err)
	}
	// The StatefulSet controller would now delete the pods; play it.
	zero := client.GracePeriodSeconds(0)
	_ = k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bye-ds-0"}}, zero)
	eventually(t, "MDS StatefulSet deleted", func() error {
		if exists(&appsv1.StatefulSet{}, "bye-mds") {
			return fmt.Errorf("MDS StatefulSet still there")
		}
		return nil
	})
	_ = k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bye-mds-0"}}, zero)
	eventually(t, "everything gone", func() error {
		if left := children(t, ns, "bye"); len(left) != 0 {
			return fmt.Errorf("left behind: %v", left)
		}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still exists (finalizers %v, err %v)", cur.Finalizers, err)
		}
		return nil
	})
}

// TestSamplesAreAccepted applies every ChimeraCluster sample in config/samples
// to the real apiserver (schema, CEL) and the webhook: what we ship must be valid.
func TestSamplesAreAccepted(t *testing.T) {
	ctx := context.Background()
	files, _ := filepath.Glob(filepath.Join("..", "..", "config", "samples", "storage_v1alpha1_chimeracluster_*.yaml"))
	if len(files) < 2 {
		t.Fatalf("found %d ChimeraCluster samples, want at least 2", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, doc := range strings.Split(string(b), "\n---\n") {
			if !strings.Contains(doc, "kind: ChimeraCluster") {
				continue
			}
			c := &chimerav1.ChimeraCluster{}
			if err := yaml.Unmarshal([]byte(doc), c); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			namespace(t, c.Namespace)
			if err := k8s.Create(ctx, c); err != nil {
				t.Fatalf("%s rejected: %v", f, err)
			}
			found = true
		}
		if !found {
			t.Fatalf("%s has no ChimeraCluster", f)
		}
	}
}
