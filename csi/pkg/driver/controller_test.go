package driver

// Proves the controller's behaviour at the admin API boundary beyond what
// csi-sanity checks: a missing or wrong token is Unauthenticated and creates
// nothing; a sidecar-mode class asking for RDMA is refused before the server is contacted;
// idempotency follows the CSI capacity range (not the server's exact size);
// expand grows and never shrinks; pagination survives deletions; the volume
// context carries what the node needs. Runs against $CHIMERAD when set, else
// the in-process fake admin API.

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/chimera-k8s/chimera/csi/internal/testbackend"
	"github.com/chimera-k8s/chimera/csi/pkg/adminapi"
)

func newController(t *testing.T) (*controllerServer, *testbackend.Backend) {
	b := testbackend.Start(t)
	d, err := New(Config{Mode: ModeController, AdminEndpoint: b.URL})
	if err != nil {
		t.Fatal(err)
	}
	return &controllerServer{d: d}, b
}

func rwx() []*csi.VolumeCapability {
	return []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
	}}
}

func createReq(b *testbackend.Backend, name string, bytes int64) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: bytes},
		VolumeCapabilities: rwx(),
		Parameters:         map[string]string{ParamAdminEndpoint: b.URL, ParamNFSPort: "2049"},
		Secrets:            map[string]string{SecretKeyToken: b.Token},
	}
}

func volumeCount(t *testing.T, c *controllerServer, b *testbackend.Backend) int {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte(b.Token), 0o600)
	c.d.cfg.AdminTokenFile = tokenFile
	defer func() { c.d.cfg.AdminTokenFile = "" }()
	resp, err := c.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Entries)
}

func TestControllerAuthAndRejections(t *testing.T) {
	c, b := newController(t)
	ctx := context.Background()

	req := createReq(b, "pvc-noauth", 8<<20)
	req.Secrets = nil
	_, err := c.CreateVolume(ctx, req)
	wantCode(t, err, codes.Unauthenticated, "token")
	req.Secrets = map[string]string{SecretKeyToken: "wrong-token"}
	_, err = c.CreateVolume(ctx, req)
	wantCode(t, err, codes.Unauthenticated, "401")
	if n := volumeCount(t, c, b); n != 0 {
		t.Fatalf("unauthenticated create left %d volumes", n)
	}

	req = createReq(b, "pvc-sidecar", 8<<20)
	req.Parameters[ParamMountMode] = MountModeSidecar
	req.Parameters[ParamTransport] = TransportRDMA
	_, err = c.CreateVolume(ctx, req)
	wantCode(t, err, codes.InvalidArgument, "mountMode")

	req = createReq(b, "pvc-block", 8<<20)
	req.VolumeCapabilities[0].AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	_, err = c.CreateVolume(ctx, req)
	wantCode(t, err, codes.InvalidArgument, "block")

	req = createReq(b, "pvc-snap", 8<<20)
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "s"}}}
	_, err = c.CreateVolume(ctx, req)
	wantCode(t, err, codes.InvalidArgument, "volume_content_source")

	_, err = c.CreateVolume(ctx, createReq(b, "pvc-huge", CapacityBytesMax+1))
	wantCode(t, err, codes.OutOfRange, "required_bytes")

	// An endpoint that refuses connections is Unavailable, so the CO retries.
	req = createReq(b, "pvc-down", 8<<20)
	req.Parameters[ParamAdminEndpoint] = "http://127.0.0.1:1"
	_, err = c.CreateVolume(ctx, req)
	wantCode(t, err, codes.Unavailable, "create volume")

	if n := volumeCount(t, c, b); n != 0 {
		t.Fatalf("rejected creates left %d volumes", n)
	}
}

func TestControllerLifecycle(t *testing.T) {
	c, b := newController(t)
	ctx := context.Background()
	secrets := map[string]string{SecretKeyToken: b.Token}

	first, err := c.CreateVolume(ctx, createReq(b, "pvc-life", 8<<20))
	if err != nil {
		t.Fatal(err)
	}
	v := first.Volume
	if v.CapacityBytes != 8<<20 {
		t.Fatalf("capacity %d", v.CapacityBytes)
	}
	vc := v.VolumeContext
	if vc[CtxServer] != "127.0.0.1" || vc[CtxPort] != "2049" || vc[CtxTransport] != "tcp" || !strings.HasPrefix(vc[CtxExportPath], "/") {
		t.Fatalf("volume context %v", vc)
	}
	if _, err := parseVolumeContext(vc); err != nil {
		t.Fatalf("node would refuse the context it is given: %v", err)
	}

	// Same name, same size: the same volume.
	again, err := c.CreateVolume(ctx, createReq(b, "pvc-life", 8<<20))
	if err != nil || again.Volume.VolumeId != v.VolumeId {
		t.Fatalf("retry: %v %v", again, err)
	}
	// Same name, a range the existing size satisfies: the same volume (the
	// server alone would answer 409 for a different exact size).
	r := createReq(b, "pvc-life", 4<<20)
	r.CapacityRange.LimitBytes = 16 << 20
	again, err = c.CreateVolume(ctx, r)
	if err != nil || again.Volume.VolumeId != v.VolumeId || again.Volume.CapacityBytes != 8<<20 {
		t.Fatalf("compatible range: %v %v", again, err)
	}
	// Same name, a size outside: AlreadyExists.
	_, err = c.CreateVolume(ctx, createReq(b, "pvc-life", 32<<20))
	wantCode(t, err, codes.AlreadyExists, "pvc-life")

	// Expand grows; asking for less than the current size changes nothing.
	exp, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}, Secrets: secrets})
	if err != nil || exp.CapacityBytes != 16<<20 || exp.NodeExpansionRequired {
		t.Fatalf("expand: %v %v", exp, err)
	}
	exp, err = c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}, Secrets: secrets})
	if err != nil || exp.CapacityBytes != 16<<20 {
		t.Fatalf("no shrink: %v %v", exp, err)
	}
	_, err = c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20, LimitBytes: 2 << 20}, Secrets: secrets})
	wantCode(t, err, codes.OutOfRange, "limit_bytes")
	_, err = c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.VolumeId, Secrets: secrets})
	wantCode(t, err, codes.InvalidArgument, "capacity_range")
	_, err = c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "nope", CapacityRange: &csi.CapacityRange{RequiredBytes: 1}, Secrets: secrets})
	wantCode(t, err, codes.NotFound, "volume_id")

	val, err := c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.VolumeId, VolumeCapabilities: rwx(), Secrets: secrets})
	if err != nil || val.Confirmed == nil {
		t.Fatalf("validate: %v %v", val, err)
	}
	blk := rwx()
	blk[0].AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	val, err = c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.VolumeId, VolumeCapabilities: blk, Secrets: secrets})
	if err != nil || val.Confirmed != nil || !strings.Contains(val.Message, "block") {
		t.Fatalf("validate block: %v %v", val, err)
	}

	// Delete, then delete again: both succeed; the volume is gone.
	for i := 0; i < 2; i++ {
		if _, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.VolumeId, Secrets: secrets}); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
	}
	_, err = c.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.VolumeId, VolumeCapabilities: rwx(), Secrets: secrets})
	wantCode(t, err, codes.NotFound, "")
	_, err = c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.VolumeId, Secrets: map[string]string{SecretKeyToken: "wrong"}})
	wantCode(t, err, codes.Unauthenticated, "")
}

