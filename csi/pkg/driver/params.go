package driver

// StorageClass parameters, volume ids and volume context: the pure functions that
// turn user input into what the controller asks the admin API for and what the
// node hands to mount(8). Every error names the parameter and the problem.

import (
	"fmt"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimera-k8s/chimera/csi/pkg/adminapi"
)

const (
	// DriverName is the CSI driver name registered with Kubernetes.
	DriverName = "csi.chimera.io"

	// StorageClass parameter keys.
	ParamClusterName      = "clusterName"
	ParamClusterNamespace = "clusterNamespace"
	ParamAdminEndpoint    = "adminEndpoint"
	ParamAdminPort        = "adminPort"
	ParamNFSServer        = "nfsServer"
	ParamNFSPort          = "nfsPort"
	ParamMountMode        = "mountMode"
	ParamTransport        = "transport"
	ParamNConnect         = "nconnect"
	ParamMountOptions     = "mountOptions"
	// ParamReadOnly ("true"/"false") makes every client's access to the
	// volume read-only at the server, and the node mount it ro.
	ParamReadOnly = "readOnly"
	// ParamSquash narrows the export's squash for the volume:
	// root_squash, all_squash or no_root_squash.
	ParamSquash = "squash"
	// ParamAnonymousUID and ParamAnonymousGID: who squashed callers become.
	ParamAnonymousUID = "anonymousUid"
	ParamAnonymousGID = "anonymousGid"

	// Volume context keys: what the node needs to mount a volume.
	CtxServer       = "server"
	CtxPort         = "port"
	CtxExportPath   = "exportPath"
	CtxTransport    = "transport"
	CtxNConnect     = "nconnect"
	CtxMountOptions = "mountOptions"
	// CtxReadOnly is "true" for a readOnly class's volumes: the node mounts
	// them ro (the server refuses writes anyway).
	CtxReadOnly = "readOnly"
	// CtxMountMode is set to "sidecar" for sidecar volumes; absent means kernel.
	CtxMountMode = "mountMode"
	// CtxPodUID is what the kubelet adds to NodePublishVolume's context
	// (CSIDriver podInfoOnMount: true): the pod the volume is published for.
	CtxPodUID = "csi.storage.k8s.io/pod.uid"

	MountModeKernel  = "kernel"
	MountModeSidecar = "sidecar"
	TransportTCP     = "tcp"
	TransportRDMA    = "rdma"

	SquashRoot   = "root_squash"
	SquashAll    = "all_squash"
	SquashNoRoot = "no_root_squash"
	// anonymousIDDefault is chimerad's anonymous uid/gid (nobody).
	anonymousIDDefault = 65534
	// anonymousIDMax: 4294967295 is "no id" to the kernel.
	anonymousIDMax = 4294967294

	// AdminPortDefault is chimerad's admin API port (DESIGN.md).
	AdminPortDefault = 8080
	// NFSPortTCPDefault and NFSPortRDMADefault are the IANA NFS ports (RFC 8166 for RDMA).
	NFSPortTCPDefault  = 2049
	NFSPortRDMADefault = 20049
	// nconnectMax is the Linux NFS client's limit on connections per server.
	nconnectMax = 16
	// mountOptionsCountMax and mountOptionBytesMax bound user-supplied options.
	mountOptionsCountMax = 32
	mountOptionBytesMax  = 256

	// volumeNameBytesMax is the CSI name limit Kubernetes uses (PV names fit).
	volumeNameBytesMax = 128
	// CapacityBytesDefault is given to a volume when the request names no size.
	CapacityBytesDefault = int64(1) << 30
	// CapacityBytesMax bounds a single volume (1 PiB): larger requests are OutOfRange.
	CapacityBytesMax = int64(1) << 50

	// TopologyKeyNode is the topology segment NodeGetInfo reports.
	TopologyKeyNode = "topology.csi.chimera.io/node"

	// volumeIDPrefix versions the volume id format so it can change later.
	volumeIDPrefix = "chimera1"
	volumeIDSep    = "#"
	// paramPrefixReserved marks keys the CO passes through that are not ours.
	paramPrefixReserved = "csi.storage.k8s.io/"
)

