package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Limits shared by the schema markers below, the webhook and the operator.
// They are named here so the three agree; a marker cannot reference a Go
// constant, so each marker repeats the number and a unit test checks the CRD.
const (
	// DataServersMax bounds the DS count: the MDS keeps per-DS state and the
	// status lists every DS, so the object must stay well under etcd's 1.5 MiB.
	DataServersMax = 256
	// MirrorsMax is the flex-files mirror count the dataplane supports.
	MirrorsMax = 3
	// ClusterNameLengthMax leaves room for the "-mds-0" / "-ds-255" suffixes
	// and the StatefulSet controller's revision hash inside a 63-char label.
	ClusterNameLengthMax = 40
	// StripeUnitBytesMin / Max bound the pNFS stripe unit.
	StripeUnitBytesMin = 4096
	StripeUnitBytesMax = 64 << 20
	// NVMeDevicesPerPodMax bounds the NVMe devices one server pod binds.
	NVMeDevicesPerPodMax = 64
	// ThreadsMax bounds the per-pod event-loop count: chimerad's runtime
	// accepts at most 64 cores (server.cores, dataplane/chimerad/CONFIG.md).
	ThreadsMax = 64
	// AccessRulesMax bounds spec.access; the operator appends its own rules
	// (the nodes, the pod network) and chimerad accepts 256 per export.
	AccessRulesMax = 32
	// AccessClientsPerRuleMax bounds one rule's client list.
	AccessClientsPerRuleMax = 64
	// AnonIDMax is the largest anonymous uid/gid chimerad accepts (2^32-2;
	// 2^32-1 is the "no id" value).
	AnonIDMax = 4294967294
	// MetadataSizeBytesMin is the smallest MDS metadata volume: the diskfs
	// image needs room for its superblocks, log and inode tables.
	MetadataSizeBytesMin = 1 << 30
)

// Transport selects how clients reach the servers.
// +kubebuilder:validation:Enum=tcp;rdma
type Transport string

const (
	TransportTCP  Transport = "tcp"
	TransportRDMA Transport = "rdma"
)

// StorageBackend selects where file data lives.
// +kubebuilder:validation:Enum=memfs;nvme
type StorageBackend string

const (
	// BackendMemFS keeps data in bounded memory: tests, demos, scratch.
	BackendMemFS StorageBackend = "memfs"
	// BackendNVMe keeps data durable with chimerad's diskfs module on the data
	// servers' devices (NVMe through VFIO, or block devices through io_uring)
	// and the namespace on the MDS's metadata volume.
	BackendNVMe StorageBackend = "nvme"
)

// DataServerMode selects the workload kind that runs the data servers.
// +kubebuilder:validation:Enum=StatefulSet;DaemonSet
type DataServerMode string

const (
	// DataServerModeStatefulSet runs `count` DS pods with stable names.
	DataServerModeStatefulSet DataServerMode = "StatefulSet"
	// DataServerModeDaemonSet runs one DS pod on every node the placement selects.
	DataServerModeDaemonSet DataServerMode = "DaemonSet"
)

// HugePageSize names a hugepage size the kubelet exposes as a resource.
// +kubebuilder:validation:Enum="1Gi";"2Mi"
type HugePageSize string

// Placement says where a server pod may run.
type Placement struct {
	// NodeSelector restricts the pods to nodes carrying these labels.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations let the pods run on tainted (dedicated) storage nodes.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Affinity adds node/pod (anti-)affinity rules.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
}

// MetadataServerSpec describes the single metadata server (MDS).
type MetadataServerSpec struct {
	Placement `json:",inline"`
	// Resources of the chimerad container, including hugepages-1Gi / hugepages-2Mi.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// Storage is where the MDS keeps the namespace (directories, inodes,
	// layouts' metadata) with backend nvme: a PersistentVolumeClaim of this
	// StorageClass, mounted into the MDS pod, holding one diskfs image file
	// that chimerad drives as an io_uring device. Required with backend
	// nvme, forbidden with memfs (the namespace then lives in memory), and
	// immutable (a StatefulSet's volume claims cannot change). The claim
	// outlives the cluster: delete it by hand to free the space.
	// +optional
	Storage *MetadataStorageSpec `json:"storage,omitempty"`
}

