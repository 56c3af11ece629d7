package driver

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
)

// nodeServer mounts volumes with the kernel NFS client (CSI spec, "Node Service
// RPC"): NodeStageVolume makes one NFSv4.1 mount per volume per node at the
// staging path; NodePublishVolume bind-mounts it into each pod.
type nodeServer struct {
	csi.UnimplementedNodeServer
	d *Driver

	// published records each volume's publish targets, to refuse a second
	// target for SINGLE_NODE_SINGLE_WRITER (ReadWriteOncePod) as the spec asks.
	// It is rebuilt by publish retries after a plugin restart.
	mu        sync.Mutex
	published map[string]map[string]bool
	// handoffs: sidecar volumes (by target path) whose descriptor waits for
	// the pod's chimera-fuse to connect (sidecar.go).
	handoffs map[string]*handoff
}

func (s *nodeServer) targets(volumeID string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.published == nil {
		s.published = map[string]map[string]bool{}
	}
	if s.published[volumeID] == nil {
		s.published[volumeID] = map[string]bool{}
	}
	return s.published[volumeID]
}

func (s *nodeServer) setPublished(volumeID, target string, on bool) {
	t := s.targets(volumeID)
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		t[target] = true
		return
	}
	delete(t, target)
	if len(t) == 0 {
		delete(s.published, volumeID)
	}
}

// otherTarget returns a target other than target the volume is published at.
func (s *nodeServer) otherTarget(volumeID, target string) string {
	t := s.targets(volumeID)
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range t {
		if p != target {
			return p
		}
	}
	return ""
}

// mountState is what a path looks like before we touch it.
type mountState int

const (
	pathMissing mountState = iota
	pathNotMounted
	pathMounted
	// pathCorrupted: a mount whose server went away or restarted (ESTALE,
	// ENOTCONN, EIO): it must be unmounted before it can be used again.
	pathCorrupted
)

func (s *nodeServer) state(path string) (mountState, error) {
	notMnt, err := s.d.cfg.Mounter.IsLikelyNotMountPoint(path)
	switch {
	case err == nil && notMnt:
		return pathNotMounted, nil
	case err == nil:
		return pathMounted, nil
	case errors.Is(err, os.ErrNotExist):
		return pathMissing, nil
	case mount.IsCorruptedMnt(err):
		return pathCorrupted, nil
	}
	return 0, status.Errorf(codes.Internal, "inspect %s: %v", path, err)
}

// prepare makes path ready to be a mount target: it recovers a corrupted mount
// by unmounting it and creates the directory. It returns true when path is
// already a healthy mount (the call is a retry).
func (s *nodeServer) prepare(path string) (mounted bool, err error) {
	st, err := s.state(path)
	if err != nil {
		return false, err
	}
	switch st {
	case pathMounted:
		return true, nil
	case pathCorrupted:
		klog.Warningf("%s is a stale mount; unmounting it to mount again", path)
		if err := s.d.cfg.Mounter.Unmount(path); err != nil {
			return false, status.Errorf(codes.Internal, "unmount stale mount %s: %v", path, err)
		}
	case pathMissing:
		if err := os.MkdirAll(path, 0o750); err != nil {
			return false, status.Errorf(codes.Internal, "create %s: %v", path, err)
		}
	}
	return false, nil
}

// checkVolumePath validates volume_path of NodeGetVolumeStats/NodeExpandVolume:
// the spec names NotFound for a path that holds no volume, relative ones included.
func checkVolumePath(p string) error {
	if p == "" {
		return status.Error(codes.InvalidArgument, "volume_path: missing in request")
	}
	if !filepath.IsAbs(p) {
		return status.Errorf(codes.NotFound, "volume_path %q: no volume there (not an absolute path)", p)
	}
	return nil
}

