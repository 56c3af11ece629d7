package driver

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chimera-k8s/chimera/csi/pkg/adminapi"
)

const (
	// listTokenPrefix marks ListVolumes tokens we issued; anything else is Aborted.
	listTokenPrefix = "after:"
	// listEntriesMax bounds one ListVolumes page when the CO asks for "all".
	listEntriesMax = 4096
)

// controllerServer provisions volumes through the chimerad admin API (CSI spec,
// "Controller Service RPC").
type controllerServer struct {
	csi.UnimplementedControllerServer
	d *Driver
}

// adminError maps an admin API failure to the gRPC code a CO acts on.
func adminError(err error, what string) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return err
	}
	switch adminapi.StatusOf(err) {
	case http.StatusUnauthorized:
		return status.Errorf(codes.Unauthenticated, "%s: %v (check the admin token secret)", what, err)
	case http.StatusForbidden:
		return status.Errorf(codes.PermissionDenied, "%s: %v", what, err)
	case http.StatusNotFound:
		return status.Errorf(codes.NotFound, "%s: %v", what, err)
	case http.StatusConflict:
		return status.Errorf(codes.AlreadyExists, "%s: %v", what, err)
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	case http.StatusInsufficientStorage, http.StatusRequestEntityTooLarge:
		return status.Errorf(codes.ResourceExhausted, "%s: %v", what, err)
	case 0:
		if errors.Is(err, context.DeadlineExceeded) {
			return status.Errorf(codes.DeadlineExceeded, "%s: %v", what, err)
		}
		if errors.Is(err, context.Canceled) {
			return status.Errorf(codes.Canceled, "%s: %v", what, err)
		}
		return status.Errorf(codes.Unavailable, "%s: %v", what, err)
	}
	if adminapi.StatusOf(err) >= 500 {
		return status.Errorf(codes.Unavailable, "%s: %v", what, err)
	}
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}

func (s *controllerServer) client(endpoint string, secrets map[string]string) (*adminapi.Client, error) {
	token, err := s.d.tokenFrom(secrets)
	if err != nil {
		return nil, err
	}
	var t *adminapi.TLS
	if strings.HasPrefix(endpoint, "https://") {
		t = &adminapi.TLS{ServerName: s.d.cfg.AdminTLSServerName}
		if f := s.d.cfg.AdminCAFile; f != "" {
			// Read per call: the operator may publish a new CA, and the
			// kubelet updates the mounted ConfigMap in place. A cluster
			// whose certificate cert-manager issues has its own CA file.
			name := t.ServerName
			if u, perr := adminapi.ParseEndpoint(endpoint); name == "" && perr == nil {
				name = u.Hostname()
			}
			if t.RootCAs, err = adminapi.LoadCABundle(adminapi.CABundleFor(f, name)); err != nil {
				return nil, status.Errorf(codes.Unavailable, "%v (the operator publishes it in its admin CA ConfigMap)", err)
			}
		}
	}
	c, err := adminapi.New(endpoint, token, t)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "admin endpoint: %v", err)
	}
	return c, nil
}

func (s *controllerServer) csiVolume(p *volumeParams, v *adminapi.Volume) *csi.Volume {
	return &csi.Volume{
		VolumeId:      encodeVolumeID(p.adminEndpoint, v.ID),
		CapacityBytes: v.CapacityBytes,
		VolumeContext: p.volumeContext(v.ExportPath),
	}
}

