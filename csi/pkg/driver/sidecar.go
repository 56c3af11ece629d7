package driver

// mountMode sidecar on the node (the GCS FUSE CSI driver's pattern): the
// pod carries a chimera-fuse container (injected by the operator's webhook
// for the annotation below) and an emptyDir it shares with us. Publishing
// opens /dev/fuse, mounts it on the target path and hands the descriptor,
// with a JSON description of the volume, to the first connection on a Unix
// socket in that emptyDir; chimera-fuse serves it with no privileges. The
// mount belongs to us: unpublish unmounts it. Once handed over, the mount
// survives a restart of this plugin and dies with the pod.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

const (
	// SidecarAnnotation asks the operator's webhook for the chimera-fuse sidecar.
	SidecarAnnotation = "chimera.io/fuse-sidecar"
	// SidecarVolume is the emptyDir the webhook adds, shared by the sidecar
	// (mounted at /run/chimera-fuse) and this plugin (through the kubelet's
	// pods directory).
	SidecarVolume = "chimera-fuse"
	// fuseType is the file system type of our FUSE mounts ("fuse.<subtype>").
	fuseType = "fuse.chimera-fuse"
	// HandoffWaitDefault bounds how long a published volume waits for its
	// sidecar to connect; then the mount is given up.
	HandoffWaitDefault = 10 * time.Minute
	// KubeletDirDefault is the kubelet's root directory on most distributions.
	KubeletDirDefault = "/var/lib/kubelet"
)

// podUIDChars: a Kubernetes UID (a UUID); anything else must not become a path.
var podUIDChars = regexp.MustCompile(`^[0-9a-f][0-9a-f-]{0,63}$`)

// FuseOps is what sidecar mode does to the kernel; tests replace it.
type FuseOps interface {
	// Open opens /dev/fuse.
	Open() (*os.File, error)
	// Mount mounts the open /dev/fuse descriptor fd at target.
	Mount(fd uintptr, target string, readOnly bool) error
	// Unmount unmounts target, lazily when it is busy; not mounted is success.
	Unmount(target string) error
}

// kernelFuse is FuseOps with the real syscalls.
type kernelFuse struct{}

func (kernelFuse) Open() (*os.File, error) { return os.OpenFile("/dev/fuse", os.O_RDWR, 0) }

func (kernelFuse) Mount(fd uintptr, target string, readOnly bool) error {
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	// rootmode: the root is a directory; user_id/group_id: the mount's
	// owner (root); allow_other: the pod's users are any uid;
	// default_permissions: the kernel checks mode bits.
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions", fd)
	return unix.Mount("chimera-fuse", target, fuseType, flags, data)
}

func (kernelFuse) Unmount(target string) error {
	err := unix.Unmount(target, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(target, unix.MNT_DETACH)
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil // not a mount point (any more)
	}
	return err
}

// sidecarMsg is the JSON chimera-fuse --sidecar-dir receives with the
// descriptor (dataplane/fuse/README.md).
type sidecarMsg struct {
	Server   string `json:"server"`
	Export   string `json:"export"`
	ReadOnly bool   `json:"readOnly"`
	VolumeID string `json:"volumeId"`
}

// handoff is one published volume waiting for its sidecar.
type handoff struct {
	cancel chan struct{} // closed: give up now (unpublish)
	done   chan struct{} // closed when the hand-over ended, either way
}

// sidecarDir is the pod's emptyDir as this plugin sees it.
func (s *nodeServer) sidecarDir(podUID string) string {
	return filepath.Join(s.d.cfg.KubeletDir, "pods", podUID, "volumes", "kubernetes.io~empty-dir", SidecarVolume)
}

// handoffName is the socket directory of one publish: short (Unix socket
// paths are limited) and distinct per volume and target.
func handoffName(volumeID, target string) string {
	h := sha256.Sum256([]byte(volumeID + "\x00" + target))
	return hex.EncodeToString(h[:8])
}

// fuseMounted says whether target is one of our FUSE mounts, from the mount
// table: a stat would wait for a sidecar that has not started yet.
func (s *nodeServer) fuseMounted(target string) (bool, error) {
	mps, err := s.d.cfg.Mounter.List()
	if err != nil {
		return false, status.Errorf(codes.Internal, "list mounts: %v", err)
	}
	for _, mp := range mps {
		if mp.Path == target && mp.Type == fuseType {
			return true, nil
		}
	}
	return false, nil
}

