package driver

// Proves the node plugin and chimera-fuse agree, on this host with the real
// kernel (root, /dev/fuse; make test-csi-sidecar): NodePublishVolume opens
// /dev/fuse and mounts it with the real syscall at two targets of one pod,
// the real `chimera-fuse --sidecar-dir` started afterwards on the pod's
// emptyDir (as the kubelet orders it) takes both descriptors, a file
// written through one target reads back byte for byte through the other
// (two sessions over chimerad, so the data went through the server);
// SIGTERM ends the sidecar with 0 and leaves the mounts to the plugin;
// NodeUnpublishVolume unmounts them (they are dead then: ENOTCONN) and
// removes the targets. Skipped unless $CHIMERA_FUSE and $CHIMERAD name the
// binaries; $CHIMERA_REQUIRE_FUSE turns the skip into a failure.

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/chimera-k8s/chimera/csi/internal/testbackend"
)

func TestSidecarRealFuse(t *testing.T) {
	fuseBin := os.Getenv("CHIMERA_FUSE")
	skip := t.Skipf
	if os.Getenv("CHIMERA_REQUIRE_FUSE") != "" {
		skip = t.Fatalf
	}
	if fuseBin == "" || os.Getenv("CHIMERAD") == "" {
		skip("CHIMERA_FUSE and CHIMERAD name no binaries (make test-csi-sidecar sets them)")
		return
	}
	if os.Geteuid() != 0 {
		skip("needs root (mount(2) of /dev/fuse)")
		return
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		skip("no /dev/fuse: %v", err)
		return
	}
	b := testbackend.Start(t)
	if b.NFSPort == 0 {
		t.Fatal("the backend serves no NFS")
	}

	kubelet := t.TempDir()
	d, err := New(Config{Mode: ModeNode, NodeID: "node-a", KubeletDir: kubelet})
	if err != nil {
		t.Fatal(err)
	}
	ns := &nodeServer{d: d}
	emptyDir := filepath.Join(kubelet, "pods", testPodUID, "volumes", "kubernetes.io~empty-dir", SidecarVolume)
	if err := os.MkdirAll(emptyDir, 0o777); err != nil {
		t.Fatal(err)
	}
	vctx := map[string]string{CtxServer: "127.0.0.1", CtxPort: strconv.Itoa(b.NFSPort), CtxExportPath: "/memfs",
		CtxTransport: TransportTCP, CtxMountMode: MountModeSidecar, CtxPodUID: testPodUID}
	targets := []string{
		filepath.Join(kubelet, "pods", testPodUID, "volumes", "kubernetes.io~csi", "pv-a", "mount"),
		filepath.Join(kubelet, "pods", testPodUID, "volumes", "kubernetes.io~csi", "pv-b", "mount"),
	}
	ctx := context.Background()
	unpublish := func(target string) {
		if _, err := ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol1", TargetPath: target}); err != nil {
			t.Errorf("unpublish %s: %v", target, err)
		}
	}
	var pending []*handoff
	for _, target := range targets {
		_, err := ns.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: "vol1", StagingTargetPath: filepath.Join(kubelet, "globalmount"), TargetPath: target, VolumeContext: vctx,
			VolumeCapability: capMode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
		})
		if err != nil {
			t.Fatalf("publish %s: %v", target, err)
		}
		t.Cleanup(func() { unpublish(target) }) // idempotent: also after the explicit unpublish below
		ns.mu.Lock()
		pending = append(pending, ns.handoffs[target])
		ns.mu.Unlock()
	}

	// The sidecar starts after the volumes are mounted, as in a pod.
	logPath := filepath.Join(t.TempDir(), "chimera-fuse.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	sidecar := exec.Command(fuseBin, "--sidecar-dir", emptyDir)
	sidecar.Stderr = logFile
	if err := sidecar.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sidecar.Wait() }()
	t.Cleanup(func() {
		if sidecar.ProcessState == nil {
			_ = sidecar.Process.Kill()
			<-exited
		}
	})
	for i, h := range pending {
		select {
		case <-h.done:
		case <-time.After(20 * time.Second):
			log, _ := os.ReadFile(logPath)
			t.Fatalf("the sidecar did not take %s within 20 s; its log:\n%s", targets[i], log)
		}
	}

	data := make([]byte, 8<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(targets[0], "through-a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil { // flush: COMMIT to chimerad
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(targets[1], "through-a"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes through the second target, differing from the %d written through the first", len(got), len(data))
	}

	// SIGTERM (the pod's main containers ended): exit 0 at once, mounts kept.
	start := time.Now()
	_ = sidecar.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("sidecar after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sidecar still runs 10 s after SIGTERM")
	}
	t.Logf("sidecar exited 0 %.1f s after SIGTERM", time.Since(start).Seconds())
	for _, target := range targets {
		if mounted, err := ns.fuseMounted(target); err != nil || !mounted {
			t.Fatalf("%s after the sidecar's exit: mounted %v (%v); the plugin owns the mount", target, mounted, err)
		}
	}
	for _, target := range targets {
		unpublish(target)
		if mounted, _ := ns.fuseMounted(target); mounted {
			t.Errorf("%s still mounted after unpublish", target)
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Errorf("%s left after unpublish: %v", target, err)
		}
	}
}
