package render

// Proves backend nvme renders chimerad's diskfs: the DS devices in each of
// the three binding modes (device plugin through the start script, PCI
// addresses, block-device paths), the MDS's image on its metadata volume,
// the pods' command, environment, volumes and privileges; that the start
// script completes the config from the device plugin's variable, refuses
// hostile or missing values, creates and formats the MDS image once and
// never again; and that memfs clusters render as before. When $CHIMERAD
// names a chimerad binary, every completed config passes its --check-config.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/pki"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func durableCluster() *chimerav1.ChimeraCluster {
	c := productionCluster()
	c.Spec.MetadataServer.Storage = &chimerav1.MetadataStorageSpec{StorageClassName: "local-path", Size: resource.MustParse("10Gi")}
	c.Spec.Storage.Diskfs = &chimerav1.DiskfsSpec{BlockCacheBlocks: 4096, InodeCacheInodes: 1024}
	return c
}

type diskfsDoc struct {
	Server struct {
		VFS *struct {
			Diskfs struct {
				Config struct {
					Initialize       bool            `json:"initialize"`
					BlockCacheBlocks int64           `json:"block_cache_blocks"`
					InodeCacheInodes int64           `json:"inode_cache_inodes"`
					Devices          json.RawMessage `json:"devices"`
				} `json:"config"`
			} `json:"diskfs"`
		} `json:"vfs"`
	} `json:"server"`
	Mounts map[string]struct {
		Module string `json:"module"`
	} `json:"mounts"`
}

func parseDiskfs(t *testing.T, cfg []byte) diskfsDoc {
	t.Helper()
	var d diskfsDoc
	if err := json.Unmarshal(cfg, &d); err != nil {
		t.Fatalf("%v\n%s", err, cfg)
	}
	return d
}