// The StorageClass's readOnly / squash / anonymous ids reach the admin API
// as the volume's rule (read back from the server), readOnly reaches the
// node in the context, a retry is the same volume, and the same name asked
// with other rules is AlreadyExists; a class without them sets no rule.
func TestControllerVolumeAccess(t *testing.T) {
	c, b := newController(t)
	ctx := context.Background()
	req := createReq(b, "pvc-ro", 8<<20)
	req.Parameters[ParamReadOnly] = "true"
	req.Parameters[ParamSquash] = SquashAll
	req.Parameters[ParamAnonymousUID] = "1001"
	req.Parameters[ParamAnonymousGID] = "1002"
	resp, err := c.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Volume.VolumeContext[CtxReadOnly] != "true" {
		t.Fatalf("volume context %v", resp.Volume.VolumeContext)
	}
	_, id, _ := decodeVolumeID(resp.Volume.VolumeId)
	ac, err := adminapi.New(b.URL, b.Token, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ac.GetVolume(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := []adminapi.AccessRule{{Clients: []string{"*"}, AccessType: "ro", Squash: SquashAll, AnonymousUID: 1001, AnonymousGID: 1002}}
	if !reflect.DeepEqual(got.Access, want) {
		t.Fatalf("server has access %+v, want %+v", got.Access, want)
	}
	again, err := c.CreateVolume(ctx, req)
	if err != nil || again.Volume.VolumeId != resp.Volume.VolumeId {
		t.Fatalf("retry: %v %v", again, err)
	}
	other := createReq(b, "pvc-ro", 8<<20)
	_, err = c.CreateVolume(ctx, other)
	wantCode(t, err, codes.AlreadyExists, "access rules")

	plain, err := c.CreateVolume(ctx, createReq(b, "pvc-plain", 8<<20))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := plain.Volume.VolumeContext[CtxReadOnly]; ok {
		t.Fatalf("plain context %v", plain.Volume.VolumeContext)
	}
	_, id, _ = decodeVolumeID(plain.Volume.VolumeId)
	if got, err := ac.GetVolume(ctx, id); err != nil || got.Access != nil {
		t.Fatalf("plain volume: %+v %v", got, err)
	}
	bad := createReq(b, "pvc-bad", 8<<20)
	bad.Parameters[ParamSquash] = "squash_all"
	_, err = c.CreateVolume(ctx, bad)
	wantCode(t, err, codes.InvalidArgument, "parameters.squash")
}

func TestControllerListPagination(t *testing.T) {
	c, b := newController(t)
	ctx := context.Background()
	secrets := map[string]string{SecretKeyToken: b.Token}
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte(b.Token+"\n"), 0o600)
	c.d.cfg.AdminTokenFile = tokenFile

	const volumes = 5
	for i := 0; i < volumes; i++ {
		if _, err := c.CreateVolume(ctx, createReq(b, "pvc-page-"+string(rune('a'+i)), 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	page, err := c.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 2})
	if err != nil || len(page.Entries) != 2 || page.NextToken == "" {
		t.Fatalf("page 1: %v %v", page, err)
	}
	for _, e := range page.Entries {
		seen[e.Volume.VolumeId] = true
		// Deleting what was listed must not make the next page skip or repeat.
		if _, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: e.Volume.VolumeId, Secrets: secrets}); err != nil {
			t.Fatal(err)
		}
	}
	for page.NextToken != "" {
		page, err = c.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: page.NextToken})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			if seen[e.Volume.VolumeId] {
				t.Fatalf("volume %s listed twice", e.Volume.VolumeId)
			}
			seen[e.Volume.VolumeId] = true
		}
	}
	if len(seen) != volumes {
		t.Fatalf("listed %d distinct volumes, want %d", len(seen), volumes)
	}
	_, err = c.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "garbage"})
	wantCode(t, err, codes.Aborted, "starting_token")
	_, err = c.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: -1})
	wantCode(t, err, codes.InvalidArgument, "max_entries")

	capResp, err := c.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil || capResp.AvailableCapacity <= 0 {
		t.Fatalf("capacity: %v %v", capResp, err)
	}
}
