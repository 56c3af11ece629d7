package webhook

// Proves the webhook's cross-field rules name the offending field, that a
// valid cluster passes with the warnings a user must see, and that the
// self-managed certificates are created once, chain to the CA that lands in
// both webhook configurations (validating, and the sidecar injector's), are reused when valid and renewed near expiry.

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func i32(v int32) *int32 { return &v }

func base() *chimerav1.ChimeraCluster {
	return &chimerav1.ChimeraCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "ns"},
		Spec: chimerav1.ChimeraClusterSpec{
			Image:       "chimera/chimerad:1",
			DataServers: chimerav1.DataServersSpec{Mode: chimerav1.DataServerModeStatefulSet, Count: i32(2)},
			Storage:     chimerav1.StorageSpec{Backend: chimerav1.BackendMemFS},
			Network:     chimerav1.NetworkSpec{Transport: chimerav1.TransportTCP},
			PNFS:        chimerav1.PNFSSpec{StripeUnitBytes: 1 << 20, Mirrors: 1},
		},
	}
}

// durable is a valid backend nvme cluster (device plugin, metadata volume).
func durable() *chimerav1.ChimeraCluster {
	c := base()
	c.Spec.Storage = chimerav1.StorageSpec{Backend: chimerav1.BackendNVMe, NVMe: &chimerav1.NVMeSpec{ResourceName: "chimera.io/nvme", DevicesPerPod: 2}}
	c.Spec.MetadataServer.Storage = &chimerav1.MetadataStorageSpec{StorageClassName: "local-path", Size: resource.MustParse("10Gi")}
	return c
}

