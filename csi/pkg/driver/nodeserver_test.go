package driver

// Proves the node service's mount logic without mounting (a fake mounter
// records what would be mounted): stage makes exactly one NFSv4.1 mount with
// the options from the volume context; publish bind-mounts it, read-only when
// asked; every call is idempotent; unpublish/unstage succeed on paths already
// gone; a stale (ESTALE/ENOTCONN) mount is detected, reported by
// NodeGetVolumeStats, and replaced by publish; a volume whose server does not
// answer fails staging with Unavailable before any mount; bad arguments get
// InvalidArgument naming the field. Real kernel mounts are proven in the QEMU guest (e2e/guest).

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"
)

type nodeFixture struct {
	ns      *nodeServer
	m       *mount.FakeMounter
	staging string
	target  string
	ctx     map[string]string
	// down lists the server addresses the fake probe cannot reach; dialed
	// records every probe.
	down   map[string]bool
	dialed []string
}

func newNode(t *testing.T) *nodeFixture {
	m := mount.NewFakeMounter(nil)
	m.MountCheckErrors = map[string]error{}
	f := &nodeFixture{m: m, down: map[string]bool{}}
	d, err := New(Config{Mode: ModeNode, NodeID: "node-a", Mounter: m, Statfs: func(path string, st *unix.Statfs_t) error {
		// A 64 MiB quota with 16 MiB used, as the server reports it.
		*st = unix.Statfs_t{Bsize: 4096, Frsize: 4096, Blocks: 16384, Bfree: 12288, Bavail: 12288, Files: 1000, Ffree: 990}
		return nil
	}, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		f.dialed = append(f.dialed, network+" "+addr)
		if f.down[addr] {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connect: no route to host")}
		}
		a, b := net.Pipe()
		_ = b.Close()
		return a, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	*f = nodeFixture{
		ns: &nodeServer{d: d}, m: m, down: f.down,
		staging: filepath.Join(dir, "globalmount"),
		target:  filepath.Join(dir, "pods", "p1", "mount"),
		ctx: map[string]string{CtxServer: "10.0.2.2", CtxPort: "2049", CtxExportPath: "/memfs/volumes/v1",
			CtxTransport: "tcp", CtxNConnect: "2"},
	}
	return f
}

func capMode(mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func (f *nodeFixture) stage(t *testing.T) error {
	_, err := f.ns.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId: "vol1", StagingTargetPath: f.staging, VolumeContext: f.ctx,
		VolumeCapability: capMode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "hard"),
	})
	return err
}

func (f *nodeFixture) publish(t *testing.T, readonly bool) error {
	_, err := f.ns.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId: "vol1", StagingTargetPath: f.staging, TargetPath: f.target, VolumeContext: f.ctx, Readonly: readonly,
		VolumeCapability: capMode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "hard"),
	})
	return err
}

func (f *nodeFixture) mountAt(path string) *mount.MountPoint {
	for _, mp := range f.m.MountPoints {
		if mp.Path == path {
			return &mp
		}
	}
	return nil
}