// devices returns the config's devices as compact JSON.
func devices(t *testing.T, cfg []byte) string {
	t.Helper()
	d := parseDiskfs(t, cfg)
	if d.Server.VFS == nil {
		t.Fatalf("no server.vfs in %s", cfg)
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	var v any
	_ = json.Unmarshal(d.Server.VFS.Diskfs.Config.Devices, &v)
	_ = enc.Encode(v)
	return strings.TrimSpace(b.String())
}

func env(ctr corev1.Container, name string) string {
	for _, e := range ctr.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func TestDiskfsRendering(t *testing.T) {
	c := durableCluster()
	ch, err := Build(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	mdsCfg, dsCfg := []byte(ch.ConfigMap.Data[ConfigKeyMDS]), []byte(ch.ConfigMap.Data[ConfigKeyDS])
	for role, cfg := range map[string][]byte{"mds": mdsCfg, "ds": dsCfg} {
		d := parseDiskfs(t, cfg)
		if d.Mounts[MountName].Module != "diskfs" || d.Server.VFS == nil {
			t.Fatalf("%s: want mount %q on diskfs with server.vfs.diskfs: %s", role, MountName, cfg)
		}
		dc := d.Server.VFS.Diskfs.Config
		if dc.Initialize || dc.BlockCacheBlocks != 4096 || dc.InodeCacheInodes != 1024 {
			t.Errorf("%s: diskfs config %+v", role, dc)
		}
	}
	// initialize is the DSes' only: the MDS's image is the start script's call.
	ini := durableCluster()
	ini.Spec.Storage.Diskfs.Initialize = true
	iniMDS, _ := RenderConfig(ini, ComponentMDS, nil)
	iniDS, _ := RenderConfig(ini, ComponentDS, nil)
	if parseDiskfs(t, iniMDS).Server.VFS.Diskfs.Config.Initialize || !parseDiskfs(t, iniDS).Server.VFS.Diskfs.Config.Initialize {
		t.Errorf("initialize must reach the DS config only:\n%s\n%s", iniMDS, iniDS)
	}
	if got := devices(t, mdsCfg); got != `[{"path":"/var/lib/chimera/metadata/diskfs.img","type":"io_uring"}]` {
		t.Errorf("MDS devices %s", got)
	}
	if got := devices(t, dsCfg); got != `"@PCIDEVICES@"` {
		t.Errorf("device-plugin DS devices %s, want the placeholder", got)
	}
	if ch.ConfigMap.Data[ConfigKeyStart] != StartScript {
		t.Error("ConfigMap lacks the start script")
	}

	// The MDS: its metadata claim, retained, mounted; started by the script.
	mds := ch.MDS.Spec
	if len(mds.VolumeClaimTemplates) != 1 {
		t.Fatalf("MDS claims %+v", mds.VolumeClaimTemplates)
	}
	claim := mds.VolumeClaimTemplates[0]
	if claim.Name != MetadataClaimName || *claim.Spec.StorageClassName != "local-path" || claim.Spec.Resources.Requests.Storage().String() != "10Gi" ||
		*claim.Spec.VolumeMode != corev1.PersistentVolumeFilesystem {
		t.Errorf("metadata claim %+v", claim)
	}
	if p := mds.PersistentVolumeClaimRetentionPolicy; p == nil || p.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
		t.Errorf("metadata claim must be retained on deletion: %+v", p)
	}
	mctr := mds.Template.Spec.Containers[0]
	if strings.Join(mctr.Command, " ") != "/bin/sh /etc/chimera/config/start.sh" ||
		strings.Join(mctr.Args, " ") != "/etc/chimera/config/mds.json /run/chimera/mds.json" {
		t.Errorf("MDS command %v args %v", mctr.Command, mctr.Args)
	}
	if env(mctr, EnvImageFile) != MetadataImagePath || env(mctr, EnvImageBytes) != "9663676416" { // 90 % of 10Gi, whole MiB
		t.Errorf("MDS env %+v", mctr.Env)
	}
	mounted := map[string]string{}
	for _, m := range mctr.VolumeMounts {
		mounted[m.Name] = m.MountPath
	}
	if mounted[MetadataClaimName] != MetadataDir || mounted["run"] != RunDir {
		t.Errorf("MDS mounts %v", mounted)
	}
	if _, ok := mctr.Resources.Limits["chimera.io/nvme"]; ok {
		t.Error("the MDS must not take NVMe devices")
	}

	// The DS: the device plugin's variable named for the script.
	dctr := ch.DSStatefulSet.Spec.Template.Spec.Containers[0]
	if env(dctr, EnvPCIDeviceVar) != "PCIDEVICE_CHIMERA_IO_NVME" || env(dctr, EnvImageFile) != "" {
		t.Errorf("DS env %+v", dctr.Env)
	}
	if len(ch.DSStatefulSet.Spec.VolumeClaimTemplates) != 0 {
		t.Error("DSes have no metadata claim")
	}

	// PCI addresses and block devices are written into the config as is.
	pci := durableCluster()
	pci.Spec.Storage.NVMe = &chimerav1.NVMeSpec{PCIAddresses: []chimerav1.PCIAddress{"0000:3b:00.0", "0000:5e:00.0"}}
	cfg, _ := RenderConfig(pci, ComponentDS, nil)
	if got := devices(t, cfg); got != `[{"path":"0000:3b:00.0","type":"vfio"},{"path":"0000:5e:00.0","type":"vfio"}]` {
		t.Errorf("PCI devices %s", got)
	}
	blk := durableCluster()
	blk.Spec.Storage.NVMe = &chimerav1.NVMeSpec{DevicePaths: []chimerav1.DevicePath{"/dev/nvme0n1", "/dev/nvme1n1"}}
	cfg, _ = RenderConfig(blk, ComponentDS, nil)
	if got := devices(t, cfg); got != `[{"path":"/dev/nvme0n1","type":"io_uring"},{"path":"/dev/nvme1n1","type":"io_uring"}]` {
		t.Errorf("block devices %s", got)
	}
	bch, err := Build(blk, nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := bch.DSStatefulSet.Spec.Template
	bctr := pod.Spec.Containers[0]
	if !hasVolume(pod, "block-1", func(v corev1.Volume) bool {
		return v.HostPath != nil && v.HostPath.Path == "/dev/nvme1n1" && *v.HostPath.Type == corev1.HostPathBlockDev
	}) {
		t.Error("block device not mounted from the host as a BlockDevice hostPath")
	}
	if sc := bctr.SecurityContext; sc.Privileged == nil || !*sc.Privileged || strings.Contains(strings.Join(capStrings(sc.Capabilities.Add), ","), "SYS_RAWIO") {
		t.Errorf("block devices need a privileged container (device cgroup) and no SYS_RAWIO: %+v", sc)
	}
	if env(bctr, EnvPCIDeviceVar) != "" {
		t.Error("no device-plugin variable without a device plugin")
	}

	// A volume of its own per DS: the claim template (retained), mounted,
	// the image file as the device, formatted by the script while blank;
	// no host device, so no privilege and no SYS_RAWIO.
	vc := durableCluster()
	vc.Spec.Storage.NVMe = &chimerav1.NVMeSpec{VolumeClaim: &chimerav1.DataVolumeClaimSpec{StorageClassName: "e2e-local", Size: resource.MustParse("2Gi")}}
	vc.Spec.Storage.Diskfs.Initialize = true
	cfg, _ = RenderConfig(vc, ComponentDS, nil)
	if got := devices(t, cfg); got != `[{"path":"/var/lib/chimera/data/diskfs.img","type":"io_uring"}]` {
		t.Errorf("volume-claim DS devices %s", got)
	}
	if parseDiskfs(t, cfg).Server.VFS.Diskfs.Config.Initialize {
		t.Error("a DS image is formatted by the start script (while blank), never by initialize")
	}
	vch, err := Build(vc, nil)
	if err != nil {
		t.Fatal(err)
	}
	dss := vch.DSStatefulSet.Spec
	if len(dss.VolumeClaimTemplates) != 1 || dss.VolumeClaimTemplates[0].Name != DataClaimName || *dss.VolumeClaimTemplates[0].Spec.StorageClassName != "e2e-local" ||
		dss.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String() != "2Gi" {
		t.Fatalf("DS claims %+v", dss.VolumeClaimTemplates)
	}
	if p := dss.PersistentVolumeClaimRetentionPolicy; p == nil || p.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
		t.Errorf("data claims must be retained on deletion: %+v", p)
	}
	vctr := dss.Template.Spec.Containers[0]
	vm := map[string]string{}
	for _, m := range vctr.VolumeMounts {
		vm[m.Name] = m.MountPath
	}
	if vm[DataClaimName] != DataDir || env(vctr, EnvImageFile) != DataImagePath || env(vctr, EnvImageBytes) != "1932525568" || env(vctr, EnvPCIDeviceVar) != "" {
		t.Errorf("volume-claim DS mounts %v env %+v", vm, vctr.Env)
	}
	if sc := vctr.SecurityContext; sc.Privileged != nil || strings.Contains(strings.Join(capStrings(sc.Capabilities.Add), ","), "SYS_RAWIO") {
		t.Errorf("an image file on a volume needs no privilege: %+v", sc)
	}
	if len(vch.MDS.Spec.VolumeClaimTemplates) != 1 || vch.MDS.Spec.VolumeClaimTemplates[0].Name != MetadataClaimName {
		t.Errorf("the MDS keeps only its metadata claim: %+v", vch.MDS.Spec.VolumeClaimTemplates)
	}

	// Never an MDS without its metadata volume (admission refuses it too).
	bare := durableCluster()
	bare.Spec.MetadataServer.Storage = nil
	if _, err := Build(bare, nil); err == nil || !strings.Contains(err.Error(), "spec.metadataServer.storage") {
		t.Errorf("backend nvme without a metadata volume rendered: %v", err)
	}

	// memfs stays as it was: chimerad straight on the ConfigMap's file.
	sm, err := Build(smallCluster(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sctr := sm.MDS.Spec.Template.Spec.Containers[0]
	if sctr.Command != nil || strings.Join(sctr.Args, " ") != "--config /etc/chimera/config/mds.json" || len(sctr.Env) != 0 ||
		sm.ConfigMap.Data[ConfigKeyStart] != "" || len(sm.MDS.Spec.VolumeClaimTemplates) != 0 || strings.Contains(sm.ConfigMap.Data[ConfigKeyDS], "diskfs") {
		t.Errorf("memfs cluster changed: command %v args %v env %v", sctr.Command, sctr.Args, sctr.Env)
	}
}

func TestPCIDeviceEnv(t *testing.T) {
	for in, want := range map[string]string{
		"chimera.io/nvme":          "PCIDEVICE_CHIMERA_IO_NVME",
		"intel.com/nvme-vfio_pool": "PCIDEVICE_INTEL_COM_NVME_VFIO_POOL",
	} {
		if got := PCIDeviceEnv(in); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	if MetadataImageBytes(resource.MustParse("1Gi")) != 921<<20 { // 921.6 MiB, rounded down
		t.Errorf("image bytes of 1Gi: %d", MetadataImageBytes(resource.MustParse("1Gi")))
	}
}

// runStart runs StartScript as the pod does, with a stand-in chimerad on
// PATH that copies the config it was given to $dir/started.json.
func runStart(t *testing.T, dir, cfg string, envs ...string) (string, []byte, error) {
	t.Helper()
	bin := filepath.Join(dir, "bin")
	_ = os.MkdirAll(bin, 0o755)
	fake := "#!/bin/sh\n[ \"$1\" = --config ] || exit 9\ncp \"$2\" \"" + filepath.Join(dir, "started.json") + "\"\n"
	if err := os.WriteFile(filepath.Join(bin, "chimerad"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	script, in, out := filepath.Join(dir, "start.sh"), filepath.Join(dir, "in.json"), filepath.Join(dir, "out.json")
	_ = os.WriteFile(script, []byte(StartScript), 0o644)
	_ = os.WriteFile(in, []byte(cfg), 0o644)
	_ = os.Remove(filepath.Join(dir, "started.json"))
	cmd := exec.Command("/bin/sh", script, in, out)
	cmd.Dir = dir // where a glob would find files (the test plants one)
	cmd.Env = append([]string{"PATH=" + bin + ":/usr/bin:/bin"}, envs...)
	msg, err := cmd.CombinedOutput()
	started, _ := os.ReadFile(filepath.Join(dir, "started.json"))
	return string(msg), started, err
}

func TestStartScript(t *testing.T) {
	c := durableCluster()
	dsCfg, _ := RenderConfig(c, ComponentDS, nil)
	mdsCfg, _ := RenderConfig(c, ComponentMDS, nil)
	dir := t.TempDir()
	varEnv := EnvPCIDeviceVar + "=PCIDEVICE_CHIMERA_IO_NVME"

	msg, started, err := runStart(t, dir, string(dsCfg), varEnv, "PCIDEVICE_CHIMERA_IO_NVME=0000:3b:00.0,0000:5e:00.1")
	if err != nil {
		t.Fatalf("start script failed: %v\n%s", err, msg)
	}
	if got := devices(t, started); got != `[{"path":"0000:3b:00.0","type":"vfio"},{"path":"0000:5e:00.1","type":"vfio"}]` {
		t.Errorf("completed devices %s", got)
	}
	checkConfig(t, dir, "ds-plugin", started)

	// Hostile or missing device-plugin values stop the pod before chimerad.
	for name, envs := range map[string][]string{
		"unset":          {varEnv},
		"empty":          {varEnv, "PCIDEVICE_CHIMERA_IO_NVME="},
		"shell":          {varEnv, "PCIDEVICE_CHIMERA_IO_NVME=0000:3b:00.0;reboot"},
		"sed delimiter":  {varEnv, "PCIDEVICE_CHIMERA_IO_NVME=0000:3b:00.0|x"},
		"json":           {varEnv, `PCIDEVICE_CHIMERA_IO_NVME=0000:3b:00.0"},{"type":"io_uring","path":"/etc/passwd`},
		"empty item":     {varEnv, "PCIDEVICE_CHIMERA_IO_NVME=0000:3b:00.0,,0000:5e:00.0"},
		"variable unset": {},
	} {
		msg, started, err := runStart(t, dir, string(dsCfg), envs...)
		if err == nil || started != nil || !strings.Contains(msg, "chimera-start:") {
			t.Errorf("%s: the script did not refuse (err %v, chimerad started %v): %s", name, err, started != nil, msg)
		}
	}

	// The MDS image: created and formatted on first start only.
	img := filepath.Join(dir, "meta", "diskfs.img")
	_ = os.MkdirAll(filepath.Dir(img), 0o755)
	imgEnv := []string{EnvImageFile + "=" + img, EnvImageBytes + "=67108864"}
	msg, started, err = runStart(t, dir, string(mdsCfg), imgEnv...)
	if err != nil {
		t.Fatalf("MDS start failed: %v\n%s", err, msg)
	}
	if fi, err := os.Stat(img); err != nil || fi.Size() != 64<<20 {
		t.Fatalf("image not created at 64 MiB: %v %v", fi, err)
	}
	if !parseDiskfs(t, started).Server.VFS.Diskfs.Config.Initialize {
		t.Errorf("a new image must be formatted (initialize true): %s", started)
	}
	checkConfig(t, dir, "mds-new", started)
	// Blank image left by a start that died before formatting: formatted again.
	if _, started, _ = runStart(t, dir, string(mdsCfg), imgEnv...); !parseDiskfs(t, started).Server.VFS.Diskfs.Config.Initialize {
		t.Error("an image never formatted must be formatted on the next start")
	}
	// Once something was written in its first MiB it is never formatted again
	// nor resized, whatever the size asked.
	f, _ := os.OpenFile(img, os.O_WRONLY, 0)
	_, _ = f.WriteAt([]byte("superblock"), 4096)
	_ = f.Close()
	msg, started, err = runStart(t, dir, string(mdsCfg), EnvImageFile+"="+img, EnvImageBytes+"=1048576")
	if err != nil || parseDiskfs(t, started).Server.VFS.Diskfs.Config.Initialize {
		t.Errorf("a formatted image was initialized again (err %v): %s %s", err, msg, started)
	}
	if fi, _ := os.Stat(img); fi.Size() != 64<<20 {
		t.Errorf("image resized to %d", fi.Size())
	}
	// Something else where the image should be: refused, never formatted.
	odd := filepath.Join(dir, "meta", "a-directory")
	_ = os.MkdirAll(odd, 0o755)
	msg, started, err = runStart(t, dir, string(mdsCfg), EnvImageFile+"="+odd, EnvImageBytes+"=1048576")
	if err == nil || started != nil || !strings.Contains(msg, "not a readable regular file") {
		t.Errorf("a directory as the image: err %v started %v: %s", err, started != nil, msg)
	}
	// A glob in the device plugin's variable is not expanded (set -f) and is refused.
	_ = os.WriteFile(filepath.Join(dir, "0000:3b:00.0"), nil, 0o644)
	if msg, started, err := runStart(t, dir, string(dsCfg), varEnv, "PCIDEVICE_CHIMERA_IO_NVME=0000:3b:00.*"); err == nil || started != nil {
		t.Errorf("a glob was accepted: %s", msg)
	}
	// A missing size for a missing image is an error, not a 0-byte device.
	msg, _, err = runStart(t, dir, string(mdsCfg), EnvImageFile+"="+filepath.Join(dir, "meta", "other.img"))
	if err == nil || !strings.Contains(msg, EnvImageBytes) {
		t.Errorf("missing size accepted: %v %s", err, msg)
	}
}

// checkConfig runs the real chimerad --check-config on a completed config
// when $CHIMERAD is set.
func checkConfig(t *testing.T, dir, name string, cfg []byte) {
	t.Helper()
	bin := os.Getenv("CHIMERAD")
	if bin == "" {
		return
	}
	cfg = withTestSecrets(t, dir, cfg)
	f := filepath.Join(dir, name+".json")
	_ = os.WriteFile(f, cfg, 0o600)
	out, err := exec.Command(bin, "--check-config", "--config", f).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Errorf("%s: chimerad rejected the config: %v\n%s\n%s", name, err, out, cfg)
	}
}

// withTestSecrets points a rendered config's Secret paths (admin token,
// admin TLS certificate and key) at files in dir holding what the operator
// would have put in those Secrets: a token, and a certificate from a fresh
// admin CA.
func withTestSecrets(t *testing.T, dir string, cfg []byte) []byte {
	t.Helper()
	tokenFile := filepath.Join(dir, "token")
	_ = os.WriteFile(tokenFile, []byte("c2VjcmV0LXRva2Vu\n"), 0o600)
	tlsDir := filepath.Join(dir, "admin-tls")
	ca, err := pki.NewCA(pki.CACommonName, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueServer([]string{"small-mds.storage.svc"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_ = os.MkdirAll(tlsDir, 0o700)
	_ = os.WriteFile(filepath.Join(tlsDir, corev1.TLSCertKey), certPEM, 0o600)
	_ = os.WriteFile(filepath.Join(tlsDir, corev1.TLSPrivateKeyKey), keyPEM, 0o600)
	s := strings.ReplaceAll(string(cfg), AdminTokenDir+"/"+SecretKeyToken, tokenFile)
	return []byte(strings.ReplaceAll(s, AdminTLSDir, tlsDir))
}