var (
	// dnsLabel is an RFC 1123 label, what Kubernetes requires of names and namespaces.
	dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	// volumeNameChars keeps names safe as directory names on the server.
	volumeNameChars = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	// mountOptionChars refuses separators and shell-like characters in options.
	mountOptionChars = regexp.MustCompile(`^[A-Za-z0-9_.:/@=+-]+$`)
	// managedMountOptions are set by the driver from parameters; users must not
	// override them through mountOptions, or the volume context would lie.
	managedMountOptions = map[string]string{
		"vers": ParamMountMode, "nfsvers": ParamMountMode, "proto": ParamTransport,
		"port": ParamNFSPort, "nconnect": ParamNConnect,
	}
	knownParams = map[string]bool{
		ParamClusterName: true, ParamClusterNamespace: true, ParamAdminEndpoint: true, ParamAdminPort: true,
		ParamNFSServer: true, ParamNFSPort: true, ParamMountMode: true, ParamTransport: true,
		ParamNConnect: true, ParamMountOptions: true, ParamReadOnly: true, ParamSquash: true,
		ParamAnonymousUID: true, ParamAnonymousGID: true,
	}
)

// volumeParams is a validated StorageClass parameter set.
type volumeParams struct {
	adminEndpoint string
	server        string
	port          int
	transport     string
	nconnect      int // 0: the kernel's default
	mountOptions  []string
	mountMode     string // kernel | sidecar
	// access is the volume's own rule list sent to the admin API; nil when
	// the class sets none of readOnly, squash, anonymousUid/Gid.
	access []adminapi.AccessRule
	// readOnly: the volume's rule is ro, and the node mounts it ro.
	readOnly bool
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// parseParameters validates StorageClass parameters. defaultEndpoint is the
// controller's --admin-endpoint, used when the class names no cluster.
func parseParameters(params map[string]string, defaultEndpoint string) (*volumeParams, error) {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !knownParams[k] && !strings.HasPrefix(k, paramPrefixReserved) {
			return nil, invalid("parameters: unknown key %q (known: clusterName, clusterNamespace, adminEndpoint, adminPort, nfsServer, nfsPort, mountMode, transport, nconnect, mountOptions, readOnly, squash, anonymousUid, anonymousGid)", k)
		}
	}
	p := &volumeParams{mountMode: MountModeKernel}

	switch mode := params[ParamMountMode]; mode {
	case "", MountModeKernel:
	case MountModeSidecar:
		p.mountMode = MountModeSidecar
	default:
		return nil, invalid("parameters.mountMode: %q is not one of %q, %q", mode, MountModeKernel, MountModeSidecar)
	}

	adminPort := AdminPortDefault
	if s, ok := params[ParamAdminPort]; ok {
		n, err := parsePort(s)
		if err != nil {
			return nil, invalid("parameters.adminPort: %v", err)
		}
		adminPort = n
	}
	name, ns, endpoint := params[ParamClusterName], params[ParamClusterNamespace], params[ParamAdminEndpoint]
	serverHost := ""
	switch {
	case endpoint != "" && (name != "" || ns != ""):
		return nil, invalid("parameters: adminEndpoint and clusterName/clusterNamespace are exclusive; name the cluster or the endpoint, not both")
	case endpoint != "":
		u, err := adminapi.ParseEndpoint(endpoint)
		if err != nil {
			return nil, invalid("parameters.adminEndpoint: %v", err)
		}
		if _, ok := params[ParamAdminPort]; ok {
			return nil, invalid("parameters.adminPort: not allowed with adminEndpoint (put the port in the URL)")
		}
		p.adminEndpoint, serverHost = u.String(), u.Hostname()
	case name != "" || ns != "":
		if !dnsLabel.MatchString(name) {
			return nil, invalid("parameters.clusterName: %q is not a valid Kubernetes name (RFC 1123 label)", name)
		}
		if !dnsLabel.MatchString(ns) {
			return nil, invalid("parameters.clusterNamespace: %q is not a valid Kubernetes namespace (RFC 1123 label)", ns)
		}
		// The operator names the MDS Service <cluster>-mds (see operator/).
		serverHost = fmt.Sprintf("%s-mds.%s.svc", name, ns)
		// The operator's MDS serves its admin API over TLS with a
		// certificate for this Service name.
		p.adminEndpoint = "https://" + net.JoinHostPort(serverHost, strconv.Itoa(adminPort))
	case defaultEndpoint != "":
		u, err := adminapi.ParseEndpoint(defaultEndpoint)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "controller --admin-endpoint: %v", err)
		}
		p.adminEndpoint, serverHost = u.String(), u.Hostname()
	default:
		return nil, invalid("parameters: name the cluster with clusterName and clusterNamespace (or adminEndpoint); the controller has no default --admin-endpoint")
	}

	p.server = serverHost
	if s, ok := params[ParamNFSServer]; ok {
		if err := checkHost(s); err != nil {
			return nil, invalid("parameters.nfsServer: %v", err)
		}
		p.server = s
	}

	switch t := params[ParamTransport]; t {
	case "", TransportTCP:
		p.transport, p.port = TransportTCP, NFSPortTCPDefault
	case TransportRDMA:
		p.transport, p.port = TransportRDMA, NFSPortRDMADefault
	default:
		return nil, invalid("parameters.transport: %q is not one of %q, %q", t, TransportTCP, TransportRDMA)
	}
	if s, ok := params[ParamNFSPort]; ok {
		n, err := parsePort(s)
		if err != nil {
			return nil, invalid("parameters.nfsPort: %v", err)
		}
		p.port = n
	}
	if s, ok := params[ParamNConnect]; ok {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > nconnectMax {
			return nil, invalid("parameters.nconnect: %q must be an integer in 1..%d", s, nconnectMax)
		}
		p.nconnect = n
	}
	if s := params[ParamMountOptions]; s != "" {
		opts, err := splitMountOptions(s)
		if err != nil {
			return nil, invalid("parameters.mountOptions: %v", err)
		}
		p.mountOptions = opts
	}
	if p.mountMode == MountModeSidecar {
		if err := sidecarLimits("parameters", p.transport, params[ParamNConnect], params[ParamMountOptions]); err != nil {
			return nil, err
		}
	}
	if err := p.parseAccess(params); err != nil {
		return nil, err
	}
	return p, nil
}