func TestNodeStagePublishUnpublishUnstage(t *testing.T) {
	f := newNode(t)
	ctx := context.Background()
	for i := 0; i < 2; i++ { // the second call is a retry and must change nothing
		if err := f.stage(t); err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
	}
	mp := f.mountAt(f.staging)
	if mp == nil || mp.Type != "nfs" || mp.Device != "10.0.2.2:/memfs/volumes/v1" {
		t.Fatalf("staging mount %+v", mp)
	}
	if want := []string{"vers=4.1", "proto=tcp", "port=2049", "nconnect=2", "hard"}; !reflect.DeepEqual(mp.Opts, want) {
		t.Fatalf("staging options %q, want %q", mp.Opts, want)
	}
	for i := 0; i < 2; i++ {
		if err := f.publish(t, true); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	tp := f.mountAt(f.target)
	if tp == nil || tp.Device != "10.0.2.2:/memfs/volumes/v1" || !reflect.DeepEqual(tp.Opts, []string{"bind", "ro"}) {
		t.Fatalf("target mount %+v", tp)
	}
	if len(f.m.MountPoints) != 2 {
		t.Fatalf("retries mounted again: %d mounts", len(f.m.MountPoints))
	}

	stats, err := f.ns.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol1", VolumePath: f.target})
	if err != nil {
		t.Fatal(err)
	}
	if u := stats.Usage[0]; u.Unit != csi.VolumeUsage_BYTES || u.Total != 64<<20 || u.Used != 16<<20 || u.Available != 48<<20 {
		t.Fatalf("byte usage %+v", u)
	}
	if u := stats.Usage[1]; u.Unit != csi.VolumeUsage_INODES || u.Total != 1000 || u.Used != 10 {
		t.Fatalf("inode usage %+v", u)
	}

	for i := 0; i < 2; i++ {
		if _, err := f.ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol1", TargetPath: f.target}); err != nil {
			t.Fatalf("unpublish %d: %v", i, err)
		}
		if _, err := f.ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol1", StagingTargetPath: f.staging}); err != nil {
			t.Fatalf("unstage %d: %v", i, err)
		}
	}
	if len(f.m.MountPoints) != 0 {
		t.Fatalf("mounts left: %+v", f.m.MountPoints)
	}
	if _, err := os.Stat(f.target); !os.IsNotExist(err) {
		t.Fatalf("target dir left behind: %v", err)
	}
}

// A readOnly class's volume (volume context readOnly=true) is mounted ro at
// staging and at the target even when the pod asked for read-write.
func TestNodeMountsReadOnlyVolumesRo(t *testing.T) {
	f := newNode(t)
	f.ctx[CtxReadOnly] = "true"
	if err := f.stage(t); err != nil {
		t.Fatal(err)
	}
	if want := []string{"vers=4.1", "proto=tcp", "port=2049", "nconnect=2", "hard", "ro"}; !reflect.DeepEqual(f.mountAt(f.staging).Opts, want) {
		t.Fatalf("staging options %q, want %q", f.mountAt(f.staging).Opts, want)
	}
	if err := f.publish(t, false); err != nil {
		t.Fatal(err)
	}
	if tp := f.mountAt(f.target); tp == nil || !reflect.DeepEqual(tp.Opts, []string{"bind", "ro"}) {
		t.Fatalf("target mount %+v", tp)
	}
	// Without the key (or "false") a read-write publish stays read-write.
	g := newNode(t)
	g.ctx[CtxReadOnly] = "false"
	if err := g.stage(t); err != nil {
		t.Fatal(err)
	}
	if err := g.publish(t, false); err != nil {
		t.Fatal(err)
	}
	if tp := g.mountAt(g.target); tp == nil || !reflect.DeepEqual(tp.Opts, []string{"bind"}) {
		t.Fatalf("target mount %+v", tp)
	}
}

func TestNodeStaleMountRecovery(t *testing.T) {
	f := newNode(t)
	ctx := context.Background()
	if err := f.stage(t); err != nil {
		t.Fatal(err)
	}
	if err := f.publish(t, false); err != nil {
		t.Fatal(err)
	}
	// The server restarted: both mounts answer ESTALE.
	f.m.MountCheckErrors[f.staging] = syscall.ESTALE
	f.m.MountCheckErrors[f.target] = syscall.ENOTCONN

	_, err := f.ns.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol1", VolumePath: f.target})
	wantCode(t, err, codes.FailedPrecondition, "abnormal")

	f.m.ResetLog()
	if err := f.publish(t, false); err != nil {
		t.Fatalf("publish over stale mounts: %v", err)
	}
	var actions []string
	for _, a := range f.m.GetLog() {
		actions = append(actions, a.Action+" "+a.Target)
	}
	want := []string{"unmount " + f.staging, "mount " + f.staging, "unmount " + f.target, "mount " + f.target}
	if !reflect.DeepEqual(actions, want) {
		t.Fatalf("recovery actions %q, want %q", actions, want)
	}
	if _, err := f.ns.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol1", VolumePath: f.target}); err != nil {
		t.Fatalf("stats after recovery: %v", err)
	}

	// A stale mount is also removable by unpublish/unstage.
	f.m.MountCheckErrors[f.target] = syscall.ESTALE
	if _, err := f.ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol1", TargetPath: f.target}); err != nil {
		t.Fatalf("unpublish stale: %v", err)
	}
	if f.mountAt(f.target) != nil {
		t.Fatal("stale target still mounted")
	}
}

