package driver

// Proves that StorageClass parameters, volume contexts, capacity ranges and
// names are validated with the gRPC code the CSI spec names and a message that
// names the offending field, and that the kernel mount options are built exactly
// (managed options first, user options after, managed keys not overridable).

import (
	"reflect"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimera-k8s/chimera/csi/pkg/adminapi"
)

func wantCode(t *testing.T, err error, code codes.Code, mention string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want %v mentioning %q, got success", code, mention)
	}
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("want code %v, got %v: %s", code, st.Code(), st.Message())
	}
	if !strings.Contains(st.Message(), mention) {
		t.Fatalf("message %q does not mention %q", st.Message(), mention)
	}
}

func TestParseParametersValid(t *testing.T) {
	p, err := parseParameters(map[string]string{
		ParamClusterName: "prod", ParamClusterNamespace: "storage",
		ParamTransport: "rdma", ParamNConnect: "8", ParamMountOptions: "noatime, actimeo=1",
		"csi.storage.k8s.io/pv/name": "ignored",
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	if p.adminEndpoint != "https://prod-mds.storage.svc:8080" || p.server != "prod-mds.storage.svc" {
		t.Fatalf("endpoint %q server %q", p.adminEndpoint, p.server)
	}
	if p.transport != TransportRDMA || p.port != NFSPortRDMADefault || p.nconnect != 8 {
		t.Fatalf("transport %q port %d nconnect %d", p.transport, p.port, p.nconnect)
	}
	if !reflect.DeepEqual(p.mountOptions, []string{"noatime", "actimeo=1"}) {
		t.Fatalf("options %q", p.mountOptions)
	}
	ctx := p.volumeContext("/memfs/volumes/v1")
	want := map[string]string{CtxServer: "prod-mds.storage.svc", CtxPort: "20049", CtxExportPath: "/memfs/volumes/v1",
		CtxTransport: "rdma", CtxNConnect: "8", CtxMountOptions: "noatime,actimeo=1"}
	if !reflect.DeepEqual(ctx, want) {
		t.Fatalf("context %v, want %v", ctx, want)
	}

	p, err = parseParameters(map[string]string{ParamAdminEndpoint: "http://10.1.2.3:18080", ParamNFSPort: "12049", ParamNFSServer: "10.9.9.9"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if p.adminEndpoint != "http://10.1.2.3:18080" || p.server != "10.9.9.9" || p.port != 12049 || p.transport != TransportTCP {
		t.Fatalf("%+v", p)
	}
	// Sidecar mode: TCP only, and the context says so (kernel contexts do not
	// carry the key, so existing PersistentVolumes read as kernel).
	p, err = parseParameters(map[string]string{ParamClusterName: "prod", ParamClusterNamespace: "storage", ParamMountMode: "sidecar"}, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx = p.volumeContext("/v")
	want = map[string]string{CtxServer: "prod-mds.storage.svc", CtxPort: "2049", CtxExportPath: "/v", CtxTransport: "tcp", CtxMountMode: "sidecar"}
	if !reflect.DeepEqual(ctx, want) {
		t.Fatalf("sidecar context %v, want %v", ctx, want)
	}
	if m, err := parseVolumeContext(ctx); err != nil || !m.sidecar || m.address() != "prod-mds.storage.svc:2049" {
		t.Fatalf("sidecar context parsed as %+v %v", m, err)
	}

	p, err = parseParameters(nil, "http://127.0.0.1:1234")
	if err != nil || p.server != "127.0.0.1" || p.port != NFSPortTCPDefault {
		t.Fatalf("default endpoint: %+v %v", p, err)
	}
}

// The access parameters become the volume's one rule for every client
// (the export's rules still decide who gets in), and readOnly travels in the
// volume context so the node mounts ro; a class without them sends no rule.
func TestAccessParameters(t *testing.T) {
	base := map[string]string{ParamClusterName: "c", ParamClusterNamespace: "ns"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	rule := func(access, squash string, uid, gid uint32) []adminapi.AccessRule {
		return []adminapi.AccessRule{{Clients: []string{"*"}, AccessType: access, Squash: squash, AnonymousUID: uid, AnonymousGID: gid}}
	}
	cases := []struct {
		name     string
		params   map[string]string
		access   []adminapi.AccessRule
		readOnly bool
	}{
		{"none set", with(), nil, false},
		{"readOnly", with(ParamReadOnly, "true"), rule("ro", SquashNoRoot, 65534, 65534), true},
		{"readOnly false", with(ParamReadOnly, "false"), rule("rw", SquashNoRoot, 65534, 65534), false},
		{"root squash", with(ParamSquash, SquashRoot), rule("rw", SquashRoot, 65534, 65534), false},
		{"all squash with ids", with(ParamReadOnly, "true", ParamSquash, SquashAll, ParamAnonymousUID, "1000", ParamAnonymousGID, "0"), rule("ro", SquashAll, 1000, 0), true},
		{"largest id", with(ParamSquash, SquashRoot, ParamAnonymousUID, "4294967294"), rule("rw", SquashRoot, 4294967294, 65534), false},
		{"no root squash", with(ParamSquash, SquashNoRoot), rule("rw", SquashNoRoot, 65534, 65534), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := parseParameters(c.params, "")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.access, c.access) {
				t.Fatalf("access %+v, want %+v", p.access, c.access)
			}
			ctx := p.volumeContext("/v")
			if got := ctx[CtxReadOnly]; (got == "true") != c.readOnly || (!c.readOnly && got != "") {
				t.Fatalf("context readOnly %q, want %v", got, c.readOnly)
			}
			m, err := parseVolumeContext(ctx)
			if err != nil || m.readOnly != c.readOnly {
				t.Fatalf("context parsed: %+v %v", m, err)
			}
		})
	}
	bad := map[string]string{CtxServer: "h", CtxPort: "2049", CtxExportPath: "/v", CtxReadOnly: "yes"}
	_, err := parseVolumeContext(bad)
	wantCode(t, err, codes.InvalidArgument, "volume_context.readOnly")
}

func TestParseParametersInvalid(t *testing.T) {
	base := func(kv ...string) map[string]string {
		m := map[string]string{ParamClusterName: "c", ParamClusterNamespace: "ns"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	cases := []struct {
		name    string
		params  map[string]string
		mention string
	}{
		{"sidecar over rdma", base(ParamMountMode, "sidecar", ParamTransport, "rdma"), "parameters.transport"},
		{"sidecar with nconnect", base(ParamMountMode, "sidecar", ParamNConnect, "2"), "parameters.nconnect"},
		{"sidecar with mountOptions", base(ParamMountMode, "sidecar", ParamMountOptions, "noatime"), "parameters.mountOptions"},
		{"unknown mount mode", base(ParamMountMode, "fuse"), "parameters.mountMode"},
		{"unknown key", base("clustername", "x"), `unknown key "clustername"`},
		{"bad transport", base(ParamTransport, "udp"), "parameters.transport"},
		{"nconnect zero", base(ParamNConnect, "0"), "parameters.nconnect"},
		{"nconnect too big", base(ParamNConnect, "17"), "parameters.nconnect"},
		{"nconnect text", base(ParamNConnect, "many"), "parameters.nconnect"},
		{"nfsPort range", base(ParamNFSPort, "70000"), "parameters.nfsPort"},
		{"adminPort text", base(ParamAdminPort, "http"), "parameters.adminPort"},
		{"bad cluster name", map[string]string{ParamClusterName: "Prod_1", ParamClusterNamespace: "ns"}, "parameters.clusterName"},
		{"missing namespace", map[string]string{ParamClusterName: "prod"}, "parameters.clusterNamespace"},
		{"both endpoint and cluster", base(ParamAdminEndpoint, "http://x:1"), "exclusive"},
		{"endpoint scheme", map[string]string{ParamAdminEndpoint: "ftp://x:1"}, "parameters.adminEndpoint"},
		{"endpoint path", map[string]string{ParamAdminEndpoint: "http://x:1/api"}, "parameters.adminEndpoint"},
		{"endpoint creds", map[string]string{ParamAdminEndpoint: "http://u:p@x:1"}, "parameters.adminEndpoint"},
		{"nothing named", map[string]string{}, "clusterName"},
		{"managed option vers", base(ParamMountOptions, "vers=3"), "set by the driver"},
		{"managed option port", base(ParamMountOptions, "noatime,port=1"), "nfsPort"},
		{"empty option", base(ParamMountOptions, "noatime,,hard"), "empty option"},
		{"shell chars", base(ParamMountOptions, "noatime;reboot"), "characters outside"},
		{"space inside", base(ParamMountOptions, "sec=sys krb5"), "characters outside"},
		{"nfsServer junk", base(ParamNFSServer, "a b"), "parameters.nfsServer"},
		{"too many options", base(ParamMountOptions, strings.Repeat("hard,", 40)+"hard"), "at most"},
		{"readOnly yes", base(ParamReadOnly, "yes"), "parameters.readOnly"},
		{"readOnly empty", base(ParamReadOnly, ""), "parameters.readOnly"},
		{"readOnly capital", base(ParamReadOnly, "True"), "parameters.readOnly"},
		{"squash none", base(ParamSquash, "none"), "parameters.squash"},
		{"squash empty", base(ParamSquash, ""), "parameters.squash"},
		{"anonymousUid text", base(ParamSquash, SquashRoot, ParamAnonymousUID, "nobody"), "parameters.anonymousUid"},
		{"anonymousUid negative", base(ParamSquash, SquashRoot, ParamAnonymousUID, "-1"), "parameters.anonymousUid"},
		{"anonymousGid no id", base(ParamSquash, SquashAll, ParamAnonymousGID, "4294967295"), "parameters.anonymousGid"},
		{"anonymousUid without squash", base(ParamAnonymousUID, "1000"), "parameters.anonymousUid"},
		{"anonymousGid with no_root_squash", base(ParamSquash, SquashNoRoot, ParamAnonymousGID, "1000"), "parameters.anonymousGid"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseParameters(c.params, "")
			wantCode(t, err, codes.InvalidArgument, c.mention)
		})
	}
}

func TestVolumeContextAndMountOptions(t *testing.T) {
	ctx := map[string]string{CtxServer: "10.0.2.2", CtxPort: "2049", CtxExportPath: "/memfs/volumes/v1", CtxTransport: "tcp", CtxNConnect: "4", CtxMountOptions: "noatime"}
	m, err := parseVolumeContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.source() != "10.0.2.2:/memfs/volumes/v1" {
		t.Fatalf("source %q", m.source())
	}
	opts, err := buildMountOptions(m, []string{"hard,timeo=600", "nosuid"}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"vers=4.1", "proto=tcp", "port=2049", "nconnect=4", "noatime", "hard", "timeo=600", "nosuid", "ro"}
	if !reflect.DeepEqual(opts, want) {
		t.Fatalf("options %q, want %q", opts, want)
	}
	// RDMA, no nconnect, IPv6 server, writable.
	m, err = parseVolumeContext(map[string]string{CtxServer: "fd00::1", CtxPort: "20049", CtxExportPath: "/v", CtxTransport: "rdma"})
	if err != nil {
		t.Fatal(err)
	}
	opts, _ = buildMountOptions(m, nil, false)
	if !reflect.DeepEqual(opts, []string{"vers=4.1", "proto=rdma", "port=20049"}) || m.source() != "[fd00::1]:/v" {
		t.Fatalf("options %q source %q", opts, m.source())
	}
	_, err = buildMountOptions(m, []string{"nfsvers=3"}, false)
	wantCode(t, err, codes.InvalidArgument, "mount_flags")

	bad := []struct {
		key, value, mention string
	}{
		{CtxServer, "", "volume_context.server"},
		{CtxServer, "host;rm", "volume_context.server"},
		{CtxPort, "0", "volume_context.port"},
		{CtxExportPath, "relative", "volume_context.exportPath"},
		{CtxExportPath, "/a/../../etc", "volume_context.exportPath"},
		{CtxExportPath, "/a,b", "volume_context.exportPath"},
		{CtxTransport, "udp", "volume_context.transport"},
		{CtxNConnect, "99", "volume_context.nconnect"},
		{CtxMountOptions, "proto=udp", "volume_context.mountOptions"},
	}
	for _, b := range bad {
		c := map[string]string{}
		for k, v := range ctx {
			c[k] = v
		}
		c[b.key] = b.value
		_, err := parseVolumeContext(c)
		wantCode(t, err, codes.InvalidArgument, b.mention)
	}
}

func TestVolumeIDRoundTrip(t *testing.T) {
	id := encodeVolumeID("http://prod-mds.storage.svc:8080", "v000042")
	ep, sid, ok := decodeVolumeID(id)
	if !ok || ep != "http://prod-mds.storage.svc:8080" || sid != "v000042" {
		t.Fatalf("%q -> %q %q %v", id, ep, sid, ok)
	}
	for _, bad := range []string{"", "fake-vol-id", "chimera1#http://x:1#", "chimera1#ftp://x#v1", "chimera2#http://x:1#v1", "chimera1#http://x:1#a/b", "chimera1#http://x:1#v#w"} {
		if _, _, ok := decodeVolumeID(bad); ok {
			t.Errorf("%q decoded as valid", bad)
		}
	}
}

func TestCapacityAndName(t *testing.T) {
	cases := []struct {
		r    *csi.CapacityRange
		want int64
		code codes.Code
	}{
		{nil, CapacityBytesDefault, codes.OK},
		{&csi.CapacityRange{RequiredBytes: 5 << 20}, 5 << 20, codes.OK},
		{&csi.CapacityRange{LimitBytes: 1 << 20}, 1 << 20, codes.OK},
		{&csi.CapacityRange{LimitBytes: 8 << 30}, CapacityBytesDefault, codes.OK},
		{&csi.CapacityRange{RequiredBytes: 2, LimitBytes: 1}, 0, codes.InvalidArgument},
		{&csi.CapacityRange{RequiredBytes: -1}, 0, codes.InvalidArgument},
		{&csi.CapacityRange{RequiredBytes: CapacityBytesMax + 1}, 0, codes.OutOfRange},
	}
	for i, c := range cases {
		got, err := capacityFor(c.r)
		if status.Code(err) != c.code || got != c.want {
			t.Errorf("case %d: got %d %v, want %d %v", i, got, err, c.want, c.code)
		}
	}
	if !capacityFits(10, &csi.CapacityRange{RequiredBytes: 5, LimitBytes: 10}) || capacityFits(11, &csi.CapacityRange{RequiredBytes: 5, LimitBytes: 10}) || capacityFits(4, &csi.CapacityRange{RequiredBytes: 5}) {
		t.Error("capacityFits wrong at the range edges")
	}
	if err := checkVolumeName("pvc-0f3e2a7c-1b2d-4e5f-8a9b-0c1d2e3f4a5b"); err != nil {
		t.Error(err)
	}
	wantCode(t, checkVolumeName(""), codes.InvalidArgument, "name")
	wantCode(t, checkVolumeName("../etc"), codes.InvalidArgument, "name")
	wantCode(t, checkVolumeName("a/b"), codes.InvalidArgument, "name")
	wantCode(t, checkVolumeName(strings.Repeat("a", 129)), codes.InvalidArgument, "at most 128")
}

func TestCheckCapability(t *testing.T) {
	mountCap := func(fs string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
		return &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		}
	}
	for _, m := range []csi.VolumeCapability_AccessMode_Mode{
		csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	} {
		if err := checkCapability(mountCap("", m), "c"); err != nil {
			t.Errorf("%v: %v", m, err)
		}
	}
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	for _, c := range []struct {
		cap     *csi.VolumeCapability
		mention string
	}{
		{nil, "c: missing"},
		{block, "c.block"},
		{mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), "c.mount.fs_type"},
		{mountCap("", csi.VolumeCapability_AccessMode_UNKNOWN), "c.access_mode"},
		{&csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}, "c.access_mode: missing"},
	} {
		err := checkCapability(c.cap, "c")
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("want error mentioning %q, got %v", c.mention, err)
		}
	}
}