// parseAccess turns readOnly, squash and anonymousUid/Gid into the volume's
// own rule: every client ("*": the export's rules, which the operator keeps
// to the nodes and pod networks, still decide who gets in at all; a volume
// rule only narrows them), ro or rw, squashed as asked. Squash unset is
// no_root_squash, which narrows nothing: the export's squash stays in force
// (the stricter of the two applies). None of the four set: no rule at all.
func (p *volumeParams) parseAccess(params map[string]string) error {
	set := false
	for _, k := range []string{ParamReadOnly, ParamSquash, ParamAnonymousUID, ParamAnonymousGID} {
		_, ok := params[k]
		set = set || ok
	}
	if !set {
		return nil
	}
	rule := adminapi.AccessRule{Clients: []string{"*"}, AccessType: "rw", Squash: SquashNoRoot, AnonymousUID: anonymousIDDefault, AnonymousGID: anonymousIDDefault}
	if v, ok := params[ParamReadOnly]; ok {
		switch v {
		case "true":
			rule.AccessType, p.readOnly = "ro", true
		case "false":
		default:
			return invalid("parameters.readOnly: %q is not \"true\" or \"false\"", v)
		}
	}
	if sq, ok := params[ParamSquash]; ok {
		switch sq {
		case SquashRoot, SquashAll, SquashNoRoot:
			rule.Squash = sq
		default:
			return invalid("parameters.squash: %q is not one of %q, %q, %q", sq, SquashRoot, SquashAll, SquashNoRoot)
		}
	}
	for _, id := range []struct {
		key string
		to  *uint32
	}{{ParamAnonymousUID, &rule.AnonymousUID}, {ParamAnonymousGID, &rule.AnonymousGID}} {
		s, ok := params[id.key]
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n > anonymousIDMax {
			return invalid("parameters.%s: %q must be an integer in 0..%d", id.key, s, uint64(anonymousIDMax))
		}
		if rule.Squash == SquashNoRoot {
			return invalid("parameters.%s: only with squash %q or %q (with %q nobody becomes the anonymous identity)", id.key, SquashRoot, SquashAll, SquashNoRoot)
		}
		*id.to = uint32(n)
	}
	p.access = []adminapi.AccessRule{rule}
	return nil
}

