package driver

// Proves mountMode sidecar on the node without mounting (a fake FuseOps
// records the /dev/fuse mount in the fake mounter and opens a temp file in
// place of /dev/fuse): staging mounts nothing; publish mounts at the target
// and hands the volume's JSON and the very descriptor it mounted to the
// first connection on <pod emptyDir>/<hash>/socket, then removes the socket;
// a retried publish changes nothing, unless the mount is dead (ENOTCONN:
// the sidecar died), which is mounted afresh for a new hand-over; read-only publishes mount read-only;
// unpublish unmounts, also before the sidecar connected (the hand-over is
// cancelled); a sidecar that never connects makes the plugin give the mount
// up after the wait. Rejections: no pod UID, a UID that is no UID, a pod
// without the sidecar's emptyDir (FailedPrecondition naming the annotation),
// mount flags, RDMA / nconnect / mountOptions in a sidecar context. The real
// hand-over to chimera-fuse is proven by dataplane/fuse/test-fuse.sh.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"
)

const testPodUID = "0f3e2a7c-1b2d-4e5f-8a9b-0c1d2e3f4a5b"

// fakeFuse stands in for /dev/fuse and mount(2).
type fakeFuse struct {
	m      *mount.FakeMounter
	dir    string
	opened []string // the temp files handed out as "/dev/fuse"
}

func (f *fakeFuse) Open() (*os.File, error) {
	file, err := os.CreateTemp(f.dir, "fuse-*")
	if err == nil {
		f.opened = append(f.opened, file.Name())
	}
	return file, err
}

func (f *fakeFuse) Mount(fd uintptr, target string, readOnly bool) error {
	opts := []string{fmt.Sprintf("fd=%d", fd)}
	if readOnly {
		opts = append(opts, "ro")
	}
	return f.m.Mount("chimera-fuse", target, fuseType, opts)
}

func (f *fakeFuse) Unmount(target string) error { return f.m.Unmount(target) }

type sidecarFixture struct {
	ns       *nodeServer
	m        *mount.FakeMounter
	fuse     *fakeFuse
	kubelet  string
	target   string
	emptyDir string
	ctx      map[string]string
}

func newSidecarNode(t *testing.T, wait time.Duration) *sidecarFixture {
	m := mount.NewFakeMounter(nil)
	m.MountCheckErrors = map[string]error{}
	dir := t.TempDir()
	ff := &fakeFuse{m: m, dir: t.TempDir()}
	d, err := New(Config{Mode: ModeNode, NodeID: "node-a", Mounter: m, KubeletDir: dir, Fuse: ff, HandoffWait: wait})
	if err != nil {
		t.Fatal(err)
	}
	f := &sidecarFixture{
		ns: &nodeServer{d: d}, m: m, fuse: ff, kubelet: dir,
		target:   filepath.Join(dir, "pods", testPodUID, "volumes", "kubernetes.io~csi", "pv1", "mount"),
		emptyDir: filepath.Join(dir, "pods", testPodUID, "volumes", "kubernetes.io~empty-dir", "chimera-fuse"),
		ctx: map[string]string{CtxServer: "10.0.2.2", CtxPort: "2049", CtxExportPath: "/memfs/volumes/v1",
			CtxTransport: "tcp", CtxMountMode: MountModeSidecar, CtxPodUID: testPodUID},
	}
	if err := os.MkdirAll(f.emptyDir, 0o777); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *sidecarFixture) publish(readonly bool, flags ...string) error {
	_, err := f.ns.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId: "vol1", StagingTargetPath: filepath.Join(f.kubelet, "globalmount"), TargetPath: f.target,
		VolumeContext: f.ctx, Readonly: readonly,
		VolumeCapability: capMode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, flags...),
	})
	return err
}

func (f *sidecarFixture) unpublish(t *testing.T) {
	t.Helper()
	if _, err := f.ns.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "vol1", TargetPath: f.target}); err != nil {
		t.Fatal(err)
	}
}

func (f *sidecarFixture) sockDir() string {
	return filepath.Join(f.emptyDir, handoffName("vol1", f.target))
}

func (f *sidecarFixture) pending(t *testing.T) *handoff {
	t.Helper()
	f.ns.mu.Lock()
	defer f.ns.mu.Unlock()
	h := f.ns.handoffs[f.target]
	if h == nil {
		t.Fatalf("no hand-over pending at %s", f.target)
	}
	return h
}

