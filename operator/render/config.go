package render

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
)

// The chimerad config schema (dataplane/chimerad/CONFIG.md), as far as the
// operator writes it. Struct fields keep the rendered JSON in a fixed order so
// the config hash only changes when the content does.

type serverConfig struct {
	Common  commonSection            `json:"common"`
	Server  serverSection            `json:"server"`
	Mounts  map[string]mountSection  `json:"mounts"`
	Exports map[string]exportSection `json:"exports"`
	Volumes *volumesSection          `json:"volumes,omitempty"`
	Admin   *adminSection            `json:"admin,omitempty"`
	Metrics metricsSection           `json:"metrics"`
}

type commonSection struct {
	LogLevel  string `json:"log_level"`
	LogFormat string `json:"log_format"`
	// Reference-format tuning keys: this chimerad build accepts them with a
	// warning; they are written so the config is right once it implements them.
	HugePages    *bool  `json:"huge_pages,omitempty"`
	HugePageSize string `json:"huge_page_size,omitempty"`
	SlabSize     int64  `json:"slab_size,omitempty"`
	// RDMACMTOS is the IP TOS (RoCE traffic class) of RDMA connections,
	// spec.network.tos; only rendered with transport rdma.
	RDMACMTOS *int32 `json:"rdmacm_tos,omitempty"`
}

type serverSection struct {
	Role        string       `json:"role"`
	Bind        string       `json:"bind"`
	Cores       int32        `json:"cores,omitempty"`
	PinCores    bool         `json:"pin_cores,omitempty"`
	NFSPort     int32        `json:"nfs_port"`
	MountPort   int32        `json:"mount_port"`
	PortmapPort int32        `json:"portmap_port"`
	RDMA        bool         `json:"rdma"`
	RDMAPort    int32        `json:"rdma_port,omitempty"`
	PNFS        *pnfsSection `json:"pnfs,omitempty"`
	VFS         *vfsSection  `json:"vfs,omitempty"`
}

// vfsSection is server.vfs: only diskfs has settings.
type vfsSection struct {
	Diskfs diskfsModule `json:"diskfs"`
}

type diskfsModule struct {
	Config diskfsConfig `json:"config"`
}

// diskfsConfig is server.vfs.diskfs.config. Devices is a []diskfsDevice, or
// the placeholder string DevicesPlaceholder that the pod's entrypoint
// replaces with the device plugin's PCI addresses (see StartScript).
type diskfsConfig struct {
	Initialize       bool  `json:"initialize"`
	BlockCacheBlocks int64 `json:"block_cache_blocks,omitempty"`
	InodeCacheInodes int64 `json:"inode_cache_inodes,omitempty"`
	Devices          any   `json:"devices"`
}

type diskfsDevice struct {
	Type string `json:"type"`
	Path string `json:"path"`
}

type pnfsSection struct {
	Enabled         bool          `json:"enabled"`
	StripeUnitBytes int64         `json:"stripe_unit_bytes"`
	Mirrors         int32         `json:"mirrors"`
	DataServers     []interface{} `json:"data_servers"`
}

type mountSection struct {
	Module        string `json:"module"`
	Path          string `json:"path"`
	CapacityBytes int64  `json:"capacity_bytes,omitempty"`
}

// exportSection: Access nil means no rules (open to every client, the DS
// role's case); a non-nil empty list means nobody.
type exportSection struct {
	Path   string        `json:"path"`
	Access *[]AccessRule `json:"access,omitempty"`
}

type volumesSection struct {
	Path string `json:"path"`
}

type adminSection struct {
	Bind      string           `json:"bind"`
	Port      int32            `json:"port"`
	TokenFile string           `json:"token_file"`
	TLS       *adminTLSSection `json:"tls"`
}

type adminTLSSection struct {
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
}

type metricsSection struct {
	Bind string `json:"bind"`
	Port int32  `json:"port"`
}

// MountName is the namespace's one mount; ExportPath is what clients mount.
const (
	MountName  = "data"
	ExportPath = "/data"
)