// sidecarLimits refuses what the kernel NFS client has and chimera-fuse has
// not: RDMA, several connections, NFS mount options.
func sidecarLimits(field, transport, nconnect, mountOptions string) error {
	if transport != TransportTCP {
		return invalid("%s.transport: %q is not available with mountMode %q (chimera-fuse speaks NFS over TCP only)", field, transport, MountModeSidecar)
	}
	if nconnect != "" {
		return invalid("%s.nconnect: not available with mountMode %q (chimera-fuse uses one connection per volume)", field, MountModeSidecar)
	}
	if mountOptions != "" {
		return invalid("%s.mountOptions: not available with mountMode %q (they are kernel NFS client options; chimera-fuse takes none)", field, MountModeSidecar)
	}
	return nil
}

func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%q is not a port number (1..65535)", s)
	}
	return n, nil
}

// checkHost accepts an IP address or a DNS name; anything else would be
// interpreted by mount.nfs in surprising ways.
func checkHost(s string) error {
	if s == "" {
		return fmt.Errorf("empty host")
	}
	if net.ParseIP(s) != nil {
		return nil
	}
	if len(s) > 253 {
		return fmt.Errorf("%q is longer than 253 bytes", s)
	}
	for _, label := range strings.Split(s, ".") {
		if !dnsLabel.MatchString(strings.ToLower(label)) {
			return fmt.Errorf("%q is neither an IP address nor a DNS name", s)
		}
	}
	return nil
}

// splitMountOptions splits a comma-separated option list and checks each option.
func splitMountOptions(s string) ([]string, error) {
	var out []string
	for _, raw := range strings.Split(s, ",") {
		opt := strings.TrimSpace(raw)
		if opt == "" {
			return nil, fmt.Errorf("empty option in %q", s)
		}
		if err := checkMountOption(opt); err != nil {
			return nil, err
		}
		out = append(out, opt)
	}
	if len(out) > mountOptionsCountMax {
		return nil, fmt.Errorf("%d options, at most %d allowed", len(out), mountOptionsCountMax)
	}
	return out, nil
}

func checkMountOption(opt string) error {
	if len(opt) > mountOptionBytesMax {
		return fmt.Errorf("option %.32q... is longer than %d bytes", opt, mountOptionBytesMax)
	}
	if !mountOptionChars.MatchString(opt) {
		return fmt.Errorf("option %q has characters outside [A-Za-z0-9_.:/@=+-]", opt)
	}
	key, _, _ := strings.Cut(opt, "=")
	if param, ok := managedMountOptions[key]; ok {
		return fmt.Errorf("option %q is set by the driver; use the %s parameter instead", opt, param)
	}
	return nil
}