// TestDurableAndAccessSpecs: hostile backend-nvme and access specs, each
// refused naming its field, next to the valid shapes that must pass (the
// test data turns from valid to invalid one field at a time).
func TestDurableAndAccessSpecs(t *testing.T) {
	valid := map[string]func(*chimerav1.ChimeraCluster){
		"device plugin": func(*chimerav1.ChimeraCluster) {},
		"PCI addresses": func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{PCIAddresses: []chimerav1.PCIAddress{"0000:3b:00.0"}}
		},
		"block devices": func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/dev/nvme0n1", "/dev/disk/by-id/nvme-x"}}
		},
		"diskfs tuning": func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.Diskfs = &chimerav1.DiskfsSpec{BlockCacheBlocks: 4096}
		},
		"metadata 1Gi": func(c *chimerav1.ChimeraCluster) { c.Spec.MetadataServer.Storage.Size = resource.MustParse("1Gi") },
		"data volume claims": func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{VolumeClaim: &chimerav1.DataVolumeClaimSpec{StorageClassName: "local-path", Size: resource.MustParse("1Gi")}}
		},
		"access rules": func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"10.0.0.9", "fd00::/8", "*"}, Access: chimerav1.AccessRO, Squash: chimerav1.SquashAll, AnonUID: ptr64(1000)}}
		},
		"pod network": func(c *chimerav1.ChimeraCluster) {
			c.Spec.Network.PodNetworkCIDRs = []string{"10.244.0.0/16", "fd10::/64"}
		},
		"memfs + access": func(c *chimerav1.ChimeraCluster) {
			*c = *base()
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"192.168.1.0/24"}}}
		},
	}
	for name, mutate := range valid {
		c := durable()
		mutate(c)
		if errs := Validate(c); len(errs) != 0 {
			t.Errorf("valid %s rejected: %v", name, errs)
		}
	}
	for name, tc := range map[string]struct {
		mutate func(*chimerav1.ChimeraCluster)
		field  string
		says   string
	}{
		"nvme without metadata volume": {func(c *chimerav1.ChimeraCluster) { c.Spec.MetadataServer.Storage = nil }, "spec.metadataServer.storage", "storageClassName"},
		"metadata volume with memfs": {func(c *chimerav1.ChimeraCluster) {
			st := c.Spec.MetadataServer.Storage
			*c = *base()
			c.Spec.MetadataServer.Storage = st
		}, "spec.metadataServer.storage", "memfs"},
		"diskfs with memfs":         {func(c *chimerav1.ChimeraCluster) { *c = *base(); c.Spec.Storage.Diskfs = &chimerav1.DiskfsSpec{} }, "spec.storage.diskfs", "nvme"},
		"bad class name":            {func(c *chimerav1.ChimeraCluster) { c.Spec.MetadataServer.Storage.StorageClassName = "Fast_SSD" }, "spec.metadataServer.storage.storageClassName", "StorageClass"},
		"metadata volume too small": {func(c *chimerav1.ChimeraCluster) { c.Spec.MetadataServer.Storage.Size = resource.MustParse("1023Mi") }, "spec.metadataServer.storage.size", "1Gi"},
		"metadata volume zero":      {func(c *chimerav1.ChimeraCluster) { c.Spec.MetadataServer.Storage.Size = resource.Quantity{} }, "spec.metadataServer.storage.size", "1Gi"},
		"data volume too small": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{VolumeClaim: &chimerav1.DataVolumeClaimSpec{StorageClassName: "local-path", Size: resource.MustParse("100Mi")}}
		}, "spec.storage.nvme.volumeClaim.size", "1Gi"},
		"data volume bad class": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{VolumeClaim: &chimerav1.DataVolumeClaimSpec{StorageClassName: "No Such", Size: resource.MustParse("1Gi")}}
		}, "spec.storage.nvme.volumeClaim.storageClassName", "StorageClass"},
		"data volume with a DaemonSet": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{VolumeClaim: &chimerav1.DataVolumeClaimSpec{StorageClassName: "local-path", Size: resource.MustParse("1Gi")}}
			c.Spec.DataServers.Mode = chimerav1.DataServerModeDaemonSet
			c.Spec.DataServers.Count = nil
		}, "spec.storage.nvme.volumeClaim", "StatefulSet"},
		"device path escapes /dev": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/dev/../etc/shadow"}}
		}, "spec.storage.nvme.devicePaths[0]", "clean"},
		"device path not in /dev": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/var/disk.img"}}
		}, "spec.storage.nvme.devicePaths[0]", "/dev/"},
		"device path twice": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/dev/nvme0n1", "/dev/nvme0n1"}}
		}, "spec.storage.nvme.devicePaths[1]", "Duplicate"},
		"device path trailing slash": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/dev/nvme0n1/"}}
		}, "spec.storage.nvme.devicePaths[0]", "clean"},
		"host name as client": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"node1.example.com"}}}
		}, "spec.access[0].clients[0]", "host names are not resolved"},
		"CIDR with host bits": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"10.0.0.1/8"}}}
		}, "spec.access[0].clients[0]", "10.0.0.0/8"},
		"CIDR prefix too long": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"10.0.0.0/33"}}}
		}, "spec.access[0].clients[0]", "not a CIDR"},
		"empty client list": {func(c *chimerav1.ChimeraCluster) { c.Spec.Access = []chimerav1.AccessRule{{}} }, "spec.access[0].clients", "at least one"},
		"zoned v6 client": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"10.0.0.0/8"}}, {Clients: []string{"fe80::1%eth0"}}}
		}, "spec.access[1].clients[0]", "zoned"},
		"anon uid out of range": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"*"}, AnonUID: ptr64(1 << 32)}}
		}, "spec.access[0].anonUid", "4294967294"},
		"negative anon gid": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"*"}, AnonGID: ptr64(-1)}}
		}, "spec.access[0].anonGid", "must be"},
		"anon id with no squash": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"*"}, Squash: chimerav1.SquashNoRoot, AnonUID: ptr64(5)}}
		}, "spec.access[0].anonUid", "no_root_squash"},
		"too many rules": {func(c *chimerav1.ChimeraCluster) {
			for i := 0; i <= chimerav1.AccessRulesMax; i++ {
				c.Spec.Access = append(c.Spec.Access, chimerav1.AccessRule{Clients: []string{"*"}})
			}
		}, "spec.access", "must have at most 32"},
		"pod network is an address": {func(c *chimerav1.ChimeraCluster) { c.Spec.Network.PodNetworkCIDRs = []string{"10.244.0.1"} }, "spec.network.podNetworkCIDRs[0]", "CIDR"},
		"pod network is a wildcard": {func(c *chimerav1.ChimeraCluster) { c.Spec.Network.PodNetworkCIDRs = []string{"*"} }, "spec.network.podNetworkCIDRs[0]", "CIDR"},
	} {
		c := durable()
		tc.mutate(c)
		errs := Validate(c)
		msg := errs.ToAggregate()
		if msg == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if !strings.Contains(msg.Error(), tc.field) || !strings.Contains(msg.Error(), tc.says) {
			t.Errorf("%s: %v does not name %s with %q", name, msg, tc.field, tc.says)
		}
	}
}