func checkPath(field, p string) error {
	if p == "" {
		return status.Errorf(codes.InvalidArgument, "%s: missing in request", field)
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p && filepath.Clean(p)+"/" != p {
		return status.Errorf(codes.InvalidArgument, "%s: %q must be an absolute, clean path", field, p)
	}
	return nil
}

func (s *nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: missing in request")
	}
	if err := checkPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if err := checkCapability(req.GetVolumeCapability(), "volume_capability"); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	spec, err := parseVolumeContext(req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	if spec.sidecar {
		// Nothing to stage: each publish mounts /dev/fuse for its pod's sidecar.
		return &csi.NodeStageVolumeResponse{}, checkSidecarCapability(req.GetVolumeCapability().GetMount().GetMountFlags())
	}
	// A readOnly class's volume is read-only at the server: mount it so.
	readOnly := readOnlyMode(req.GetVolumeCapability().GetAccessMode().GetMode()) || spec.readOnly
	opts, err := buildMountOptions(spec, req.GetVolumeCapability().GetMount().GetMountFlags(), readOnly)
	if err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer release()
	return &csi.NodeStageVolumeResponse{}, s.stage(spec, opts, req.GetStagingTargetPath())
}

// stage mounts the volume at path unless a healthy mount is already there.
func (s *nodeServer) stage(spec *mountSpec, opts []string, path string) error {
	mounted, err := s.prepare(path)
	if err != nil || mounted {
		return err
	}
	if err := s.probe(spec); err != nil {
		return err
	}
	if err := s.d.cfg.Mounter.Mount(spec.source(), path, "nfs", opts); err != nil {
		return status.Errorf(codes.Internal, "mount %s at %s: %v", spec.source(), path, err)
	}
	return nil
}

// serverProbeTimeout bounds the reachability probe before a mount.
const serverProbeTimeout = 10 * time.Second

// probe connects to the volume's NFS server before mounting. The kernel
// client retries an unreachable server for minutes and the kubelet then
// reports only a deadline; a volume whose ChimeraCluster is gone (or not up
// yet) gets this error instead, at once and naming the server.
//
// RDMA volumes are probed on the same server's TCP NFS port: this process
// cannot speak RDMA CM, and chimerad serves NFS over TCP on 2049 beside its
// RDMA port (the TCP fallback), so a server that answers there is up. The
// mount itself still uses proto=rdma on the volume's port.
func (s *nodeServer) probe(spec *mountSpec) error {
	port := spec.port
	if spec.transport == TransportRDMA {
		port = NFSPortTCPDefault
	}
	addr := net.JoinHostPort(spec.server, strconv.Itoa(port))
	ctx, cancel := context.WithTimeout(context.Background(), serverProbeTimeout)
	defer cancel()
	c, err := s.d.cfg.Dial(ctx, "tcp", addr)
	if err != nil {
		if spec.transport == TransportRDMA {
			return status.Errorf(codes.Unavailable,
				"the RDMA volume's NFS server %s, probed on its TCP port %d (the TCP fallback beside RDMA port %d), does not answer (%v): its ChimeraCluster may have been deleted or be down; no mount was attempted",
				spec.server, port, spec.port, err)
		}
		return status.Errorf(codes.Unavailable,
			"the volume's NFS server %s does not answer (%v): its ChimeraCluster may have been deleted or be down; no mount was attempted", addr, err)
	}
	_ = c.Close()
	return nil
}

func (s *nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: missing in request")
	}
	if err := checkPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer release()
	return &csi.NodeUnstageVolumeResponse{}, s.unmount(req.GetStagingTargetPath())
}

// unmount removes a mount (healthy or stale) and its directory; an absent path
// or an unmounted directory is success, so retries are safe.
func (s *nodeServer) unmount(path string) error {
	st, err := s.state(path)
	if err != nil {
		return err
	}
	if st == pathCorrupted {
		// A stale mount cannot be inspected further; unmount it blind.
		if err := s.d.cfg.Mounter.Unmount(path); err != nil {
			return status.Errorf(codes.Internal, "unmount stale mount %s: %v", path, err)
		}
	}
	if err := mount.CleanupMountPoint(path, s.d.cfg.Mounter, true); err != nil {
		return status.Errorf(codes.Internal, "unmount %s: %v", path, err)
	}
	return nil
}

func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: missing in request")
	}
	if err := checkPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if err := checkPath("target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	if err := checkCapability(req.GetVolumeCapability(), "volume_capability"); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	release, err := s.d.locks.acquire(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer release()

	if _, ok := req.GetVolumeContext()[CtxMountMode]; ok {
		spec, err := parseVolumeContext(req.GetVolumeContext())
		if err != nil {
			return nil, err
		}
		if spec.sidecar {
			return s.publishSidecarVolume(req, spec)
		}
	}
	staged, err := s.state(req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	switch staged {
	case pathMissing, pathNotMounted:
		return nil, status.Errorf(codes.FailedPrecondition, "staging_target_path %s is not mounted: NodeStageVolume must succeed first", req.GetStagingTargetPath())
	case pathCorrupted:
		// The server restarted under us (ESTALE/ENOTCONN): mount the staging
		// path again from the volume context so the pod gets a working volume.
		spec, err := parseVolumeContext(req.GetVolumeContext())
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "staging mount %s is stale and cannot be recovered: %v", req.GetStagingTargetPath(), status.Convert(err).Message())
		}
		readOnly := readOnlyMode(req.GetVolumeCapability().GetAccessMode().GetMode()) || spec.readOnly
		opts, err := buildMountOptions(spec, req.GetVolumeCapability().GetMount().GetMountFlags(), readOnly)
		if err != nil {
			return nil, err
		}
		if err := s.stage(spec, opts, req.GetStagingTargetPath()); err != nil {
			return nil, err
		}
	}

	if err := s.checkSingleWriter(req); err != nil {
		return nil, err
	}
	mounted, err := s.prepare(req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	if mounted {
		s.setPublished(req.GetVolumeId(), req.GetTargetPath(), true)
		return &csi.NodePublishVolumeResponse{}, nil
	}
	opts := []string{"bind"}
	if req.GetReadonly() || readOnlyMode(req.GetVolumeCapability().GetAccessMode().GetMode()) || req.GetVolumeContext()[CtxReadOnly] == "true" {
		opts = append(opts, "ro")
	}
	if err := s.d.cfg.Mounter.Mount(req.GetStagingTargetPath(), req.GetTargetPath(), "", opts); err != nil {
		return nil, status.Errorf(codes.Internal, "bind mount %s at %s: %v", req.GetStagingTargetPath(), req.GetTargetPath(), err)
	}
	s.setPublished(req.GetVolumeId(), req.GetTargetPath(), true)
	return &csi.NodePublishVolumeResponse{}, nil
}