func TestNodeRejections(t *testing.T) {
	f := newNode(t)
	ctx := context.Background()
	rw := capMode(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

	// Publish before stage is a CO ordering error.
	err := f.publish(t, false)
	wantCode(t, err, codes.FailedPrecondition, "NodeStageVolume")

	_, err = f.ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{StagingTargetPath: f.staging, VolumeCapability: rw, VolumeContext: f.ctx})
	wantCode(t, err, codes.InvalidArgument, "volume_id")
	_, err = f.ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", VolumeCapability: rw, VolumeContext: f.ctx})
	wantCode(t, err, codes.InvalidArgument, "staging_target_path")
	_, err = f.ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "relative/path", VolumeCapability: rw, VolumeContext: f.ctx})
	wantCode(t, err, codes.InvalidArgument, "absolute")
	_, err = f.ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: f.staging, VolumeContext: f.ctx})
	wantCode(t, err, codes.InvalidArgument, "volume_capability")
	_, err = f.ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: f.staging, VolumeCapability: rw, VolumeContext: map[string]string{CtxServer: "x"}})
	wantCode(t, err, codes.InvalidArgument, "volume_context.port")
	_, err = f.ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: f.staging,
		VolumeCapability: capMode(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "vers=3"), VolumeContext: f.ctx})
	wantCode(t, err, codes.InvalidArgument, "mount_flags")
	_, err = f.ns.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "v", StagingTargetPath: f.staging, VolumeCapability: rw})
	wantCode(t, err, codes.InvalidArgument, "target_path")
	_, err = f.ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v"})
	wantCode(t, err, codes.InvalidArgument, "target_path")
	_, err = f.ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{StagingTargetPath: f.staging})
	wantCode(t, err, codes.InvalidArgument, "volume_id")
	_, err = f.ns.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: filepath.Join(f.staging, "missing")})
	wantCode(t, err, codes.NotFound, "does not exist")
	_, err = f.ns.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v"})
	wantCode(t, err, codes.InvalidArgument, "volume_path")
	if len(f.m.MountPoints) != 0 {
		t.Fatalf("rejected calls mounted something: %+v", f.m.MountPoints)
	}

	// Concurrent operations on one volume: the second is Aborted.
	release, err := f.ns.d.locks.acquire("vol1")
	if err != nil {
		t.Fatal(err)
	}
	err = f.stage(t)
	wantCode(t, err, codes.Aborted, "in progress")
	release()
	if err := f.stage(t); err != nil {
		t.Fatalf("stage after release: %v", err)
	}

	// ReadWriteOncePod: a second target for the same volume is refused.
	once := capMode(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	pub := &csi.NodePublishVolumeRequest{VolumeId: "vol1", StagingTargetPath: f.staging, TargetPath: f.target, VolumeCapability: once, VolumeContext: f.ctx}
	if _, err := f.ns.NodePublishVolume(ctx, pub); err != nil {
		t.Fatalf("first single-writer publish: %v", err)
	}
	pub.TargetPath = f.target + "-other"
	_, err = f.ns.NodePublishVolume(ctx, pub)
	wantCode(t, err, codes.FailedPrecondition, "SINGLE_NODE_SINGLE_WRITER")
	if _, err := f.ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol1", TargetPath: f.target}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ns.NodePublishVolume(ctx, pub); err != nil {
		t.Fatalf("single-writer publish after unpublish: %v", err)
	}

	info, err := f.ns.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || info.NodeId != "node-a" || info.AccessibleTopology.Segments[TopologyKeyNode] != "node-a" {
		t.Fatalf("info %v %v", info, err)
	}
	exp, err := f.ns.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol1", VolumePath: f.staging, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
	if err != nil || exp.CapacityBytes != 1<<30 {
		t.Fatalf("expand %v %v", exp, err)
	}
}