func ptr64(v int64) *int64 { return &v }

func TestValidateNamesTheField(t *testing.T) {
	if errs := Validate(base()); len(errs) != 0 {
		t.Fatalf("valid cluster rejected: %v", errs)
	}
	hp := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{"hugepages-1Gi": resource.MustParse("2Gi")},
		Limits:   corev1.ResourceList{"hugepages-1Gi": resource.MustParse("2Gi")},
	}
	for name, tc := range map[string]struct {
		mutate func(*chimerav1.ChimeraCluster)
		field  string
	}{
		"mirrors > count":        {func(c *chimerav1.ChimeraCluster) { c.Spec.PNFS.Mirrors = 3 }, "spec.pnfs.mirrors"},
		"name starts with digit": {func(c *chimerav1.ChimeraCluster) { c.Name = "9x" }, "metadata.name"},
		"image with space":       {func(c *chimerav1.ChimeraCluster) { c.Spec.Image = "a b" }, "spec.image"},
		"nvme without devices":   {func(c *chimerav1.ChimeraCluster) { c.Spec.Storage.Backend = chimerav1.BackendNVMe }, "spec.storage.nvme"},
		"nvme both": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage = chimerav1.StorageSpec{Backend: chimerav1.BackendNVMe, NVMe: &chimerav1.NVMeSpec{ResourceName: "x.io/nvme", PCIAddresses: []chimerav1.PCIAddress{"0000:01:00.0"}}}
		}, "spec.storage.nvme.pciAddresses"},
		"duplicate PCI": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage = chimerav1.StorageSpec{Backend: chimerav1.BackendNVMe, NVMe: &chimerav1.NVMeSpec{PCIAddresses: []chimerav1.PCIAddress{"0000:01:00.0", "0000:01:00.0"}}}
		}, "spec.storage.nvme.pciAddresses[1]"},
		"nvme with memfs": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{ResourceName: "x.io/nvme"}
		}, "spec.storage.nvme"},
		"rdma no resource": {func(c *chimerav1.ChimeraCluster) { c.Spec.Network.Transport = chimerav1.TransportRDMA }, "spec.network.rdmaResourceName"},
		"tos with tcp":     {func(c *chimerav1.ChimeraCluster) { c.Spec.Network.TOS = i32(104) }, "spec.network.tos"},
		"port = metrics":   {func(c *chimerav1.ChimeraCluster) { c.Spec.Network.Port = 9000 }, "spec.network.port"},
		"rdma on 2049": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Network = chimerav1.NetworkSpec{Transport: chimerav1.TransportRDMA, RDMAResourceName: "rdma/x", Port: 2049}
		}, "spec.network.port"},
		"hugepage size not requested": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Tuning.HugePageSize = "2Mi"
			c.Spec.MetadataServer.Resources = hp
			c.Spec.DataServers.Resources = hp
		}, "spec.metadataServer.resources.limits[hugepages-2Mi]"},
		"device resource by hand": {func(c *chimerav1.ChimeraCluster) {
			c.Spec.Network = chimerav1.NetworkSpec{Transport: chimerav1.TransportRDMA, RDMAResourceName: "rdma/x"}
			c.Spec.DataServers.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"rdma/x": resource.MustParse("1")}}
		}, "spec.dataServers.resources.limits[rdma/x]"},
	} {
		c := base()
		tc.mutate(c)
		errs := Validate(c)
		if len(errs) == 0 {
			t.Errorf("%s: accepted", name)
			continue
		}
		if !strings.Contains(errs.ToAggregate().Error(), tc.field) {
			t.Errorf("%s: %v does not name %s", name, errs, tc.field)
		}
	}
}