func (f *sidecarFixture) fuseMounts() []mount.MountPoint {
	var out []mount.MountPoint
	for _, mp := range f.m.MountPoints {
		if mp.Type == fuseType {
			out = append(out, mp)
		}
	}
	return out
}

// takeVolume plays chimera-fuse: connect, read the message and descriptor.
// The socket path is long, so it connects through /proc/self/fd as the
// plugin binds.
func takeVolume(t *testing.T, sockDir string) (sidecarMsg, *os.File) {
	t.Helper()
	dirFd, err := unix.Open(sockDir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatalf("socket directory: %v", err)
	}
	defer unix.Close(dirFd)
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: fmt.Sprintf("/proc/self/fd/%d/socket", dirFd), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(cmsgs) != 1 {
		t.Fatalf("control messages %v %v", cmsgs, err)
	}
	fds, err := unix.ParseUnixRights(&cmsgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("descriptors %v %v", fds, err)
	}
	var msg sidecarMsg
	if err := json.Unmarshal(buf[:n], &msg); err != nil {
		t.Fatalf("message %q: %v", buf[:n], err)
	}
	return msg, os.NewFile(uintptr(fds[0]), "handed")
}

func sameFile(t *testing.T, a *os.File, path string) bool {
	t.Helper()
	fa, err := a.Stat()
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(fa, fb)
}

func TestSidecarStagePublishHandOverUnpublish(t *testing.T) {
	f := newSidecarNode(t, time.Minute)
	staging := filepath.Join(f.kubelet, "globalmount")
	_, err := f.ns.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId: "vol1", StagingTargetPath: staging, VolumeContext: f.ctx,
		VolumeCapability: capMode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
	})
	if err != nil || len(f.m.MountPoints) != 0 {
		t.Fatalf("stage: %v, mounts %+v (want none)", err, f.m.MountPoints)
	}

	if err := f.publish(false); err != nil {
		t.Fatal(err)
	}
	mps := f.fuseMounts()
	if len(mps) != 1 || mps[0].Path != f.target || mps[0].Device != "chimera-fuse" {
		t.Fatalf("fuse mounts %+v", mps)
	}
	h := f.pending(t)
	msg, fd := takeVolume(t, f.sockDir())
	defer fd.Close()
	want := sidecarMsg{Server: "10.0.2.2:2049", Export: "/memfs/volumes/v1", VolumeID: "vol1"}
	if !reflect.DeepEqual(msg, want) {
		t.Fatalf("message %+v, want %+v", msg, want)
	}
	if len(f.fuse.opened) != 1 || !sameFile(t, fd, f.fuse.opened[0]) {
		t.Fatalf("the descriptor handed over is not the one mounted (%v)", f.fuse.opened)
	}
	<-h.done
	if _, err := os.Stat(f.sockDir()); !os.IsNotExist(err) {
		t.Fatalf("socket directory left after the hand-over: %v", err)
	}

	// A retry (kubelet restarted) finds the FUSE mount and changes nothing.
	if err := f.publish(false); err != nil {
		t.Fatal(err)
	}
	if len(f.fuseMounts()) != 1 || len(f.fuse.opened) != 1 {
		t.Fatalf("retry mounted again: %+v", f.fuseMounts())
	}
	if _, err := os.Stat(f.sockDir()); !os.IsNotExist(err) {
		t.Fatalf("retry opened a new socket: %v", err)
	}

	// The sidecar died (the mount answers ENOTCONN): a publish retry mounts
	// afresh and offers the new descriptor on a new socket.
	f.m.MountCheckErrors[f.target] = syscall.ENOTCONN
	if err := f.publish(false); err != nil {
		t.Fatal(err)
	}
	delete(f.m.MountCheckErrors, f.target)
	if len(f.fuseMounts()) != 1 || len(f.fuse.opened) != 2 {
		t.Fatalf("dead mount not replaced: mounts %+v, opened %v", f.fuseMounts(), f.fuse.opened)
	}
	h = f.pending(t)
	_, fd2 := takeVolume(t, f.sockDir())
	defer fd2.Close()
	if !sameFile(t, fd2, f.fuse.opened[1]) {
		t.Fatal("the second hand-over is not the new descriptor")
	}
	<-h.done

	f.unpublish(t)
	if len(f.fuseMounts()) != 0 {
		t.Fatalf("unpublish left %+v", f.fuseMounts())
	}
	if _, err := os.Stat(f.target); !os.IsNotExist(err) {
		t.Fatalf("target left: %v", err)
	}
	f.unpublish(t) // a retry on a gone target is success
}

