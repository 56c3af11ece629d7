// Command csicall is the test harness's stand-in for the CSI sidecars and the
// kubelet: it calls one driver RPC sequence over the CSI socket, the way
// external-provisioner (provision) and the kubelet (publish, stats, unpublish)
// would, and prints what a test asserts on. It exists because the real
// sidecars cannot be fetched on the test machines (TESTING.md).
//
//	csicall -endpoint unix:///tmp/csi.sock provision -name N -bytes B -param k=v... -token T   > volume.json
//	csicall -endpoint ... publish   -volume volume.json -staging DIR -target DIR [-readonly]
//	csicall -endpoint ... stats     -volume volume.json -path DIR
//	csicall -endpoint ... unpublish -volume volume.json -staging DIR -target DIR
//	csicall -endpoint ... delete    -volume volume.json -token T
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// callTimeout bounds every RPC: a mount against an unreachable server must not
// hang the test.
const callTimeout = 60 * time.Second

type volumeFile struct {
	VolumeID      string            `json:"volumeId"`
	CapacityBytes int64             `json:"capacityBytes"`
	VolumeContext map[string]string `json:"volumeContext"`
}

type params map[string]string

func (p params) String() string { return fmt.Sprint(map[string]string(p)) }
func (p params) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("-param wants key=value, got %q", s)
	}
	p[k] = v
	return nil
}

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "csicall: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	endpoint := flag.String("endpoint", "unix:///tmp/csi.sock", "driver socket")
	flag.Parse()
	if flag.NArg() < 1 {
		die("usage: csicall -endpoint E provision|publish|stats|unpublish|delete [flags]")
	}
	cmd, args := flag.Arg(0), flag.Args()[1:]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	name := fs.String("name", "", "volume name (provision)")
	bytes := fs.Int64("bytes", 0, "capacity (provision)")
	token := fs.String("token", "", "admin token (provision, delete)")
	volPath := fs.String("volume", "", "volume.json written by provision")
	staging := fs.String("staging", "", "staging path")
	target := fs.String("target", "", "target path")
	path := fs.String("path", "", "volume path (stats)")
	readonly := fs.Bool("readonly", false, "publish read-only")
	p := params{}
	fs.Var(p, "param", "StorageClass parameter key=value (repeatable)")
	fs.Parse(args)

	conn, err := grpc.NewClient(*endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		die("connect %s: %v", *endpoint, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	mode := &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER}
	vcap := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}, AccessMode: mode}
	var vol volumeFile
	if *volPath != "" {
		b, err := os.ReadFile(*volPath)
		if err != nil {
			die("%v", err)
		}
		if err := json.Unmarshal(b, &vol); err != nil {
			die("%s: %v", *volPath, err)
		}
	}
	ctrl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	secrets := map[string]string{"token": *token}

	switch cmd {
	case "provision":
		resp, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: *name, CapacityRange: &csi.CapacityRange{RequiredBytes: *bytes},
			VolumeCapabilities: []*csi.VolumeCapability{vcap}, Parameters: p, Secrets: secrets,
		})
		if err != nil {
			die("CreateVolume: %v", err)
		}
		out, _ := json.MarshalIndent(volumeFile{resp.Volume.VolumeId, resp.Volume.CapacityBytes, resp.Volume.VolumeContext}, "", "  ")
		fmt.Println(string(out))
	case "publish":
		if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeID, StagingTargetPath: *staging,
			VolumeCapability: vcap, VolumeContext: vol.VolumeContext}); err != nil {
			die("NodeStageVolume: %v", err)
		}
		if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeID, StagingTargetPath: *staging,
			TargetPath: *target, VolumeCapability: vcap, VolumeContext: vol.VolumeContext, Readonly: *readonly}); err != nil {
			die("NodePublishVolume: %v", err)
		}
		fmt.Println("published")
	case "stats":
		resp, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.VolumeID, VolumePath: *path})
		if err != nil {
			die("NodeGetVolumeStats: %v", err)
		}
		for _, u := range resp.Usage {
			fmt.Printf("%s total=%d used=%d available=%d\n", u.Unit, u.Total, u.Used, u.Available)
		}
	case "unpublish":
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeID, TargetPath: *target}); err != nil {
			die("NodeUnpublishVolume: %v", err)
		}
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeID, StagingTargetPath: *staging}); err != nil {
			die("NodeUnstageVolume: %v", err)
		}
		fmt.Println("unpublished")
	case "delete":
		if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeID, Secrets: secrets}); err != nil {
			die("DeleteVolume: %v", err)
		}
		fmt.Println("deleted")
	default:
		die("unknown command %q", cmd)
	}
}