func (s *controllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := checkVolumeName(req.GetName()); err != nil {
		return nil, err
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume_content_source: snapshots and clones are not supported yet")
	}
	// accessibility_requirements are satisfied whatever they say: every node
	// reaches the cluster over the network, so the volume carries no topology
	// (VOLUME_ACCESSIBILITY_CONSTRAINTS is not advertised).
	capacityBytes, err := capacityFor(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	p, err := parseParameters(req.GetParameters(), s.d.cfg.AdminEndpoint)
	if err != nil {
		return nil, err
	}
	release, err := s.d.locks.acquire("name/" + req.GetName())
	if err != nil {
		return nil, err
	}
	defer release()
	c, err := s.client(p.adminEndpoint, req.GetSecrets())
	if err != nil {
		return nil, err
	}

	v, err := c.CreateVolume(ctx, req.GetName(), capacityBytes, p.access)
	if adminapi.StatusOf(err) == http.StatusConflict {
		// The server keys idempotency on exact capacity; CSI on the range. An
		// existing volume whose size fits the range (and whose rules are the
		// class's) is the answer.
		existing, lerr := findByName(ctx, c, req.GetName())
		if lerr != nil {
			return nil, adminError(lerr, "create volume: look up existing volume "+req.GetName())
		}
		if existing == nil {
			return nil, adminError(err, "create volume "+req.GetName())
		}
		if !capacityFits(existing.CapacityBytes, req.GetCapacityRange()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists with capacity %d bytes, outside the requested range [%d, %d]",
				req.GetName(), existing.CapacityBytes, req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes())
		}
		if !reflect.DeepEqual(existing.Access, p.access) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists with other access rules (readOnly, squash, anonymousUid/Gid) than the StorageClass asks for", req.GetName())
		}
		v, err = existing, nil
	}
	if err != nil {
		return nil, adminError(err, "create volume "+req.GetName())
	}
	if !capacityFits(v.CapacityBytes, req.GetCapacityRange()) {
		return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists with capacity %d bytes, outside the requested range", req.GetName(), v.CapacityBytes)
	}
	if v.ExportPath == "" {
		return nil, status.Errorf(codes.Internal, "create volume %q: admin API answered without exportPath", req.GetName())
	}
	return &csi.CreateVolumeResponse{Volume: s.csiVolume(p, v)}, nil
}

func findByName(ctx context.Context, c *adminapi.Client, name string) (*adminapi.Volume, error) {
	vols, err := c.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	for i := range vols {
		if vols[i].Name == name {
			return &vols[i], nil
		}
	}
	return nil, nil
}