func TestSidecarReadOnlyAndIPv6(t *testing.T) {
	f := newSidecarNode(t, time.Minute)
	f.ctx[CtxServer] = "fd00::1"
	if err := f.publish(true); err != nil {
		t.Fatal(err)
	}
	if mps := f.fuseMounts(); len(mps) != 1 || !reflect.DeepEqual(mps[0].Opts, []string{mps[0].Opts[0], "ro"}) {
		t.Fatalf("read-only publish mounted %+v", mps)
	}
	h := f.pending(t)
	msg, fd := takeVolume(t, f.sockDir())
	fd.Close()
	if !msg.ReadOnly || msg.Server != "[fd00::1]:2049" {
		t.Fatalf("message %+v", msg)
	}
	<-h.done
	f.unpublish(t)
}

// Unpublished before the sidecar connected: the hand-over is cancelled, the
// socket removed and the mount unmounted.
func TestSidecarUnpublishBeforeHandOver(t *testing.T) {
	f := newSidecarNode(t, time.Minute)
	if err := f.publish(false); err != nil {
		t.Fatal(err)
	}
	h := f.pending(t)
	f.unpublish(t)
	select {
	case <-h.done:
	default:
		t.Fatal("unpublish returned with the hand-over still running")
	}
	if _, err := os.Stat(f.sockDir()); !os.IsNotExist(err) {
		t.Fatalf("socket directory left: %v", err)
	}
	if len(f.fuseMounts()) != 0 {
		t.Fatalf("mount left: %+v", f.fuseMounts())
	}
}

// No sidecar ever connects: after the wait the plugin gives the mount up.
func TestSidecarHandOverTimesOut(t *testing.T) {
	f := newSidecarNode(t, 50*time.Millisecond)
	if err := f.publish(false); err != nil {
		t.Fatal(err)
	}
	h := f.pending(t)
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the hand-over did not give up within 10 s of a 50 ms wait")
	}
	if len(f.fuseMounts()) != 0 {
		t.Fatalf("mount left after the wait: %+v", f.fuseMounts())
	}
	if _, err := os.Stat(f.sockDir()); !os.IsNotExist(err) {
		t.Fatalf("socket directory left: %v", err)
	}
}

func TestSidecarPublishRejections(t *testing.T) {
	cases := []struct {
		name    string
		edit    func(f *sidecarFixture)
		flags   []string
		code    codes.Code
		mention string
	}{
		{"no pod uid", func(f *sidecarFixture) { delete(f.ctx, CtxPodUID) }, nil, codes.InvalidArgument, "podInfoOnMount"},
		{"pod uid is a path", func(f *sidecarFixture) { f.ctx[CtxPodUID] = "../../etc" }, nil, codes.InvalidArgument, "not a pod UID"},
		{"no sidecar in the pod", func(f *sidecarFixture) { _ = os.RemoveAll(f.emptyDir) }, nil, codes.FailedPrecondition, `chimera.io/fuse-sidecar: "true"`},
		{"mount flags", nil, []string{"noatime"}, codes.InvalidArgument, "mount_flags"},
		{"rdma", func(f *sidecarFixture) { f.ctx[CtxTransport] = "rdma" }, nil, codes.InvalidArgument, "volume_context.transport"},
		{"nconnect", func(f *sidecarFixture) { f.ctx[CtxNConnect] = "2" }, nil, codes.InvalidArgument, "volume_context.nconnect"},
		{"mount options", func(f *sidecarFixture) { f.ctx[CtxMountOptions] = "noatime" }, nil, codes.InvalidArgument, "volume_context.mountOptions"},
		{"unknown mode", func(f *sidecarFixture) { f.ctx[CtxMountMode] = "fuse" }, nil, codes.InvalidArgument, "volume_context.mountMode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newSidecarNode(t, time.Minute)
			if c.edit != nil {
				c.edit(f)
			}
			err := f.publish(false, c.flags...)
			wantCode(t, err, c.code, c.mention)
			if len(f.m.MountPoints) != 0 || len(f.fuse.opened) != 0 {
				t.Fatalf("a refused publish mounted %+v / opened %v", f.m.MountPoints, f.fuse.opened)
			}
		})
	}
}