// volumeContext is what CreateVolume hands to the node through the CO.
func (p *volumeParams) volumeContext(exportPath string) map[string]string {
	ctx := map[string]string{
		CtxServer:     p.server,
		CtxPort:       strconv.Itoa(p.port),
		CtxExportPath: exportPath,
		CtxTransport:  p.transport,
	}
	if p.nconnect > 0 {
		ctx[CtxNConnect] = strconv.Itoa(p.nconnect)
	}
	if len(p.mountOptions) > 0 {
		ctx[CtxMountOptions] = strings.Join(p.mountOptions, ",")
	}
	if p.mountMode == MountModeSidecar {
		ctx[CtxMountMode] = MountModeSidecar
	}
	if p.readOnly {
		ctx[CtxReadOnly] = "true"
	}
	return ctx
}

// mountSpec is a validated volume context: everything mount(8) needs.
type mountSpec struct {
	server     string
	port       int
	exportPath string
	transport  string
	nconnect   int
	options    []string
	sidecar    bool // mountMode sidecar: chimera-fuse in the pod, no kernel NFS mount
	readOnly   bool // the volume is read-only at the server: mount it ro
}

// parseVolumeContext validates the context on the node: it crossed the CO and
// may have been written by hand in a static PersistentVolume.
func parseVolumeContext(ctx map[string]string) (*mountSpec, error) {
	m := &mountSpec{}
	if err := checkHost(ctx[CtxServer]); err != nil {
		return nil, invalid("volume_context.server: %v", err)
	}
	m.server = ctx[CtxServer]
	port, err := parsePort(ctx[CtxPort])
	if err != nil {
		return nil, invalid("volume_context.port: %v", err)
	}
	m.port = port
	exp := ctx[CtxExportPath]
	if !strings.HasPrefix(exp, "/") || strings.Contains(exp, "..") || strings.ContainsAny(exp, ", \t\n\x00") {
		return nil, invalid("volume_context.exportPath: %q must be an absolute path without '..', commas or whitespace", exp)
	}
	m.exportPath = exp
	switch t := ctx[CtxTransport]; t {
	case TransportTCP, TransportRDMA:
		m.transport = t
	case "":
		m.transport = TransportTCP
	default:
		return nil, invalid("volume_context.transport: %q is not one of %q, %q", t, TransportTCP, TransportRDMA)
	}
	if s, ok := ctx[CtxNConnect]; ok {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > nconnectMax {
			return nil, invalid("volume_context.nconnect: %q must be an integer in 1..%d", s, nconnectMax)
		}
		m.nconnect = n
	}
	if s := ctx[CtxMountOptions]; s != "" {
		opts, err := splitMountOptions(s)
		if err != nil {
			return nil, invalid("volume_context.mountOptions: %v", err)
		}
		m.options = opts
	}
	switch ro := ctx[CtxReadOnly]; ro {
	case "", "false":
	case "true":
		m.readOnly = true
	default:
		return nil, invalid("volume_context.readOnly: %q is not \"true\" or \"false\"", ro)
	}
	switch mode := ctx[CtxMountMode]; mode {
	case "", MountModeKernel:
	case MountModeSidecar:
		m.sidecar = true
		if err := sidecarLimits("volume_context", m.transport, ctx[CtxNConnect], ctx[CtxMountOptions]); err != nil {
			return nil, err
		}
	default:
		return nil, invalid("volume_context.mountMode: %q is not one of %q, %q", mode, MountModeKernel, MountModeSidecar)
	}
	return m, nil
}

// address is the server as chimera-fuse dials it: host:port, IPv6 bracketed.
func (m *mountSpec) address() string {
	return net.JoinHostPort(m.server, strconv.Itoa(m.port))
}

// source is the mount(8) device string: host:/path, IPv6 hosts bracketed.
func (m *mountSpec) source() string {
	host := m.server
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + m.exportPath
}