func (s *controllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: missing in request")
	}
	endpoint, id, ok := decodeVolumeID(req.GetVolumeId())
	if !ok {
		// Not an id this driver issued, so no volume of ours can carry it: deleting
		// it is already done (the CSI spec asks for success on unknown ids).
		return &csi.DeleteVolumeResponse{}, nil
	}
	release, err := s.d.locks.acquire(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer release()
	c, err := s.client(endpoint, req.GetSecrets())
	if err != nil {
		return nil, err
	}
	if err := c.DeleteVolume(ctx, id); err != nil && adminapi.StatusOf(err) != http.StatusNotFound {
		return nil, adminError(err, "delete volume "+id)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *controllerServer) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: missing in request")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity_range: missing in request")
	}
	if req.GetVolumeCapability() != nil {
		if err := checkCapability(req.GetVolumeCapability(), "volume_capability"); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	want, err := capacityFor(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	endpoint, id, ok := decodeVolumeID(req.GetVolumeId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume_id %q: not a volume of this driver", req.GetVolumeId())
	}
	release, err := s.d.locks.acquire(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer release()
	c, err := s.client(endpoint, req.GetSecrets())
	if err != nil {
		return nil, err
	}
	v, err := c.GetVolume(ctx, id)
	if err != nil {
		return nil, adminError(err, "expand volume "+id)
	}
	if v.CapacityBytes < want {
		if v, err = c.ExpandVolume(ctx, id, want); err != nil {
			return nil, adminError(err, "expand volume "+id)
		}
	}
	if lim := req.GetCapacityRange().GetLimitBytes(); lim > 0 && v.CapacityBytes > lim {
		return nil, status.Errorf(codes.OutOfRange, "volume %s already has %d bytes, above capacity_range.limit_bytes %d (shrinking is not supported)", id, v.CapacityBytes, lim)
	}
	// The quota lives on the server: mounted clients see the new size at once.
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: false}, nil
}

func (s *controllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: missing in request")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities: missing in request")
	}
	endpoint, id, ok := decodeVolumeID(req.GetVolumeId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume_id %q: not a volume of this driver", req.GetVolumeId())
	}
	c, err := s.client(endpoint, req.GetSecrets())
	if err != nil {
		return nil, err
	}
	if _, err := c.GetVolume(ctx, id); err != nil {
		return nil, adminError(err, "validate volume "+id)
	}
	for i, vc := range req.GetVolumeCapabilities() {
		if err := checkCapability(vc, "volume_capabilities["+itoa(i)+"]"); err != nil {
			// Unsupported is an answer, not an error: Confirmed stays empty.
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	if len(req.GetParameters()) > 0 {
		if _, err := parseParameters(req.GetParameters(), s.d.cfg.AdminEndpoint); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes pages through the default cluster's volumes in id order. The
// token is the last id returned, so deleting volumes between pages neither
// repeats nor skips the ones that remain.
func (s *controllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "max_entries: %d must not be negative", req.GetMaxEntries())
	}
	after := ""
	if t := req.GetStartingToken(); t != "" {
		if !strings.HasPrefix(t, listTokenPrefix) || len(t) == len(listTokenPrefix) {
			return nil, status.Errorf(codes.Aborted, "starting_token %q: not a token this driver issued", t)
		}
		after = strings.TrimPrefix(t, listTokenPrefix)
	}
	if s.d.cfg.AdminEndpoint == "" {
		return nil, status.Error(codes.FailedPrecondition, "ListVolumes needs the controller's --admin-endpoint")
	}
	p, err := parseParameters(nil, s.d.cfg.AdminEndpoint)
	if err != nil {
		return nil, err
	}
	c, err := s.client(p.adminEndpoint, nil)
	if err != nil {
		return nil, err
	}
	vols, err := c.ListVolumes(ctx)
	if err != nil {
		return nil, adminError(err, "list volumes")
	}
	sort.Slice(vols, func(i, j int) bool { return vols[i].ID < vols[j].ID })
	start := sort.Search(len(vols), func(i int) bool { return vols[i].ID > after })
	limit := int(req.GetMaxEntries())
	if limit == 0 || limit > listEntriesMax {
		limit = listEntriesMax
	}
	resp := &csi.ListVolumesResponse{}
	for i := start; i < len(vols) && len(resp.Entries) < limit; i++ {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: s.csiVolume(p, &vols[i])})
	}
	if end := start + len(resp.Entries); end < len(vols) {
		resp.NextToken = listTokenPrefix + vols[end-1].ID
	}
	return resp, nil
}

// GetCapacity reports the cluster's unallocated bytes from GET /api/v1/cluster.
func (s *controllerServer) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	for i, vc := range req.GetVolumeCapabilities() {
		if err := checkCapability(vc, "volume_capabilities["+itoa(i)+"]"); err != nil {
			// The CSI spec: capacity for an unsupported capability is zero.
			return &csi.GetCapacityResponse{AvailableCapacity: 0}, nil
		}
	}
	p, err := parseParameters(req.GetParameters(), s.d.cfg.AdminEndpoint)
	if err != nil {
		return nil, err
	}
	c, err := s.client(p.adminEndpoint, nil)
	if err != nil {
		return nil, err
	}
	doc, err := c.Cluster(ctx)
	if err != nil {
		return nil, adminError(err, "get capacity")
	}
	avail, ok := jsonInt(doc, "availableBytes")
	if !ok {
		total, okT := jsonInt(doc, "capacityBytes")
		used, okU := jsonInt(doc, "allocatedBytes")
		if !okT || !okU {
			return nil, status.Error(codes.Internal, "get capacity: GET /api/v1/cluster has neither availableBytes nor capacityBytes+allocatedBytes")
		}
		avail = total - used
	}
	if avail < 0 {
		avail = 0
	}
	return &csi.GetCapacityResponse{AvailableCapacity: avail, MaximumVolumeSize: wrapInt(CapacityBytesMax)}, nil
}

func (s *controllerServer) ControllerGetCapabilities(ctx context.Context, req *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	}
	if s.d.cfg.AdminEndpoint != "" {
		// Both RPCs carry no secrets and (ListVolumes) no parameters: they only
		// work against a configured default cluster.
		types = append(types, csi.ControllerServiceCapability_RPC_LIST_VOLUMES, csi.ControllerServiceCapability_RPC_GET_CAPACITY)
	}
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}