// A volume whose server is gone (its ChimeraCluster deleted) fails staging at
// once with Unavailable naming the server, mounts nothing, and another
// volume on a live server still stages and publishes.
func TestNodeStageServerGone(t *testing.T) {
	f := newNode(t)
	f.down["10.0.2.9:2049"] = true
	gone := map[string]string{CtxServer: "10.0.2.9", CtxPort: "2049", CtxExportPath: "/memfs/volumes/old", CtxTransport: "tcp"}
	_, err := f.ns.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId: "vol-gone", StagingTargetPath: f.staging + "-gone", VolumeContext: gone,
		VolumeCapability: capMode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
	})
	wantCode(t, err, codes.Unavailable, "10.0.2.9:2049")
	for _, want := range []string{"10.0.2.9:2049", "no route to host", "ChimeraCluster", "no mount was attempted"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if len(f.m.MountPoints) != 0 {
		t.Fatalf("a mount was made for an unreachable server: %+v", f.m.MountPoints)
	}
	// The lock of the failed volume was released and other volumes work.
	if err := f.stage(t); err != nil {
		t.Fatalf("stage of a live volume after a failed one: %v", err)
	}
	if err := f.publish(t, false); err != nil {
		t.Fatal(err)
	}
	if got := f.dialed; len(got) != 2 || got[0] != "tcp 10.0.2.9:2049" || got[1] != "tcp 10.0.2.2:2049" {
		t.Fatalf("probes %v", got)
	}
	// RDMA volumes are probed on the same server's TCP NFS port (2049, the
	// TCP fallback beside the RDMA port): a server down there fails staging
	// naming both ports, and nothing is mounted.
	rdma := map[string]string{CtxServer: "10.0.2.9", CtxPort: "20049", CtxExportPath: "/memfs/volumes/r", CtxTransport: "rdma"}
	stageRDMA := func() error {
		_, err := f.ns.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
			VolumeId: "vol-rdma", StagingTargetPath: f.staging + "-rdma", VolumeContext: rdma,
			VolumeCapability: capMode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
		})
		return err
	}
	err = stageRDMA()
	wantCode(t, err, codes.Unavailable, "10.0.2.9")
	for _, want := range []string{"RDMA volume", "TCP port 2049", "RDMA port 20049", "no route to host", "no mount was attempted"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if got := f.dialed; len(got) != 3 || got[2] != "tcp 10.0.2.9:2049" {
		t.Fatalf("RDMA probe %v, want tcp 10.0.2.9:2049", got)
	}
	if f.mountAt(f.staging+"-rdma") != nil {
		t.Fatal("a mount was made for an RDMA volume whose server is down")
	}
	// Up on 2049: staged, mounted over RDMA on the volume's port.
	delete(f.down, "10.0.2.9:2049")
	if err := stageRDMA(); err != nil {
		t.Fatal(err)
	}
	if got := f.dialed; len(got) != 4 || got[3] != "tcp 10.0.2.9:2049" {
		t.Fatalf("RDMA probe %v, want tcp 10.0.2.9:2049", got)
	}
	mp := f.mountAt(f.staging + "-rdma")
	if mp == nil || mp.Device != "10.0.2.9:/memfs/volumes/r" || mp.Type != "nfs" {
		t.Fatalf("RDMA mount %+v", mp)
	}
	if want := []string{"vers=4.1", "proto=rdma", "port=20049"}; !reflect.DeepEqual(mp.Opts, want) {
		t.Fatalf("RDMA mount options %q, want %q", mp.Opts, want)
	}
}