// checkSingleWriter refuses a second target for SINGLE_NODE_SINGLE_WRITER.
func (s *nodeServer) checkSingleWriter(req *csi.NodePublishVolumeRequest) error {
	if req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		if other := s.otherTarget(req.GetVolumeId(), req.GetTargetPath()); other != "" {
			return status.Errorf(codes.FailedPrecondition, "volume %s has access mode SINGLE_NODE_SINGLE_WRITER and is already published at %s", req.GetVolumeId(), other)
		}
	}
	return nil
}

// publishSidecarVolume is NodePublishVolume for mountMode sidecar (sidecar.go):
// no staging mount, /dev/fuse mounted at the target for the pod's chimera-fuse.
func (s *nodeServer) publishSidecarVolume(req *csi.NodePublishVolumeRequest, spec *mountSpec) (*csi.NodePublishVolumeResponse, error) {
	if err := checkSidecarCapability(req.GetVolumeCapability().GetMount().GetMountFlags()); err != nil {
		return nil, err
	}
	if err := s.checkSingleWriter(req); err != nil {
		return nil, err
	}
	readOnly := req.GetReadonly() || readOnlyMode(req.GetVolumeCapability().GetAccessMode().GetMode()) || spec.readOnly
	if err := s.publishSidecar(req.GetVolumeId(), req.GetTargetPath(), spec, req.GetVolumeContext()[CtxPodUID], readOnly); err != nil {
		return nil, err
	}
	s.setPublished(req.GetVolumeId(), req.GetTargetPath(), true)
	return &csi.NodePublishVolumeResponse{}, nil
}

func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: missing in request")
	}
	if err := checkPath("target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer release()
	if ok, err := s.unpublishSidecar(req.GetTargetPath()); err != nil {
		return nil, err
	} else if !ok {
		if err := s.unmount(req.GetTargetPath()); err != nil {
			return nil, err
		}
	}
	s.setPublished(req.GetVolumeId(), req.GetTargetPath(), false)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (s *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: missing in request")
	}
	if err := checkVolumePath(req.GetVolumePath()); err != nil {
		return nil, err
	}
	if sp := req.GetStagingTargetPath(); sp != "" {
		if err := checkPath("staging_target_path", sp); err != nil {
			return nil, err
		}
	}
	st, err := s.state(req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	switch st {
	case pathMissing:
		return nil, status.Errorf(codes.NotFound, "volume_path %s does not exist", req.GetVolumePath())
	case pathNotMounted:
		return nil, status.Errorf(codes.NotFound, "volume_path %s is not a mounted volume", req.GetVolumePath())
	case pathCorrupted:
		// The spec's Go bindings (v1.13) carry no VolumeCondition message, so the
		// abnormal condition is reported as an error the kubelet logs and surfaces.
		return nil, status.Errorf(codes.FailedPrecondition, "volume_path %s: abnormal: stale NFS mount (server unreachable or restarted); it is remounted on the next NodePublishVolume", req.GetVolumePath())
	}
	var fs unix.Statfs_t
	if err := s.d.cfg.Statfs(req.GetVolumePath(), &fs); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume_path %s: abnormal: statfs: %v", req.GetVolumePath(), err)
	}
	bsize := fs.Bsize
	if fs.Frsize > 0 {
		bsize = fs.Frsize
	}
	total, avail := int64(fs.Blocks)*bsize, int64(fs.Bavail)*bsize
	used := int64(fs.Blocks-fs.Bfree) * bsize
	return &csi.NodeGetVolumeStatsResponse{
		Usage: []*csi.VolumeUsage{
			{Unit: csi.VolumeUsage_BYTES, Total: total, Used: used, Available: avail},
			{Unit: csi.VolumeUsage_INODES, Total: int64(fs.Files), Used: int64(fs.Files - fs.Ffree), Available: int64(fs.Ffree)},
		},
	}, nil
}

// NodeExpandVolume has nothing to do: the capacity is a quota on the server
// and statfs through the mount already reports the new size.
func (s *nodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: missing in request")
	}
	if err := checkVolumePath(req.GetVolumePath()); err != nil {
		return nil, err
	}
	if vc := req.GetVolumeCapability(); vc != nil {
		if err := checkCapability(vc, "volume_capability"); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	want, err := capacityFor(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	st, err := s.state(req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	if st == pathMissing || st == pathNotMounted {
		return nil, status.Errorf(codes.NotFound, "volume_path %s is not a mounted volume", req.GetVolumePath())
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: want}, nil
}

func (s *nodeServer) NodeGetCapabilities(ctx context.Context, req *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

func (s *nodeServer) NodeGetInfo(ctx context.Context, req *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             s.d.cfg.NodeID,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{TopologyKeyNode: s.d.cfg.NodeID}},
	}, nil
}