// alreadyPublished says whether a retried publish has nothing to do: target
// is our FUSE mount and either still waits for its sidecar or is served. A
// mount nobody serves any more (the sidecar died, or this plugin restarted
// before handing the descriptor over: ENOTCONN) is unmounted so the caller
// mounts afresh for a sidecar that comes back.
func (s *nodeServer) alreadyPublished(target string) (bool, error) {
	mounted, err := s.fuseMounted(target)
	if err != nil || !mounted {
		return false, err
	}
	s.mu.Lock()
	pending := s.handoffs[target] != nil
	s.mu.Unlock()
	if pending {
		return true, nil // a stat now would wait for the sidecar
	}
	st, err := s.state(target)
	if err != nil || st != pathCorrupted {
		return err == nil, err
	}
	klog.Warningf("%s: FUSE mount no sidecar serves any more; mounting again", target)
	if err := s.d.cfg.Fuse.Unmount(target); err != nil {
		return false, status.Errorf(codes.Internal, "unmount dead FUSE mount %s: %v", target, err)
	}
	return false, nil
}

// publishSidecar mounts /dev/fuse at the target and starts the hand-over.
// The caller holds the volume lock and validated the request.
func (s *nodeServer) publishSidecar(volumeID, target string, spec *mountSpec, podUID string, readOnly bool) error {
	if podUID == "" {
		return status.Errorf(codes.InvalidArgument, "volume_context[%s]: missing; sidecar volumes need the pod's UID (the CSIDriver object must set podInfoOnMount: true)", CtxPodUID)
	}
	if !podUIDChars.MatchString(podUID) {
		return status.Errorf(codes.InvalidArgument, "volume_context[%s]: %q is not a pod UID", CtxPodUID, podUID)
	}
	dir := s.sidecarDir(podUID)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return status.Errorf(codes.FailedPrecondition,
			"volume %s has mountMode sidecar but pod %s has no chimera-fuse sidecar (no emptyDir %q at %s): add the annotation %s: \"true\" to the pod template so the operator's webhook injects it",
			volumeID, podUID, SidecarVolume, dir, SidecarAnnotation)
	}
	if done, err := s.alreadyPublished(target); err != nil || done {
		return err
	}
	if mounted, err := s.prepare(target); err != nil || mounted {
		return err
	}
	msg, err := json.Marshal(sidecarMsg{Server: spec.address(), Export: spec.exportPath, ReadOnly: readOnly, VolumeID: volumeID})
	if err != nil {
		return status.Errorf(codes.Internal, "volume message: %v", err)
	}
	dev, err := s.d.cfg.Fuse.Open()
	if err != nil {
		return status.Errorf(codes.Internal, "open /dev/fuse: %v (is the fuse module loaded on the node?)", err)
	}
	if err := s.d.cfg.Fuse.Mount(dev.Fd(), target, readOnly); err != nil {
		_ = dev.Close()
		return status.Errorf(codes.Internal, "mount /dev/fuse at %s: %v", target, err)
	}
	sockDir := filepath.Join(dir, handoffName(volumeID, target))
	ln, dirFd, err := listenIn(sockDir)
	if err != nil {
		_ = dev.Close()
		if uerr := s.d.cfg.Fuse.Unmount(target); uerr != nil {
			klog.Errorf("unmount %s after a failed publish: %v", target, uerr)
		}
		return status.Errorf(codes.Internal, "socket for the chimera-fuse sidecar in %s: %v", sockDir, err)
	}
	h := &handoff{cancel: make(chan struct{}), done: make(chan struct{})}
	s.mu.Lock()
	if s.handoffs == nil {
		s.handoffs = map[string]*handoff{}
	}
	s.handoffs[target] = h
	s.mu.Unlock()
	go s.handOver(h, volumeID, target, sockDir, dirFd, ln, dev, msg)
	return nil
}