// MetadataStorageSpec names the PersistentVolume that holds the MDS's diskfs image.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.metadataServer.storage is immutable: the MDS StatefulSet's volume claim cannot change (the namespace lives on it)"
type MetadataStorageSpec struct {
	// StorageClassName of the claim (any class with Filesystem volumes:
	// local-path, a CSI block driver formatted by the kubelet, ...).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	StorageClassName string `json:"storageClassName"`
	// Size of the claim; the diskfs image takes 90 % of it (the rest is the
	// file system's own overhead). At least 1Gi.
	Size resource.Quantity `json:"size"`
}

// DataServersSpec describes the data servers (DS) that hold file data.
// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.mode != 'DaemonSet' || !has(self.count)",message="dataServers.count must not be set when dataServers.mode is DaemonSet (one DS runs per selected node)",fieldPath=".count"
type DataServersSpec struct {
	Placement `json:",inline"`
	// Mode: StatefulSet (count pods) or DaemonSet (one pod per selected node).
	// +kubebuilder:default=StatefulSet
	// +optional
	Mode DataServerMode `json:"mode,omitempty"`
	// Count of DS pods in StatefulSet mode (default 1).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	// +optional
	Count *int32 `json:"count,omitempty"`
	// Resources of the chimerad container, including hugepages-1Gi / hugepages-2Mi.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// NVMeSpec binds the data servers' devices: through a device plugin
// (resourceName), by PCI address on every node (pciAddresses), as block
// devices on every node (devicePaths), or as an image file on a
// PersistentVolume per pod (volumeClaim) — exactly one.
// +kubebuilder:validation:XValidation:rule="(has(self.resourceName) ? 1 : 0) + (has(self.pciAddresses) ? 1 : 0) + (has(self.devicePaths) ? 1 : 0) + (has(self.volumeClaim) ? 1 : 0) == 1",message="storage.nvme: set exactly one of resourceName, pciAddresses, devicePaths or volumeClaim"
type NVMeSpec struct {
	// ResourceName is the device-plugin resource that hands out NVMe VFIO
	// devices, e.g. chimera.io/nvme (the SR-IOV network device plugin's
	// `accelerator` resources bound to vfio-pci). The plugin names the PCI
	// addresses it gave a container in PCIDEVICE_<RESOURCE> (the resource
	// name upper-cased, `.` `/` `-` as `_`); the DS pod's entrypoint writes
	// them into chimerad's config as vfio devices at start.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ResourceName string `json:"resourceName,omitempty"`
	// DevicesPerPod is how many devices each server pod requests from the plugin.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +kubebuilder:default=1
	// +optional
	DevicesPerPod int32 `json:"devicesPerPod,omitempty"`
	// PCIAddresses lists the NVMe controllers (domain:bus:device.function) each
	// server pod drives, when no device plugin is used.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	PCIAddresses []PCIAddress `json:"pciAddresses,omitempty"`
	// DevicePaths lists block devices (e.g. /dev/nvme0n1) each server pod
	// drives through io_uring with O_DIRECT, the same paths on every node.
	// The devices are mounted from the host, which needs a privileged
	// container (the device cgroup), as pciAddresses does.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	DevicePaths []DevicePath `json:"devicePaths,omitempty"`
	// VolumeClaim gives each data-server pod a PersistentVolume of its own
	// (a volume claim template of the DS StatefulSet, kept when the cluster
	// is deleted) holding a diskfs image file that chimerad drives through
	// io_uring with O_DIRECT, as the MDS keeps its namespace: durable data
	// where no NVMe device can be handed to chimerad (kind, clusters whose
	// nodes' disks are offered through a local-volume StorageClass). The
	// pods need no privilege. StatefulSet mode only.
	// +optional
	VolumeClaim *DataVolumeClaimSpec `json:"volumeClaim,omitempty"`
}

// DataVolumeClaimSpec is each data-server pod's PersistentVolume.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="storage.nvme.volumeClaim is immutable: the DS StatefulSet's volume claim template cannot change (the data lives on it)"
type DataVolumeClaimSpec struct {
	// StorageClassName of the claims (Filesystem volumes).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	StorageClassName string `json:"storageClassName"`
	// Size of each claim; the diskfs image takes 90 % of it. At least 1Gi.
	Size resource.Quantity `json:"size"`
}

// DevicePath is an absolute block-device path under /dev.
// +kubebuilder:validation:Pattern=`^/dev/[A-Za-z0-9][A-Za-z0-9._/:-]*$`
// +kubebuilder:validation:MaxLength=255
type DevicePath string

// DiskfsSpec tunes chimerad's durable backend (server.vfs.diskfs.config).
type DiskfsSpec struct {
	// Initialize lets a data server format its devices at start when they
	// hold no diskfs format (blank devices). A device holding this file
	// system's format is recovered, never reformatted; one holding another
	// file system's is refused (dataplane/chimerad/CONFIG.md). The MDS's
	// image file is formatted by its start script while it was never
	// formatted (its first MiB all zeros), whatever this says.
	// +optional
	Initialize bool `json:"initialize,omitempty"`
	// BlockCacheBlocks bounds the metadata block cache, in 4 KiB blocks
	// (data blocks are never cached). Default: chimerad's (65536).
	// +kubebuilder:validation:Minimum=256
	// +kubebuilder:validation:Maximum=268435456
	// +optional
	BlockCacheBlocks int64 `json:"blockCacheBlocks,omitempty"`
	// InodeCacheInodes bounds the inode cache. Default: chimerad's (65536).
	// +kubebuilder:validation:Minimum=64
	// +kubebuilder:validation:Maximum=268435456
	// +optional
	InodeCacheInodes int64 `json:"inodeCacheInodes,omitempty"`
}

// PCIAddress is a PCI function address such as 0000:3b:00.0.
// +kubebuilder:validation:Pattern=`^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$`
type PCIAddress string

// StorageSpec selects the backend and the devices behind it.
// +kubebuilder:validation:XValidation:rule="!has(self.backend) || self.backend != 'nvme' || has(self.nvme)",message="storage.nvme is required when storage.backend is nvme",fieldPath=".nvme"
// +kubebuilder:validation:XValidation:rule="!has(self.nvme) || (has(self.backend) && self.backend == 'nvme')",message="storage.nvme is only valid when storage.backend is nvme",fieldPath=".nvme"
type StorageSpec struct {
	// Backend: memfs (bounded memory, lost on restart) or nvme (durable:
	// chimerad's diskfs on the data servers' devices, the namespace on the
	// MDS's metadata volume, spec.metadataServer.storage).
	// +kubebuilder:default=memfs
	// +optional
	Backend StorageBackend `json:"backend,omitempty"`
	// MemfsCapacityBytes bounds the memory the memfs backend may use per pod.
	// +kubebuilder:validation:Minimum=1048576
	// +kubebuilder:default=1073741824
	// +optional
	MemfsCapacityBytes int64 `json:"memfsCapacityBytes,omitempty"`
	// NVMe devices, required for backend nvme.
	// +optional
	NVMe *NVMeSpec `json:"nvme,omitempty"`
	// Diskfs tunes the durable backend (backend nvme only).
	// +optional
	Diskfs *DiskfsSpec `json:"diskfs,omitempty"`
}

// NetworkSpec says how clients and servers talk.
// +kubebuilder:validation:XValidation:rule="!has(self.transport) || self.transport != 'rdma' || has(self.rdmaResourceName)",message="network.rdmaResourceName is required when network.transport is rdma",fieldPath=".rdmaResourceName"
type NetworkSpec struct {
	// Transport: tcp, or rdma (RPC-over-RDMA v1 with TCP fallback).
	// +kubebuilder:default=tcp
	// +optional
	Transport Transport `json:"transport,omitempty"`
	// Port the NFS service listens on (default 2049 for tcp, 20049 for rdma).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// TOS is the IP type-of-service / RoCE traffic class (e.g. 104 for a
	// lossless RoCE priority).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	// +optional
	TOS *int32 `json:"tos,omitempty"`
	// NetworkAttachment is the Multus NetworkAttachmentDefinition ([namespace/]name)
	// of the storage network; DS addresses on it are what clients are told.
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NetworkAttachment string `json:"networkAttachment,omitempty"`
	// RDMAResourceName is the device-plugin resource of the RDMA / SR-IOV VF
	// (e.g. rdma/roce_a or nvidia.com/cx7_vf).
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	// +kubebuilder:validation:MaxLength=253
	// +optional
	RDMAResourceName string `json:"rdmaResourceName,omitempty"`
	// PodNetworkCIDRs are pod-network ranges admitted to the exports
	// (read-write, no root squash) besides the Nodes' own spec.podCIDRs,
	// which are always admitted: name the pod network here when the CNI
	// allocates addresses from its own pools rather than the nodes' ranges
	// (Calico IPAM, Cilium cluster-pool, a static bridge subnet) and
	// sidecar-mode clients or kernel clients reaching pods through the CNI
	// must mount.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=64
	// +listType=set
	// +optional
	PodNetworkCIDRs []string `json:"podNetworkCIDRs,omitempty"`
}

// AccessType is what a client may do with the exports.
// +kubebuilder:validation:Enum=rw;ro;none
type AccessType string

const (
	AccessRW   AccessType = "rw"
	AccessRO   AccessType = "ro"
	AccessNone AccessType = "none"
)

// Squash says whose identity a client's calls run with.
// +kubebuilder:validation:Enum=root_squash;all_squash;no_root_squash
type Squash string

const (
	SquashRoot   Squash = "root_squash"
	SquashAll    Squash = "all_squash"
	SquashNoRoot Squash = "no_root_squash"
)

// AccessRule admits (or refuses) clients to the cluster's exports, as
// chimerad's exports.<name>.access rules (dataplane/chimerad/CONFIG.md).
type AccessRule struct {
	// Clients: IPv4/IPv6 addresses, CIDRs (no host bits below the prefix),
	// or "*" for every client. Host names are not resolved.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=64
	Clients []string `json:"clients"`
	// Access: rw, ro (every change refused with ROFS) or none (refused).
	// +kubebuilder:default=rw
	// +optional
	Access AccessType `json:"access,omitempty"`
	// Squash: root_squash (default, uid 0 runs as anonUid), all_squash or
	// no_root_squash.
	// +kubebuilder:default=root_squash
	// +optional
	Squash Squash `json:"squash,omitempty"`
	// AnonUID is the squashed uid (default 65534).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967294
	// +optional
	AnonUID *int64 `json:"anonUid,omitempty"`
	// AnonGID is the squashed gid (default 65534).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967294
	// +optional
	AnonGID *int64 `json:"anonGid,omitempty"`
}

// PNFSSpec shapes flex-files layouts.
// +kubebuilder:validation:XValidation:rule="!has(self.stripeUnitBytes) || self.stripeUnitBytes % 4096 == 0",message="pnfs.stripeUnitBytes must be a multiple of 4096",fieldPath=".stripeUnitBytes"
type PNFSSpec struct {
	// StripeUnitBytes is the bytes written to one DS before moving to the next.
	// +kubebuilder:validation:Minimum=4096
	// +kubebuilder:validation:Maximum=67108864
	// +kubebuilder:default=1048576
	// +optional
	StripeUnitBytes int64 `json:"stripeUnitBytes,omitempty"`
	// Mirrors is how many DSes hold a copy of each stripe (1 = no mirroring).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3
	// +kubebuilder:default=1
	// +optional
	Mirrors int32 `json:"mirrors,omitempty"`
}

// TuningSpec carries chimerad's performance knobs.
type TuningSpec struct {
	// Threads is the number of per-core event loops in each server pod
	// (default: chimerad picks the CPUs it is given). At most 64, the bound
	// chimerad itself accepts (server.threads / server.cores): its metrics
	// keep per-core counter shards allocated up front for 64 cores. The
	// reference deployment ran 80 loops per server; raising this maximum
	// needs chimerad's bound raised first.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	Threads int32 `json:"threads,omitempty"`
	// PinCores pins each event loop to its own CPU of the pod's cpuset
	// (chimerad server.pin_cores). Meant for pods with dedicated CPUs (the
	// kubelet's static CPU manager and Guaranteed QoS: integer CPU requests
	// equal to limits); left to the scheduler, busy polling loops can be
	// stacked on one CPU and take turns of whole time slices.
	// +optional
	PinCores bool `json:"pinCores,omitempty"`
	// HugePageSize backs chimerad's buffer pools with hugepages of this size;
	// the pod must then request hugepages-<size> in its resources.
	// +optional
	HugePageSize HugePageSize `json:"hugePageSize,omitempty"`
	// SlabBytes is the buffer-pool slab size (one I/O buffer).
	// +kubebuilder:validation:Minimum=4096
	// +kubebuilder:validation:Maximum=16777216
	// +optional
	SlabBytes int64 `json:"slabBytes,omitempty"`
	// SlabCount is the buffer-pool slab count per event loop.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1048576
	// +optional
	SlabCount int32 `json:"slabCount,omitempty"`
}

// ChimeraClusterSpec is the desired state of a Chimera storage cluster.
// +kubebuilder:validation:XValidation:rule="!has(self.storage) || !has(self.storage.backend) || self.storage.backend != 'nvme' || (has(self.metadataServer) && has(self.metadataServer.storage))",message="spec.metadataServer.storage is required when storage.backend is nvme (the MDS keeps its namespace on that PersistentVolume)",fieldPath=".metadataServer.storage"
// +kubebuilder:validation:XValidation:rule="!has(self.storage) || !has(self.storage.nvme) || !has(self.storage.nvme.volumeClaim) || !has(self.dataServers) || !has(self.dataServers.mode) || self.dataServers.mode != 'DaemonSet'",message="storage.nvme.volumeClaim needs dataServers.mode StatefulSet (a DaemonSet has no volume claims)",fieldPath=".storage.nvme.volumeClaim"
type ChimeraClusterSpec struct {
	// Image of chimerad (the dataplane server).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`
	// ImagePullPolicy of the server pods.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +kubebuilder:default=IfNotPresent
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// MetadataServer placement and resources.
	// +optional
	MetadataServer MetadataServerSpec `json:"metadataServer,omitempty"`
	// DataServers placement, count and resources.
	// +optional
	// +kubebuilder:default={}
	DataServers DataServersSpec `json:"dataServers,omitempty"`
	// Storage backend and devices.
	// +optional
	// +kubebuilder:default={}
	Storage StorageSpec `json:"storage,omitempty"`
	// Network transport, port and storage network.
	// +optional
	// +kubebuilder:default={}
	Network NetworkSpec `json:"network,omitempty"`
	// PNFS layout shape.
	// +optional
	// +kubebuilder:default={}
	PNFS PNFSSpec `json:"pnfs,omitempty"`
	// Tuning of chimerad.
	// +optional
	Tuning TuningSpec `json:"tuning,omitempty"`
	// Access widens (or narrows) who may mount the exports. The operator
	// keeps the exports open to every Node's InternalIP/ExternalIP and pod
	// range (spec.podCIDRs) (read-write, no root squash: the kernel client
	// mounts from the host) and to spec.network.podNetworkCIDRs, following
	// nodes as they join and leave; anyone else is refused. These rules
	// come first and the first rule naming a client decides, so a rule here
	// overrides the nodes' default.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Access []AccessRule `json:"access,omitempty"`
	// Rollout governs how a new revision (spec.image or anything rendered
	// into chimerad's config) reaches the running servers: the operator
	// replaces the data servers one at a time (drained through the MDS admin
	// API first, undrained once the new pod is ready and the MDS sees it
	// healthy), then the MDS.
	// +optional
	// +kubebuilder:default={}
	Rollout RolloutSpec `json:"rollout,omitempty"`
	// AdminTLS chooses who issues the MDS admin API's server certificate:
	// the operator's own admin CA (the default), or cert-manager through
	// an issuer named here.
	// +optional
	AdminTLS AdminTLSSpec `json:"adminTLS,omitempty"`
}

// AdminTLSSpec: where the MDS admin API's server certificate comes from.
type AdminTLSSpec struct {
	// IssuerRef names a cert-manager Issuer (in the cluster's namespace) or
	// ClusterIssuer. When set, the operator keeps a cert-manager
	// Certificate <cluster>-admin-tls (owned by this cluster) for the MDS
	// Service and pod names, whose Secret <cluster>-admin-tls the MDS
	// mounts; the operator and the CSI controller then trust only that
	// Secret's ca.crt for this cluster, so the issuer must fill ca.crt (a CA
	// or self-signed issuer does; ACME does not). The servers are not
	// started until the Secret holds a certificate for those names that
	// verifies against its ca.crt (condition AdminTLSReady). Unset: the
	// operator's own admin CA signs the certificate.
	// +optional
	IssuerRef *IssuerReference `json:"issuerRef,omitempty"`
}

// IssuerReference names a cert-manager issuer (its ObjectReference shape).
type IssuerReference struct {
	// Name of the Issuer or ClusterIssuer.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
	// Kind of the issuer: Issuer (namespaced, in the cluster's namespace) or
	// ClusterIssuer.
	// +kubebuilder:validation:Enum=Issuer;ClusterIssuer
	// +kubebuilder:default=Issuer
	// +optional
	Kind string `json:"kind,omitempty"`
	// Group of the issuer's API.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:default=cert-manager.io
	// +optional
	Group string `json:"group,omitempty"`
}

// Defaults of an IssuerReference (the schema fills them in).
const (
	IssuerKindIssuer        = "Issuer"
	IssuerKindClusterIssuer = "ClusterIssuer"
	IssuerGroupCertManager  = "cert-manager.io"
)

// RolloutSpec bounds the steps of a rolling update and says whether a memfs
// MDS may be restarted.
type RolloutSpec struct {
	// AllowMemfsMetadataServerRestart lets the rollout restart the MDS when
	// storage.backend is memfs. A memfs MDS keeps the namespace in memory:
	// restarting it LOSES EVERY FILE AND VOLUME. Without this, the rollout
	// stops before the MDS (condition UpToDate=False, reason
	// MetadataServerRestartRefused) and the MDS keeps its old revision until
	// a human deletes its pod or sets this. Ignored with backend nvme, whose
	// MDS keeps the namespace on its metadata volume and is always rolled.
	// +optional
	AllowMemfsMetadataServerRestart bool `json:"allowMemfsMetadataServerRestart,omitempty"`
	// PodReadyTimeoutSeconds bounds how long a replaced pod may take to be
	// ready (and, for a data server, seen healthy by the MDS). Past it the
	// rollout stops with UpToDate=False, reason RolloutFailed, naming the
	// pod and the step.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:default=600
	// +optional
	PodReadyTimeoutSeconds int32 `json:"podReadyTimeoutSeconds,omitempty"`
	// DrainTimeoutSeconds bounds how long a draining data server may still
	// be named by layouts clients hold (the MDS recalls them when the drain
	// starts). Past it the rollout stops, the data server left draining.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:default=300
	// +optional
	DrainTimeoutSeconds int32 `json:"drainTimeoutSeconds,omitempty"`
	// ResyncTimeoutSeconds bounds how long the rollout waits, after a data
	// server came back, for the MDS to resync the mirror copies that went
	// stale while it was away (no data server reports staleCopies) before
	// it drains the next one — which may hold the only good copy. Past it
	// the rollout stops, naming the data servers with stale copies.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:default=1800
	// +optional
	ResyncTimeoutSeconds int32 `json:"resyncTimeoutSeconds,omitempty"`
}

// RolloutStep names what the rollout is doing to status.rollout.pod.
// +kubebuilder:validation:Enum=Drain;Restart;WaitReady;Undrain;Resync
type RolloutStep string

const (
	// RolloutStepDrain: the DS is marked draining at the MDS; waiting until
	// no layout names it.
	RolloutStepDrain RolloutStep = "Drain"
	// RolloutStepRestart: the pod is being deleted (its StatefulSet or
	// DaemonSet controller creates it again from the new template).
	RolloutStepRestart RolloutStep = "Restart"
	// RolloutStepWaitReady: waiting for the new pod to be ready (and, for a
	// DS, healthy at the MDS).
	RolloutStepWaitReady RolloutStep = "WaitReady"
	// RolloutStepUndrain: telling the MDS the DS may take layouts again.
	RolloutStepUndrain RolloutStep = "Undrain"
	// RolloutStepResync: the DS is back; waiting until the MDS reports no
	// stale mirror copy on any data server (the copies that missed writes
	// while it was away are resynced) before the next DS may go.
	RolloutStepResync RolloutStep = "Resync"
)

// RolloutStatus is the progress of bringing every server pod to Revision.
type RolloutStatus struct {
	// Revision every server pod should run: a hash of spec.image and the
	// rendered chimerad config (pods carry theirs in the
	// storage.chimera.io/revision annotation).
	Revision string `json:"revision"`
	// Pod being replaced now (empty between pods and when done).
	// +optional
	Pod string `json:"pod,omitempty"`
	// Step of Pod.
	// +optional
	Step RolloutStep `json:"step,omitempty"`
	// StepStartTime is when Step began (its timeout counts from here).
	// +optional
	StepStartTime *metav1.Time `json:"stepStartTime,omitempty"`
	// PodUID of the pod the Restart step deleted: its replacement has another.
	// +optional
	PodUID string `json:"podUID,omitempty"`
	// DataServersUpdated counts data-server pods running Revision.
	DataServersUpdated int32 `json:"dataServersUpdated"`
	// DataServers counts data-server pods.
	DataServers int32 `json:"dataServers"`
	// MetadataServerUpdated: the MDS pod runs Revision.
	MetadataServerUpdated bool `json:"metadataServerUpdated"`
	// Failure says which step of which pod failed and why; the rollout
	// stays stopped until the revision changes (or the failed pod becomes
	// ready at Revision by itself).
	// +optional
	Failure string `json:"failure,omitempty"`
}

// DataServerStatus reports one data server as the MDS is told about it.
type DataServerStatus struct {
	// Pod name.
	Pod string `json:"pod"`
	// Node the pod runs on.
	// +optional
	Node string `json:"node,omitempty"`
	// StorageAddress is the DS address on the storage network (the Multus
	// attachment's IP, or the pod IP without Multus).
	// +optional
	StorageAddress string `json:"storageAddress,omitempty"`
	// Ready is the pod's Ready condition.
	Ready bool `json:"ready"`
}

// Phase summarises the cluster for humans; conditions carry the detail.
// +kubebuilder:validation:Enum=Pending;Progressing;Available;Degraded;Deleting
type Phase string

const (
	PhasePending     Phase = "Pending"
	PhaseProgressing Phase = "Progressing"
	PhaseAvailable   Phase = "Available"
	PhaseDegraded    Phase = "Degraded"
	PhaseDeleting    Phase = "Deleting"
)

// Condition types.
const (
	ConditionAvailable   = "Available"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
	// ConditionUpToDate: every server pod runs status.rollout.revision.
	// False while rolling (RollingOut), when a step failed (RolloutFailed)
	// and when only a memfs MDS is left (MetadataServerRestartRefused).
	ConditionUpToDate = "UpToDate"
	// ConditionAdminTLSReady: the MDS admin API's certificate Secret holds
	// a certificate for the MDS names. False while cert-manager has not
	// issued it (WaitingForCertificate) or cert-manager is not installed
	// (CertManagerNotInstalled): the servers are not started meanwhile.
	ConditionAdminTLSReady = "AdminTLSReady"
)

// ChimeraClusterStatus is the observed state.
type ChimeraClusterStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarises the conditions.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// Conditions: Available, Progressing, Degraded, UpToDate, AdminTLSReady.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// MetadataServerEndpoint is host:port of the MDS NFS service.
	// +optional
	MetadataServerEndpoint string `json:"metadataServerEndpoint,omitempty"`
	// DataServersReady counts ready DS pods.
	// +optional
	DataServersReady int32 `json:"dataServersReady,omitempty"`
	// DataServersDesired counts the DS pods that should exist.
	// +optional
	DataServersDesired int32 `json:"dataServersDesired,omitempty"`
	// DataServers lists every DS pod.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	DataServers []DataServerStatus `json:"dataServers,omitempty"`
	// Rollout is the progress of the rolling update to the current revision.
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`
}

// ChimeraCluster is a Chimera pNFS storage cluster: one MDS and its DSes.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=chimera;cc,categories=chimera
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready DS",type=integer,JSONPath=`.status.dataServersReady`
// +kubebuilder:printcolumn:name="Desired DS",type=integer,JSONPath=`.status.dataServersDesired`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.metadataServerEndpoint`
// +kubebuilder:printcolumn:name="Updated DS",type=integer,JSONPath=`.status.rollout.dataServersUpdated`,priority=1
// +kubebuilder:printcolumn:name="Rollout",type=string,JSONPath=`.status.conditions[?(@.type=="UpToDate")].reason`,priority=1
// +kubebuilder:printcolumn:name="Transport",type=string,JSONPath=`.spec.network.transport`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 40",message="metadata.name must be at most 40 characters (child object names add suffixes)"
type ChimeraCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   ChimeraClusterSpec   `json:"spec"`
	Status ChimeraClusterStatus `json:"status,omitempty"`
}

// ChimeraClusterList is a list of ChimeraCluster.
//
// +kubebuilder:object:root=true
type ChimeraClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ChimeraCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ChimeraCluster{}, &ChimeraClusterList{})
}

// NVMeResourceNameOrEmpty returns the NVMe device-plugin resource name, if any.
func (s StorageSpec) NVMeResourceNameOrEmpty() string {
	if s.NVMe == nil {
		return ""
	}
	return s.NVMe.ResourceName
}