// buildMountOptions is the kernel NFS client option list for the staging mount:
// the driver's managed options first, then the class's, then the volume
// capability's mount flags (StorageClass.mountOptions in Kubernetes).
func buildMountOptions(m *mountSpec, capFlags []string, readOnly bool) ([]string, error) {
	opts := []string{"vers=4.1", "proto=" + m.transport, "port=" + strconv.Itoa(m.port)}
	if m.nconnect > 0 {
		opts = append(opts, "nconnect="+strconv.Itoa(m.nconnect))
	}
	opts = append(opts, m.options...)
	for _, f := range capFlags {
		for _, opt := range strings.Split(f, ",") {
			opt = strings.TrimSpace(opt)
			if opt == "" {
				continue
			}
			if err := checkMountOption(opt); err != nil {
				return nil, invalid("volume_capability.mount.mount_flags: %v", err)
			}
			opts = append(opts, opt)
		}
	}
	if len(opts) > mountOptionsCountMax {
		return nil, invalid("mount options: %d options, at most %d allowed", len(opts), mountOptionsCountMax)
	}
	if readOnly {
		opts = append(opts, "ro")
	}
	return opts, nil
}

// encodeVolumeID makes the CSI volume id: the admin endpoint travels inside it
// because DeleteVolume and ControllerExpandVolume receive no parameters.
func encodeVolumeID(adminEndpoint, serverID string) string {
	return volumeIDPrefix + volumeIDSep + adminEndpoint + volumeIDSep + serverID
}

// decodeVolumeID splits a CSI volume id; ok is false for ids this driver never made.
func decodeVolumeID(id string) (adminEndpoint, serverID string, ok bool) {
	parts := strings.Split(id, volumeIDSep)
	if len(parts) != 3 || parts[0] != volumeIDPrefix || parts[2] == "" || strings.ContainsAny(parts[2], "/\x00") {
		return "", "", false
	}
	if _, err := adminapi.ParseEndpoint(parts[1]); err != nil {
		return "", "", false
	}
	return parts[1], parts[2], true
}

// checkVolumeName validates CreateVolume's name.
func checkVolumeName(name string) error {
	if name == "" {
		return invalid("name: missing in request")
	}
	if len(name) > volumeNameBytesMax {
		return invalid("name: %d bytes, at most %d allowed", len(name), volumeNameBytesMax)
	}
	if !volumeNameChars.MatchString(name) {
		return invalid("name: %q must start with a letter or digit and contain only [A-Za-z0-9._-]", name)
	}
	return nil
}

// capacityFor picks the bytes to allocate for a capacity range.
func capacityFor(r *csi.CapacityRange) (int64, error) {
	if r == nil {
		return CapacityBytesDefault, nil
	}
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, invalid("capacity_range: required_bytes %d and limit_bytes %d must not be negative", req, lim)
	}
	if lim > 0 && req > lim {
		return 0, invalid("capacity_range: required_bytes %d exceeds limit_bytes %d", req, lim)
	}
	if req > CapacityBytesMax {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range.required_bytes %d exceeds the largest volume, %d bytes", req, CapacityBytesMax)
	}
	switch {
	case req > 0:
		return req, nil
	case lim > 0 && lim < CapacityBytesDefault:
		return lim, nil
	default:
		return CapacityBytesDefault, nil
	}
}

// capacityFits says whether an existing volume satisfies a requested range.
func capacityFits(capacityBytes int64, r *csi.CapacityRange) bool {
	if r == nil {
		return true
	}
	if capacityBytes < r.GetRequiredBytes() {
		return false
	}
	return r.GetLimitBytes() == 0 || capacityBytes <= r.GetLimitBytes()
}

// ValidateParameters checks a StorageClass parameter set the way CreateVolume
// will, for tools and tests outside this package (e.g. the chart test).
func ValidateParameters(params map[string]string) error {
	_, err := parseParameters(params, "")
	return err
}