func TestUpdateRulesAndWarnings(t *testing.T) {
	old, cur := base(), base()
	cur.Spec.Storage = chimerav1.StorageSpec{Backend: chimerav1.BackendNVMe, NVMe: &chimerav1.NVMeSpec{ResourceName: "x.io/nvme"}}
	w, err := Validator{}.ValidateUpdate(context.Background(), old, cur)
	if err == nil || !strings.Contains(err.Error(), "spec.storage.backend") {
		t.Fatalf("backend change: %v", err)
	}
	// Backend nvme is released (diskfs): no warning for it any more.
	for _, m := range w {
		if strings.Contains(m, "nvme") {
			t.Errorf("backend nvme still warned about: %v", w)
		}
	}
	// diskfs.initialize formats blank devices only (chimerad never
	// reformats its own format, and refuses another's): no warning.
	d := durable()
	d.Spec.Storage.Diskfs = &chimerav1.DiskfsSpec{Initialize: true}
	if w, err := (Validator{}).ValidateCreate(context.Background(), d); err != nil || len(w) != 0 {
		t.Errorf("initialize: warnings %v err %v", w, err)
	}
	// An export open to every host as root is said at admission.
	o := base()
	o.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"10.0.0.0/8"}}, {Clients: []string{"*"}, Access: chimerav1.AccessRW, Squash: chimerav1.SquashNoRoot}}
	if w, err := (Validator{}).ValidateCreate(context.Background(), o); err != nil || len(w) != 1 || !strings.Contains(w[0], "spec.access[1]") {
		t.Errorf("wide-open rule: warnings %v err %v", w, err)
	}
	o.Spec.Access[1].Squash = chimerav1.SquashRoot
	if w, _ := (Validator{}).ValidateCreate(context.Background(), o); len(w) != 0 {
		t.Errorf("a squashed wildcard is no warning: %v", w)
	}
	// Opting in to restart a memfs MDS (it loses every file) is said at admission.
	o.Spec.Rollout.AllowMemfsMetadataServerRestart = true
	if w, _ := (Validator{}).ValidateCreate(context.Background(), o); len(w) != 1 || !strings.Contains(w[0], "spec.rollout.allowMemfsMetadataServerRestart") {
		t.Errorf("memfs MDS restart opt-in: warnings %v", w)
	}
	d.Spec.Rollout.AllowMemfsMetadataServerRestart = true // ignored with nvme: no warning
	if w, _ := (Validator{}).ValidateCreate(context.Background(), d); len(w) != 0 {
		t.Errorf("opt-in on a durable cluster: warnings %v", w)
	}
	d.Spec.Rollout.AllowMemfsMetadataServerRestart = false
	d.Spec.Storage.Diskfs.Initialize = false
	if w, err := (Validator{}).ValidateCreate(context.Background(), d); err != nil || len(w) != 0 {
		t.Errorf("durable cluster without initialize: warnings %v err %v", w, err)
	}
	// chimerad serves NFS over RDMA (with the TCP fallback): a valid rdma
	// cluster, traffic class included, is admitted without a warning.
	r := base()
	r.Spec.Network = chimerav1.NetworkSpec{Transport: chimerav1.TransportRDMA, TOS: i32(104), NetworkAttachment: "roce-a", RDMAResourceName: "rdma/roce_a"}
	if w, err := (Validator{}).ValidateCreate(context.Background(), r); err != nil || len(w) != 0 {
		t.Errorf("rdma cluster: warnings %v err %v", w, err)
	}
	// The metadata volume is immutable (StatefulSet volume claims are).
	oldD, curD := durable(), durable()
	curD.Spec.MetadataServer.Storage.Size = resource.MustParse("20Gi")
	if _, err := (Validator{}).ValidateUpdate(context.Background(), oldD, curD); err == nil || !strings.Contains(err.Error(), "spec.metadataServer.storage") {
		t.Errorf("metadata volume change: %v", err)
	}
	curD = durable()
	curD.Spec.Access = []chimerav1.AccessRule{{Clients: []string{"10.1.0.0/16"}}}
	if _, err := (Validator{}).ValidateUpdate(context.Background(), oldD, curD); err != nil {
		t.Errorf("an access change is an ordinary update: %v", err)
	}
	// A cluster being deleted is never blocked (the finalizer must come off).
	now := metav1.Now()
	cur.DeletionTimestamp = &now
	if _, err := (Validator{}).ValidateUpdate(context.Background(), old, cur); err != nil {
		t.Errorf("update of a deleting cluster rejected: %v", err)
	}
	if _, err := (Validator{}).ValidateCreate(context.Background(), &corev1.Pod{}); err == nil {
		t.Error("a non-ChimeraCluster object must be an error")
	}
}

