package render

// Proves the pure builders produce the children, pod security and chimerad
// config a ChimeraCluster asks for, that storage addresses are read from the
// Multus annotation (and hostile annotations are rejected with a reason), and
// that status conditions progress as servers become ready. When $CHIMERAD
// names a chimerad binary, every rendered config must pass its --check-config.

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func i32(v int32) *int32 { return &v }

func smallCluster() *chimerav1.ChimeraCluster {
	return &chimerav1.ChimeraCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: "storage", Generation: 3},
		Spec: chimerav1.ChimeraClusterSpec{
			Image:       "chimera/chimerad:dev",
			DataServers: chimerav1.DataServersSpec{Mode: chimerav1.DataServerModeStatefulSet, Count: i32(2)},
			Storage:     chimerav1.StorageSpec{Backend: chimerav1.BackendMemFS, MemfsCapacityBytes: 256 << 20},
		},
	}
}

func productionCluster() *chimerav1.ChimeraCluster {
	c := smallCluster()
	c.Name = "prod"
	hp := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{"hugepages-1Gi": resource.MustParse("16Gi"), "memory": resource.MustParse("8Gi"), "cpu": resource.MustParse("40")},
		Limits:   corev1.ResourceList{"hugepages-1Gi": resource.MustParse("16Gi"), "memory": resource.MustParse("8Gi"), "cpu": resource.MustParse("40")},
	}
	c.Spec.MetadataServer.Resources = hp
	c.Spec.DataServers.Resources = hp
	c.Spec.DataServers.NodeSelector = map[string]string{"chimera.io/storage": "true"}
	c.Spec.Storage = chimerav1.StorageSpec{Backend: chimerav1.BackendNVMe, NVMe: &chimerav1.NVMeSpec{ResourceName: "chimera.io/nvme", DevicesPerPod: 16}}
	c.Spec.MetadataServer.Storage = &chimerav1.MetadataStorageSpec{StorageClassName: "fast-local", Size: resource.MustParse("100Gi")}
	c.Spec.Network = chimerav1.NetworkSpec{Transport: chimerav1.TransportRDMA, Port: 20049, TOS: i32(104), NetworkAttachment: "roce-a", RDMAResourceName: "rdma/roce_a"}
	c.Spec.PNFS = chimerav1.PNFSSpec{StripeUnitBytes: 512 << 10, Mirrors: 1}
	c.Spec.Tuning = chimerav1.TuningSpec{Threads: 64, PinCores: true, HugePageSize: "1Gi"}
	return c
}