// RenderConfig returns chimerad's JSON config for one role ("mds" or "ds").
//
// The MDS starts with an empty data-server list: the operator pushes the live
// list through PUT /api/v1/dataservers once DS pods have storage addresses.
// The portmapper is off (port 0) because clients name ports explicitly and
// port 111 would collide with a host rpcbind under hostNetwork setups.
//
// access is the MDS export's client rules (ExportAccess); nil renders none.
// They are in the config so a restarted MDS starts from the current list,
// but they are left out of the config hash: the operator pushes rule changes
// through the admin API, and node churn must not restart the servers.
//
// With backend nvme the DS config's devices may be the placeholder string
// DevicesPlaceholder (device-plugin mode): it is then a template that the
// pod's entrypoint (StartScript) completes, not a config chimerad can read.
func RenderConfig(c *chimerav1.ChimeraCluster, role string, access []AccessRule) ([]byte, error) {
	if role != ComponentMDS && role != ComponentDS {
		return nil, fmt.Errorf("render: unknown role %q (want mds or ds)", role)
	}
	cfg := serverConfig{
		Common: commonSection{LogLevel: "info", LogFormat: "json"},
		Server: serverSection{
			Role:        role,
			Bind:        "0.0.0.0",
			Cores:       c.Spec.Tuning.Threads,
			PinCores:    c.Spec.Tuning.PinCores,
			NFSPort:     TCPPort(c),
			MountPort:   PortMount,
			PortmapPort: 0,
		},
		Mounts:  map[string]mountSection{MountName: mountFor(c)},
		Exports: map[string]exportSection{ExportPath: {Path: "/" + MountName}},
		Metrics: metricsSection{Bind: "0.0.0.0", Port: PortMetrics},
	}
	if Transport(c) == chimerav1.TransportRDMA {
		// chimerad serves RPC-over-RDMA v1 on rdma_port and NFS over TCP on
		// nfs_port beside it (the TCP fallback). rdma_hostname stays unset:
		// it defaults to server.bind, 0.0.0.0, which listens on every RDMA
		// device, the Multus RoCE interface included. The config is one per
		// role, rendered before any pod has its Multus address.
		cfg.Server.RDMA = true
		cfg.Server.RDMAPort = ClientPort(c)
		if tos := c.Spec.Network.TOS; tos != nil {
			v := *tos
			cfg.Common.RDMACMTOS = &v
		}
	}
	if hp := c.Spec.Tuning.HugePageSize; hp != "" {
		t := true
		cfg.Common.HugePages = &t
		cfg.Common.HugePageSize = map[chimerav1.HugePageSize]string{"1Gi": "1G", "2Mi": "2M"}[hp]
	}
	cfg.Common.SlabSize = c.Spec.Tuning.SlabBytes
	if role == ComponentMDS {
		cfg.Server.PNFS = &pnfsSection{
			Enabled:         true,
			StripeUnitBytes: orDefault64(c.Spec.PNFS.StripeUnitBytes, StripeUnitBytes),
			Mirrors:         orDefault32(c.Spec.PNFS.Mirrors, 1),
			DataServers:     []interface{}{},
		}
		cfg.Volumes = &volumesSection{Path: "/" + MountName + "/volumes"}
		cfg.Admin = &adminSection{
			Bind: "0.0.0.0", Port: PortAdmin, TokenFile: AdminTokenDir + "/" + SecretKeyToken,
			TLS: &adminTLSSection{CertFile: AdminTLSDir + "/" + corev1.TLSCertKey, KeyFile: AdminTLSDir + "/" + corev1.TLSPrivateKeyKey},
		}
		if access != nil {
			cfg.Exports[ExportPath] = exportSection{Path: "/" + MountName, Access: &access}
		}
	}
	if c.Spec.Storage.Backend == chimerav1.BackendNVMe {
		cfg.Server.VFS = &vfsSection{Diskfs: diskfsModule{Config: diskfsFor(c, role)}}
	}
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("render: config: %w", err)
	}
	return append(out, '\n'), nil
}

func mountFor(c *chimerav1.ChimeraCluster) mountSection {
	if c.Spec.Storage.Backend == chimerav1.BackendNVMe {
		return mountSection{Module: "diskfs", Path: "/"}
	}
	return mountSection{Module: "memfs", Path: "/", CapacityBytes: orDefault64(c.Spec.Storage.MemfsCapacityBytes, MemfsBytesDefault)}
}

// diskfsFor renders server.vfs.diskfs.config. The MDS's one device is the
// image file on its metadata volume; a DS drives the devices of
// spec.storage.nvme: PCI addresses (vfio), block-device paths (io_uring), the
// image file on its own volume (io_uring), or the device plugin's, known only
// inside the pod (the placeholder).
func diskfsFor(c *chimerav1.ChimeraCluster, role string) diskfsConfig {
	d := diskfsConfig{}
	if t := c.Spec.Storage.Diskfs; t != nil {
		d.Initialize = t.Initialize
		d.BlockCacheBlocks = t.BlockCacheBlocks
		d.InodeCacheInodes = t.InodeCacheInodes
	}
	if role == ComponentMDS {
		// The start script formats the image while it was never formatted
		// (StartScript); spec.storage.diskfs.initialize is the DSes' only.
		d.Initialize = false
		d.Devices = []diskfsDevice{{Type: "io_uring", Path: MetadataImagePath}}
		return d
	}
	n := c.Spec.Storage.NVMe
	devs := []diskfsDevice{}
	switch {
	case n == nil:
		// The webhook requires storage.nvme with backend nvme; an empty list
		// makes chimerad refuse the config, naming the key.
	case n.ResourceName != "":
		d.Devices = DevicesPlaceholder
		return d
	case n.VolumeClaim != nil:
		// As the MDS's image: the start script formats it while blank.
		d.Initialize = false
		devs = append(devs, diskfsDevice{Type: "io_uring", Path: DataImagePath})
	case len(n.PCIAddresses) > 0:
		for _, a := range n.PCIAddresses {
			devs = append(devs, diskfsDevice{Type: "vfio", Path: string(a)})
		}
	default:
		for _, p := range n.DevicePaths {
			devs = append(devs, diskfsDevice{Type: "io_uring", Path: string(p)})
		}
	}
	d.Devices = devs
	return d
}

// ConfigHash is a short digest of the rendered configs, put on the pod
// template so a config change rolls the pods.
func ConfigHash(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Revision names what a server pod runs: the image and the config hash
// (ConfigHash of the rendered configs, export client rules left out). Pods
// whose AnnotationRevision differs are replaced by the rollout. Other pod
// template changes (resources, placement) reach a pod when it is next
// replaced.
func Revision(image, configHash string) string {
	return ConfigHash([]byte(image), []byte(configHash))
}

func orDefault64(v, d int64) int64 {
	if v == 0 {
		return d
	}
	return v
}

func orDefault32(v, d int32) int32 {
	if v == 0 {
		return d
	}
	return v
}