func TestSelfManagedCerts(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "vwc"},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "v.storage.chimera.io"}},
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "mwc"},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "chimera-fuse.pods.chimera.io"}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vwc, mwc).Build()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	o := CertOptions{Namespace: "sys", SecretName: "cert", ServiceName: "hook", WebhookName: "vwc", MutatingWebhookName: "mwc",
		CertDir: dir, Now: func() time.Time { return now }}
	ctx := context.Background()
	if err := EnsureCerts(ctx, c, o); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "sys", Name: "cert"}, sec); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "vwc"}, vwc); err != nil {
		t.Fatal(err)
	}
	if string(vwc.Webhooks[0].ClientConfig.CABundle) != string(sec.Data["ca.crt"]) {
		t.Fatal("caBundle is not the Secret's CA")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "mwc"}, mwc); err != nil {
		t.Fatal(err)
	}
	if string(mwc.Webhooks[0].ClientConfig.CABundle) != string(sec.Data["ca.crt"]) {
		t.Fatal("the sidecar injector's caBundle is not the Secret's CA")
	}
	onDisk, _ := os.ReadFile(filepath.Join(dir, "tls.crt"))
	if string(onDisk) != string(sec.Data["tls.crt"]) {
		t.Fatal("tls.crt on disk differs from the Secret")
	}
	ca, _ := parseCert(sec.Data["ca.crt"])
	leaf, _ := parseCert(onDisk)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "hook.sys.svc", Roots: pool, CurrentTime: now}); err != nil {
		t.Fatalf("serving cert does not verify for hook.sys.svc: %v", err)
	}

	// Valid material is reused (a second replica must not rotate it).
	if err := EnsureCerts(ctx, c, o); err != nil {
		t.Fatal(err)
	}
	again := &corev1.Secret{}
	_ = c.Get(ctx, types.NamespacedName{Namespace: "sys", Name: "cert"}, again)
	if string(again.Data["tls.crt"]) != string(sec.Data["tls.crt"]) {
		t.Fatal("valid certificate was replaced")
	}
	// Within RenewBefore of expiry it is replaced.
	later := now.Add(ServingValidity - RenewBefore/2)
	o.Now = func() time.Time { return later }
	if err := EnsureCerts(ctx, c, o); err != nil {
		t.Fatal(err)
	}
	_ = c.Get(ctx, types.NamespacedName{Namespace: "sys", Name: "cert"}, again)
	if string(again.Data["tls.crt"]) == string(sec.Data["tls.crt"]) {
		t.Fatal("certificate near expiry was not renewed")
	}
	// Garbage in the Secret is replaced, not served.
	again.Data["tls.crt"] = []byte("garbage")
	_ = c.Update(ctx, again)
	if err := EnsureCerts(ctx, c, o); err != nil {
		t.Fatal(err)
	}
	_ = c.Get(ctx, types.NamespacedName{Namespace: "sys", Name: "cert"}, again)
	if _, err := parseCert(again.Data["tls.crt"]); err != nil {
		t.Fatal("corrupt certificate was kept")
	}
	// The Secret is owned by the webhook configuration, so deleting the
	// configuration (helm uninstall) lets the garbage collector remove it.
	if refs := again.OwnerReferences; len(refs) != 1 || refs[0].Kind != "ValidatingWebhookConfiguration" || refs[0].Name != "vwc" {
		t.Fatalf("cert Secret owner references: %+v", refs)
	}
	// An extra SAN (webhook reached by URL) that the current certificate
	// lacks forces a new one carrying it; IPs become IP SANs.
	o.ExtraSANs = []string{"127.0.0.1", "hook.example"}
	if err := EnsureCerts(ctx, c, o); err != nil {
		t.Fatal(err)
	}
	_ = c.Get(ctx, types.NamespacedName{Namespace: "sys", Name: "cert"}, again)
	leaf, err := parseCert(again.Data["tls.crt"])
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"127.0.0.1", "hook.example", "hook.sys.svc"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("serving cert lacks %s: %v", h, err)
		}
	}
}