func TestBuildCreatesExactlyTheExpectedChildren(t *testing.T) {
	ch, err := Build(smallCluster(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range ch.Objects() {
		got = append(got, o.GetName())
		if o.GetNamespace() != "storage" {
			t.Errorf("%s: namespace %q, want storage", o.GetName(), o.GetNamespace())
		}
		if o.GetLabels()[LabelCluster] != "small" {
			t.Errorf("%s: missing cluster label", o.GetName())
		}
	}
	want := "small-config small-mds small-ds small-mds small-ds small-mds small-ds"
	if strings.Join(got, " ") != want {
		t.Fatalf("children %q, want %q", strings.Join(got, " "), want)
	}
	if ch.DSDaemonSet != nil || *ch.DSStatefulSet.Spec.Replicas != 2 || *ch.MDS.Spec.Replicas != 1 {
		t.Fatalf("want a 2-replica DS StatefulSet and a 1-replica MDS")
	}
	if ch.MDSService.Spec.ClusterIP != corev1.ClusterIPNone || ch.MDS.Spec.ServiceName != "small-mds" {
		t.Fatalf("MDS must sit behind its headless service")
	}
}

func TestBuildDaemonSetMode(t *testing.T) {
	c := smallCluster()
	c.Spec.DataServers.Mode = chimerav1.DataServerModeDaemonSet
	c.Spec.DataServers.Count = nil
	ch, err := Build(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ch.DSStatefulSet != nil || ch.DSDaemonSet == nil {
		t.Fatal("DaemonSet mode must build a DaemonSet and no DS StatefulSet")
	}
	if len(ch.Objects()) != 7 {
		t.Fatalf("%d objects, want 7", len(ch.Objects()))
	}
}

func TestPodsGetOnlyTheNeededPrivileges(t *testing.T) {
	ch, err := Build(productionCluster(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range []corev1.PodTemplateSpec{ch.MDS.Spec.Template, ch.DSStatefulSet.Spec.Template} {
		ctr := pod.Spec.Containers[0]
		sc := ctr.SecurityContext
		if sc.Privileged != nil && *sc.Privileged {
			t.Error("device-plugin NVMe must not make the pod privileged")
		}
		isDS := pod.Labels[LabelComponent] == ComponentDS
		wantCaps := "IPC_LOCK,NET_BIND_SERVICE"
		if isDS {
			wantCaps += ",SYS_RAWIO" // VFIO access to the NVMe devices
		}
		if strings.Join(capStrings(sc.Capabilities.Add), ",") != wantCaps || capStrings(sc.Capabilities.Drop)[0] != "ALL" {
			t.Errorf("capabilities add %v drop %v, want add %s", sc.Capabilities.Add, sc.Capabilities.Drop, wantCaps)
		}
		if pod.Annotations[AnnotationNetworks] != "roce-a" {
			t.Errorf("networks annotation %q", pod.Annotations[AnnotationNetworks])
		}
		// Only DSes take NVMe devices (they are exclusive; the MDS would
		// starve the DS on its node).
		if q, ok := ctr.Resources.Limits["chimera.io/nvme"]; isDS && q.Value() != 16 || !isDS && ok {
			t.Errorf("%s: nvme limit %v (present %v), want 16 on the DS only", pod.Labels[LabelComponent], q.String(), ok)
		}
		if q := ctr.Resources.Requests["rdma/roce_a"]; q.Value() != 1 {
			t.Errorf("rdma request %v, want 1", q.String())
		}
		if !hasVolume(pod, "hugepages", func(v corev1.Volume) bool { return v.EmptyDir != nil && v.EmptyDir.Medium == "HugePages-1Gi" }) {
			t.Error("missing HugePages-1Gi emptyDir")
		}
		if hasVolume(pod, "vfio", nil) {
			t.Error("device-plugin mode must not mount host /dev/vfio")
		}
		if ctr.ReadinessProbe == nil || ctr.LivenessProbe == nil || ctr.LivenessProbe.HTTPGet.Path != "/healthz" {
			t.Error("probes missing")
		} else if l := ctr.LivenessProbe; l.TimeoutSeconds < 5 || l.PeriodSeconds*l.FailureThreshold < 60 {
			// A restart loses a memfs server's data: only a server silent for
			// a minute is dead, not a slow one.
			t.Errorf("liveness probe kills after %d × %d s (timeout %d s); want ≥ 60 s, timeout ≥ 5 s", l.FailureThreshold, l.PeriodSeconds, l.TimeoutSeconds)
		}
	}
	if got := ch.DSStatefulSet.Spec.Template.Spec.NodeSelector["chimera.io/storage"]; got != "true" {
		t.Errorf("DS nodeSelector lost: %q", got)
	}
	if p := ch.MDS.Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet; p == nil || p.Path != "/readyz" {
		t.Error("MDS readiness must probe /readyz")
	}
}

func TestPCIAddressModeIsPrivilegedWithHostVFIO(t *testing.T) {
	c := productionCluster()
	c.Spec.Storage.NVMe = &chimerav1.NVMeSpec{PCIAddresses: []chimerav1.PCIAddress{"0000:3b:00.0"}}
	ch, err := Build(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := ch.DSStatefulSet.Spec.Template
	sc := pod.Spec.Containers[0].SecurityContext
	if sc.Privileged == nil || !*sc.Privileged || sc.AllowPrivilegeEscalation != nil {
		t.Error("PCI-address mode needs a privileged container (device cgroup) without allowPrivilegeEscalation=false")
	}
	if !hasVolume(pod, "vfio", func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == "/dev/vfio" }) {
		t.Error("PCI-address mode must mount host /dev/vfio")
	}
	if _, ok := pod.Spec.Containers[0].Resources.Limits["chimera.io/nvme"]; ok {
		t.Error("PCI-address mode must not request a device-plugin resource")
	}
}

func TestConfigRendering(t *testing.T) {
	mds, err := RenderConfig(productionCluster(), ComponentMDS, nil)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]map[string]any
	if err := json.Unmarshal(mds, &m); err != nil {
		t.Fatal(err)
	}
	srv := m["server"]
	if srv["role"] != "mds" || srv["cores"] != 64.0 || srv["pin_cores"] != true || srv["rdma"] != true || srv["rdma_port"] != 20049.0 || srv["nfs_port"] != 2049.0 {
		t.Errorf("server section %v", srv)
	}
	pnfs := srv["pnfs"].(map[string]any)
	if pnfs["stripe_unit_bytes"] != 524288.0 || pnfs["mirrors"] != 1.0 || pnfs["enabled"] != true {
		t.Errorf("pnfs section %v", pnfs)
	}
	if m["admin"]["token_file"] != "/etc/chimera/admin/token" {
		t.Errorf("admin section %v", m["admin"])
	}
	ds, _ := RenderConfig(smallCluster(), ComponentDS, nil)
	var d map[string]map[string]any
	_ = json.Unmarshal(ds, &d)
	if d["server"]["role"] != "ds" || d["server"]["pnfs"] != nil || d["admin"] != nil || d["server"]["pin_cores"] != nil {
		t.Errorf("DS config must have role ds, no pnfs, no admin: %s", ds)
	}
	if d["mounts"]["data"].(map[string]any)["capacity_bytes"] != float64(256<<20) {
		t.Errorf("memfs capacity not rendered: %s", ds)
	}
	if _, err := RenderConfig(smallCluster(), "both", nil); err == nil {
		t.Error("unknown role must be an error")
	}
	again, _ := RenderConfig(productionCluster(), ComponentMDS, nil)
	if string(again) != string(mds) {
		t.Error("rendering is not deterministic")
	}
}

// TestConfigRDMAKeys: transport rdma renders server.rdma, server.rdma_port
// (the client port, beside nfs_port 2049, the TCP fallback) and
// common.rdmacm_tos from spec.network.tos, in both roles; rdma_hostname is
// left to chimerad's default (server.bind, every RDMA device). Transport tcp
// renders rdma false and neither rdma_port nor rdmacm_tos.
func TestConfigRDMAKeys(t *testing.T) {
	noTOS := productionCluster()
	noTOS.Spec.Network.TOS = nil
	defPort := productionCluster()
	defPort.Spec.Network.Port = 0
	cases := map[string]struct {
		c        *chimerav1.ChimeraCluster
		rdma     bool
		rdmaPort any // nil: absent
		tos      any // nil: absent
	}{
		"rdma with tos":     {productionCluster(), true, 20049.0, 104.0},
		"rdma without tos":  {noTOS, true, 20049.0, nil},
		"rdma default port": {defPort, true, float64(PortRDMADefault), 104.0},
		"tcp":               {smallCluster(), false, nil, nil},
	}
	for name, tc := range cases {
		for _, role := range []string{ComponentMDS, ComponentDS} {
			raw, err := RenderConfig(tc.c, role, nil)
			if err != nil {
				t.Fatalf("%s %s: %v", name, role, err)
			}
			var m map[string]map[string]any
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			srv, common := m["server"], m["common"]
			if srv["rdma"] != tc.rdma {
				t.Errorf("%s %s: server.rdma = %v, want %v", name, role, srv["rdma"], tc.rdma)
			}
			if v, ok := srv["rdma_port"]; (tc.rdmaPort == nil) == ok || (ok && v != tc.rdmaPort) {
				t.Errorf("%s %s: server.rdma_port = %v (present %v), want %v", name, role, v, ok, tc.rdmaPort)
			}
			if v, ok := common["rdmacm_tos"]; (tc.tos == nil) == ok || (ok && v != tc.tos) {
				t.Errorf("%s %s: common.rdmacm_tos = %v (present %v), want %v", name, role, v, ok, tc.tos)
			}
			if srv["nfs_port"] != float64(PortNFSDefault) {
				t.Errorf("%s %s: server.nfs_port = %v, want the TCP port %d", name, role, srv["nfs_port"], PortNFSDefault)
			}
			if _, ok := srv["rdma_hostname"]; ok {
				t.Errorf("%s %s: server.rdma_hostname must be left to chimerad's default (server.bind): %s", name, role, raw)
			}
		}
	}
}

// TestRenderedConfigPassesChimerad runs the real chimerad --check-config over
// the configs of memfs clusters (tcp and rdma, tuned and not) and of backend
// nvme clusters whose devices are static (PCI addresses, block devices; the
// device-plugin template is completed and checked in TestStartScript), the
// MDS's with export client rules of every kind.
func TestRenderedConfigPassesChimerad(t *testing.T) {
	bin := os.Getenv("CHIMERAD")
	if bin == "" {
		if os.Getenv("CHIMERA_REQUIRE_CHIMERAD") != "" {
			t.Fatal("CHIMERA_REQUIRE_CHIMERAD is set but CHIMERAD is not")
		}
		t.Skip("CHIMERAD not set; `make test-operator` sets it")
	}
	rdma := productionCluster()
	rdma.Spec.Storage = chimerav1.StorageSpec{Backend: chimerav1.BackendMemFS}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("c2VjcmV0LXRva2Vu\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pci := durableCluster()
	pci.Spec.Storage.NVMe = &chimerav1.NVMeSpec{PCIAddresses: []chimerav1.PCIAddress{"0000:3b:00.0", "0000:5e:00.0"}}
	pci.Spec.Storage.Diskfs.Initialize = true
	blk := durableCluster()
	blk.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/dev/nvme0n1", "/dev/disk/by-id/nvme-a"}}
	uid := int64(1000)
	blk.Spec.Access = []chimerav1.AccessRule{
		{Clients: []string{"10.9.0.7"}, Access: chimerav1.AccessNone},
		{Clients: []string{"192.168.0.0/16", "fd00::/8"}, Access: chimerav1.AccessRO, Squash: chimerav1.SquashAll, AnonUID: &uid, AnonGID: &uid},
		{Clients: []string{"*"}, Access: chimerav1.AccessRW, Squash: chimerav1.SquashRoot},
	}
	blk.Spec.Network.PodNetworkCIDRs = []string{"10.244.0.0/16"}
	for name, c := range map[string]*chimerav1.ChimeraCluster{"small": smallCluster(), "rdma-tuned": rdma, "nvme-pci": pci, "nvme-block-access": blk} {
		access, err := ExportAccess(c, []string{"10.0.0.1", "10.0.0.2", "fd00::1"})
		if err != nil {
			t.Fatal(err)
		}
		for _, role := range []string{ComponentMDS, ComponentDS} {
			cfg, err := RenderConfig(c, role, access)
			if err != nil {
				t.Fatal(err)
			}
			// In the pod the admin Secret is mounted at the token path; here
			// a temp file stands in for it (chimerad reads it at check time).
			cfg = withTestSecrets(t, dir, cfg)
			f := filepath.Join(dir, name+"-"+role+".json")
			if err := os.WriteFile(f, cfg, 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "--check-config", "--config", f).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "OK") {
				t.Errorf("%s %s: chimerad rejected the config: %v\n%s\n%s", name, role, err, out, cfg)
			}
		}
	}
	// The check must be able to fail: a key chimerad does not know is rejected.
	bad := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(bad, []byte(`{"server":{"no_such_key":1}}`), 0o600)
	if out, err := exec.Command(bin, "--check-config", "--config", bad).CombinedOutput(); err == nil {
		t.Errorf("chimerad accepted an unknown key: %s", out)
	}
}

func TestStorageAddress(t *testing.T) {
	pod := func(ann string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ds-0", Annotations: map[string]string{}}, Status: corev1.PodStatus{PodIP: "10.244.0.7"}}
		if ann != "" {
			p.Annotations[AnnotationNetworkStatus] = ann
		}
		return p
	}
	status := `[{"name":"kindnet","interface":"eth0","ips":["10.244.0.7"],"default":true},{"name":"storage/roce-a","interface":"net1","ips":["192.168.50.11","fd00::11"]}]`
	if a, err := StorageAddress(pod(status), "roce-a", "storage"); err != nil || a != "192.168.50.11" {
		t.Errorf("got %q, %v", a, err)
	}
	if a, err := StorageAddress(pod(status), "storage/roce-a", "other"); err != nil || a != "192.168.50.11" {
		t.Errorf("qualified name: got %q, %v", a, err)
	}
	if a, err := StorageAddress(pod(""), "", "storage"); err != nil || a != "10.244.0.7" {
		t.Errorf("no Multus: got %q, %v", a, err)
	}
	for name, tc := range map[string]struct{ ann, want string }{
		"missing":  {"", "no k8s.v1.cni.cncf.io/network-status annotation"},
		"not json": {"{oops", "not a JSON list"},
		"no match": {`[{"name":"storage/other","ips":["1.2.3.4"]}]`, `no IP for network "storage/roce-a"`},
		"no ips":   {`[{"name":"storage/roce-a","ips":[]}]`, "no IP"},
		"oversize": {"[" + strings.Repeat(" ", NetworkStatusBytesMax) + "]", "more than"},
	} {
		_, err := StorageAddress(pod(tc.ann), "roce-a", "storage")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to mention %q", name, err, tc.want)
		}
	}
}

func readyPod(name, node, ip string, ready bool) corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

func TestStatusProgression(t *testing.T) {
	c := smallCluster()
	now := metav1.Now()
	cond := func(st chimerav1.ChimeraClusterStatus, t string) *metav1.Condition {
		return meta.FindStatusCondition(st.Conditions, t)
	}

	st := Status(c, Observed{DSDesired: 2}, now)
	if st.Phase != chimerav1.PhasePending || cond(st, "Available").Status != metav1.ConditionFalse || cond(st, "Progressing").Status != metav1.ConditionTrue {
		t.Fatalf("nothing running: phase %s conditions %+v", st.Phase, st.Conditions)
	}
	if st.ObservedGeneration != 3 || cond(st, "Available").ObservedGeneration != 3 {
		t.Error("observedGeneration not set")
	}
	c.Status = st

	pods := []corev1.Pod{readyPod("small-ds-1", "n2", "10.0.0.2", true), readyPod("small-ds-0", "n1", "10.0.0.1", false)}
	st = Status(c, Observed{MDSReady: true, DSPods: pods, DSDesired: 2, DSListInSync: true}, now)
	if st.Phase != chimerav1.PhaseDegraded || cond(st, "Available").Status != metav1.ConditionTrue || cond(st, "Degraded").Reason != "DataServersNotReady" {
		t.Fatalf("one DS down: phase %s conditions %+v", st.Phase, st.Conditions)
	}
	if st.DataServers[0].Pod != "small-ds-0" || st.DataServers[0].Ready || st.DataServers[1].StorageAddress != "10.0.0.2" || st.DataServersReady != 1 {
		t.Errorf("per-DS status %+v", st.DataServers)
	}
	c.Status = st

	pods[1] = readyPod("small-ds-0", "n1", "10.0.0.1", true)
	st = Status(c, Observed{MDSReady: true, DSPods: pods, DSDesired: 2, DSListInSync: true}, now)
	if st.Phase != chimerav1.PhaseAvailable || cond(st, "Progressing").Status != metav1.ConditionFalse || cond(st, "Degraded").Status != metav1.ConditionFalse {
		t.Fatalf("all ready: phase %s conditions %+v", st.Phase, st.Conditions)
	}

	st = Status(c, Observed{MDSReady: true, DSPods: pods, DSDesired: 2, PushErr: errors.New("401 unauthorized")}, now)
	if cond(st, "Degraded").Reason != "DataServerPushFailed" || !strings.Contains(cond(st, "Degraded").Message, "401") || cond(st, "Available").Status != metav1.ConditionFalse {
		t.Fatalf("push failure must degrade and name the error: %+v", st.Conditions)
	}
	// The data servers are known but the export rules did not reach the MDS:
	// usable, yet degraded with the reason (clients may be refused or let in).
	st = Status(c, Observed{MDSReady: true, DSPods: pods, DSDesired: 2, DSListInSync: true, AccessErr: errors.New("HTTP 400: access[0].clients[0]: bad")}, now)
	if st.Phase != chimerav1.PhaseDegraded || cond(st, "Degraded").Reason != "AccessPushFailed" || !strings.Contains(cond(st, "Degraded").Message, "export client rules") ||
		cond(st, "Available").Status != metav1.ConditionTrue {
		t.Fatalf("access push failure: phase %s conditions %+v", st.Phase, st.Conditions)
	}
	list := DSList(c, Status(c, Observed{MDSReady: true, DSPods: pods, DSDesired: 2, DSListInSync: true}, now).DataServers, "")
	if len(list) != 2 || list[0].Name != "small-ds-0" || list[0].Address != "10.0.0.1" || list[0].Port != 2049 || list[0].Transport != "tcp" {
		t.Errorf("DS list %+v", list)
	}
}

func capStrings(cs []corev1.Capability) []string {
	var out []string
	for _, c := range cs {
		out = append(out, string(c))
	}
	return out
}

func hasVolume(p corev1.PodTemplateSpec, name string, check func(corev1.Volume) bool) bool {
	for _, v := range p.Spec.Volumes {
		if v.Name == name {
			return check == nil || check(v)
		}
	}
	return false
}

var _ = appsv1.StatefulSet{}
