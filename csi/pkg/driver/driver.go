// Package driver implements the csi.chimera.io CSI services: identity
// (identityserver.go), controller (controllerserver.go, through the chimerad
// admin API) and node (nodeserver.go, kernel NFS mounts through k8s.io/mount-utils;
// sidecar.go, /dev/fuse mounts handed to the pod's chimera-fuse sidecar).
// Every RPC validates its arguments first and answers with the gRPC code the CSI
// spec names; operations on one volume are serialised per volume, never globally.
package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
)

// Mode selects which services one process serves.
type Mode string

const (
	ModeController Mode = "controller"
	ModeNode       Mode = "node"
	ModeAll        Mode = "all"

	// nodeIDBytesMax is the CSI spec's limit on node_id.
	nodeIDBytesMax = 256
	// SecretKeyToken is the key of the admin token in CSI secrets.
	SecretKeyToken = "token"
)

// Config is everything a Driver needs; zero values mean "not configured".
type Config struct {
	Name     string
	Version  string
	NodeID   string
	Endpoint string
	Mode     Mode
	// AdminEndpoint is the default admin API, used by ListVolumes and
	// GetCapacity (which carry no secrets or parameters) and by classes that
	// name no cluster.
	AdminEndpoint string
	// AdminTokenFile holds the token used when a request carries no secret.
	AdminTokenFile string
	// AdminCAFile is the PEM bundle https admin endpoints are verified
	// against (the operator's admin CA); empty: the system's roots.
	AdminCAFile string
	// AdminTLSServerName, when set, is the name every admin server's
	// certificate must carry instead of the endpoint's host (an endpoint
	// reached through a tunnel or proxy; tests).
	AdminTLSServerName string
	// Mounter performs mounts; tests pass mount.FakeMounter.
	Mounter mount.Interface
	// Statfs reads filesystem usage; tests replace it.
	Statfs func(path string, st *unix.Statfs_t) error
	// Dial opens the pre-mount reachability probe to a volume's NFS server
	// (TCP volumes); tests replace it.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// KubeletDir is the kubelet's root directory (sidecar mode finds the
	// pod's emptyDir under <KubeletDir>/pods); default /var/lib/kubelet.
	KubeletDir string
	// Fuse opens and mounts /dev/fuse for sidecar volumes; tests replace it.
	Fuse FuseOps
	// HandoffWait bounds how long a sidecar volume waits for its sidecar.
	HandoffWait time.Duration
}

// Driver holds the services and their shared state.
type Driver struct {
	cfg   Config
	locks *volumeLocks
	srv   *grpc.Server
}

// New validates cfg and builds a Driver.
func New(cfg Config) (*Driver, error) {
	if cfg.Name == "" {
		cfg.Name = DriverName
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	switch cfg.Mode {
	case ModeController, ModeNode, ModeAll:
	case "":
		cfg.Mode = ModeAll
	default:
		return nil, fmt.Errorf("--mode: %q is not one of controller, node, all", cfg.Mode)
	}
	if cfg.Mode != ModeController {
		if cfg.NodeID == "" {
			return nil, errors.New("--nodeid: required in node mode")
		}
		if len(cfg.NodeID) > nodeIDBytesMax {
			return nil, fmt.Errorf("--nodeid: %d bytes, at most %d allowed", len(cfg.NodeID), nodeIDBytesMax)
		}
	}
	if cfg.AdminEndpoint != "" {
		if _, err := parseParameters(nil, cfg.AdminEndpoint); err != nil {
			return nil, fmt.Errorf("--admin-endpoint: %v", status.Convert(err).Message())
		}
	}
	if cfg.Mounter == nil {
		cfg.Mounter = mount.New("")
	}
	if cfg.Statfs == nil {
		cfg.Statfs = unix.Statfs
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	if cfg.KubeletDir == "" {
		cfg.KubeletDir = KubeletDirDefault
	}
	if !filepath.IsAbs(cfg.KubeletDir) {
		return nil, fmt.Errorf("--kubelet-dir: %q is not an absolute path", cfg.KubeletDir)
	}
	if cfg.Fuse == nil {
		cfg.Fuse = kernelFuse{}
	}
	if cfg.HandoffWait <= 0 {
		cfg.HandoffWait = HandoffWaitDefault
	}
	return &Driver{cfg: cfg, locks: newVolumeLocks()}, nil
}

func (d *Driver) hasController() bool { return d.cfg.Mode != ModeNode }
func (d *Driver) hasNode() bool       { return d.cfg.Mode != ModeController }

// Listen opens the endpoint: unix:///path (a stale socket file is removed) or
// tcp://host:port.
func Listen(endpoint string) (net.Listener, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("--endpoint %q: %v", endpoint, err)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			path = u.Opaque
		}
		if path == "" {
			return nil, fmt.Errorf("--endpoint %q: no socket path", endpoint)
		}
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("--endpoint: remove stale socket %s: %v", path, err)
		}
		return net.Listen("unix", path)
	case "tcp":
		return net.Listen("tcp", u.Host)
	default:
		return nil, fmt.Errorf("--endpoint %q: scheme must be unix or tcp", endpoint)
	}
}