// listenIn creates dir and listens on dir/socket. The path through the
// kubelet's pods directory can exceed a socket address (108 bytes), so the
// bind goes through /proc/self/fd/<dir>; dirFd stays open until cleanup.
func listenIn(dir string) (*net.UnixListener, int, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, -1, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, -1, err
	}
	dirFd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("open %s: %w", dir, err)
	}
	short := fmt.Sprintf("/proc/self/fd/%d/socket", dirFd)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: short, Net: "unix"})
	if err != nil {
		_ = unix.Close(dirFd)
		return nil, -1, err
	}
	ln.SetUnlinkOnClose(false) // the short name dies with dirFd; cleanup unlinks
	// The sidecar's user is not known here; the directory is the pod's own.
	if err := os.Chmod(short, 0o666); err != nil {
		_ = ln.Close()
		_ = unix.Close(dirFd)
		return nil, -1, err
	}
	return ln, dirFd, nil
}

// handOver gives the descriptor and message to the first connection, then
// closes its copy of the descriptor, the listener and the socket. If no
// sidecar connects within the wait, the mount is given up (unmounted); if
// unpublish cancels it, unpublish unmounts.
func (s *nodeServer) handOver(h *handoff, volumeID, target, sockDir string, dirFd int, ln *net.UnixListener, dev *os.File, msg []byte) {
	defer close(h.done)
	defer func() {
		_ = dev.Close()
		_ = ln.Close()
		_ = unix.Unlinkat(dirFd, "socket", 0)
		_ = unix.Close(dirFd)
		_ = os.Remove(sockDir)
		s.mu.Lock()
		if s.handoffs[target] == h {
			delete(s.handoffs, target)
		}
		s.mu.Unlock()
	}()
	_ = ln.SetDeadline(time.Now().Add(s.d.cfg.HandoffWait))
	go func() {
		select {
		case <-h.cancel:
			_ = ln.Close() // wakes Accept
		case <-h.done:
		}
	}()
	c, err := ln.AcceptUnix()
	if err != nil {
		select {
		case <-h.cancel:
			klog.Infof("volume %s at %s: unpublished before the chimera-fuse sidecar connected", volumeID, target)
		default:
			klog.Errorf("volume %s at %s: no chimera-fuse sidecar connected to %s/socket within %v (%v); unmounting",
				volumeID, target, sockDir, s.d.cfg.HandoffWait, err)
			_ = dev.Close() // aborts the FUSE connection, so the unmount cannot hang
			if err := s.d.cfg.Fuse.Unmount(target); err != nil {
				klog.Errorf("unmount %s: %v", target, err)
			}
		}
		return
	}
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := c.WriteMsgUnix(msg, unix.UnixRights(int(dev.Fd())), nil); err != nil {
		klog.Errorf("volume %s at %s: hand-over to the chimera-fuse sidecar: %v", volumeID, target, err)
		return
	}
	klog.Infof("volume %s at %s: /dev/fuse handed to the chimera-fuse sidecar", volumeID, target)
}

// cancelHandoff stops a pending hand-over at target and waits for its cleanup.
func (s *nodeServer) cancelHandoff(target string) {
	s.mu.Lock()
	h := s.handoffs[target]
	delete(s.handoffs, target)
	s.mu.Unlock()
	if h == nil {
		return
	}
	close(h.cancel)
	<-h.done
}

// unpublishSidecar unmounts a FUSE mount at target; ok is false when target
// holds none (then the kernel-mode path handles it).
func (s *nodeServer) unpublishSidecar(target string) (ok bool, err error) {
	s.cancelHandoff(target)
	mounted, err := s.fuseMounted(target)
	if err != nil || !mounted {
		return false, err
	}
	if err := s.d.cfg.Fuse.Unmount(target); err != nil {
		return true, status.Errorf(codes.Internal, "unmount %s: %v", target, err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, status.Errorf(codes.Internal, "remove %s: %v", target, err)
	}
	return true, nil
}

// checkSidecarCapability refuses mount flags: they are kernel NFS options.
func checkSidecarCapability(flags []string) error {
	if len(flags) > 0 {
		return status.Errorf(codes.InvalidArgument, "volume_capability.mount.mount_flags: %q not available with mountMode %s (StorageClass mountOptions are kernel NFS client options)", strings.Join(flags, ","), MountModeSidecar)
	}
	return nil
}