// Serve registers the services for the configured mode and serves l until Stop.
func (d *Driver) Serve(l net.Listener) error {
	d.srv = grpc.NewServer(grpc.UnaryInterceptor(logCalls))
	csi.RegisterIdentityServer(d.srv, &identityServer{d: d})
	if d.hasController() {
		csi.RegisterControllerServer(d.srv, &controllerServer{d: d})
	}
	if d.hasNode() {
		csi.RegisterNodeServer(d.srv, &nodeServer{d: d})
	}
	klog.Infof("%s %s serving %s mode on %s", d.cfg.Name, d.cfg.Version, d.cfg.Mode, l.Addr())
	return d.srv.Serve(l)
}

// Stop ends Serve, letting in-flight RPCs finish.
func (d *Driver) Stop() {
	if d.srv != nil {
		d.srv.GracefulStop()
	}
}

// logCalls logs each RPC's method and failure; request bodies are not logged
// because they carry secrets.
func logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if err != nil {
		klog.V(2).Infof("%s: %v", info.FullMethod, err)
	} else {
		klog.V(4).Infof("%s: ok", info.FullMethod)
	}
	return resp, err
}

// volumeLocks serialises operations per volume key; a second concurrent
// operation on the same key gets Aborted, as the CSI spec asks.
type volumeLocks struct {
	mu   sync.Mutex
	busy map[string]bool
}

func newVolumeLocks() *volumeLocks { return &volumeLocks{busy: map[string]bool{}} }

func (l *volumeLocks) acquire(key string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.busy[key] {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %q is already in progress", key)
	}
	l.busy[key] = true
	return func() {
		l.mu.Lock()
		delete(l.busy, key)
		l.mu.Unlock()
	}, nil
}

// accessModeSupported lists the modes an NFS volume serves: all of them, since
// NFS is shared by nature; single-node modes are enforced by the CO.
func accessModeSupported(m csi.VolumeCapability_AccessMode_Mode) bool {
	switch m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		return true
	}
	return false
}

func readOnlyMode(m csi.VolumeCapability_AccessMode_Mode) bool {
	return m == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY ||
		m == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// checkCapability explains why a capability cannot be served, or returns nil.
func checkCapability(c *csi.VolumeCapability, field string) error {
	if c == nil {
		return fmt.Errorf("%s: missing", field)
	}
	if c.GetBlock() != nil {
		return fmt.Errorf("%s.block: block access is not supported, Chimera volumes are file systems", field)
	}
	m := c.GetMount()
	if m == nil {
		return fmt.Errorf("%s.access_type: missing (mount is required)", field)
	}
	switch fs := m.GetFsType(); fs {
	case "", "nfs", "nfs4":
	default:
		return fmt.Errorf("%s.mount.fs_type: %q is not supported (use nfs or leave empty)", field, fs)
	}
	if c.GetAccessMode() == nil {
		return fmt.Errorf("%s.access_mode: missing", field)
	}
	if !accessModeSupported(c.GetAccessMode().GetMode()) {
		return fmt.Errorf("%s.access_mode: %v is not supported", field, c.GetAccessMode().GetMode())
	}
	return nil
}

// checkCapabilities validates a request's capability list.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume_capabilities: missing in request")
	}
	for i, c := range caps {
		if err := checkCapability(c, fmt.Sprintf("volume_capabilities[%d]", i)); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// tokenFrom picks the admin token: the request's secret, else the token file.
func (d *Driver) tokenFrom(secrets map[string]string) (string, error) {
	if t := secrets[SecretKeyToken]; t != "" {
		return strings.TrimSpace(t), nil
	}
	if d.cfg.AdminTokenFile == "" {
		return "", nil
	}
	// Read on every call: a rotated Secret reaches the mounted file without a restart.
	b, err := os.ReadFile(d.cfg.AdminTokenFile)
	if err != nil {
		return "", status.Errorf(codes.FailedPrecondition, "--admin-token-file: %v", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func itoa(i int) string { return strconv.Itoa(i) }

func wrapInt(v int64) *wrapperspb.Int64Value { return wrapperspb.Int64(v) }

// jsonInt reads an integer field of a decoded JSON document.
func jsonInt(doc map[string]any, key string) (int64, bool) {
	f, ok := doc[key].(float64)
	if !ok {
		return 0, false
	}
	return int64(f), true
}
