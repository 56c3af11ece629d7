// Package render holds the pure functions that turn a ChimeraCluster into the
// objects the operator applies (ConfigMap with chimerad's config, admin-token
// Secret, StatefulSets/DaemonSet, headless Services, PodDisruptionBudgets) and
// that compute status from what was observed. Nothing here talks to a server,
// so every builder is unit-tested with plain values.
package render

import (
	"fmt"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
)

// Ports chimerad listens on inside the pod (CONFIG.md defaults).
const (
	PortNFSDefault    = 2049
	PortRDMADefault   = 20049
	PortMount         = 20048
	PortAdmin         = 8080
	PortMetrics       = 9000
	StripeUnitBytes   = 1 << 20
	MemfsBytesDefault = 1 << 30
)

// Labels every child carries; the selector labels never change after creation
// (StatefulSet and DaemonSet selectors are immutable).
const (
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelComponent = "app.kubernetes.io/component"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelCluster   = "storage.chimera.io/cluster"

	ComponentMDS = "mds"
	ComponentDS  = "ds"
	ManagedBy    = "chimera-operator"

	// AnnotationNetworks asks Multus for the storage-network attachment.
	AnnotationNetworks = "k8s.v1.cni.cncf.io/networks"
	// AnnotationNetworkStatus is where Multus reports the attachment's IPs.
	AnnotationNetworkStatus = "k8s.v1.cni.cncf.io/network-status"
	// AnnotationConfigHash rolls the pods when the rendered config changes.
	AnnotationConfigHash = "storage.chimera.io/config-hash"
	// AnnotationRevision is the revision (image + rendered config) a server
	// pod was created from; the rollout replaces pods whose revision is not
	// the current one.
	AnnotationRevision = "storage.chimera.io/revision"

	// ConfigKeyMDS / ConfigKeyDS are the ConfigMap keys of the two configs.
	ConfigKeyMDS = "mds.json"
	ConfigKeyDS  = "ds.json"
	// SecretKeyToken is the admin-token Secret's key.
	SecretKeyToken = "token"
	// SecretKeyCA is the CA certificate's key in the admin TLS Secret.
	SecretKeyCA = "ca.crt"

	// Mount paths inside the server pods.
	ConfigDir     = "/etc/chimera/config"
	AdminTokenDir = "/etc/chimera/admin"
	// AdminTLSDir holds the MDS's admin server certificate (tls.crt,
	// tls.key, ca.crt: the AdminTLSSecret).
	AdminTLSDir  = "/etc/chimera/admin-tls"
	HugePagesDir = "/dev/hugepages"
	VFIODir      = "/dev/vfio"
)

// Names of the children of one cluster.
func ConfigMapName(c *chimerav1.ChimeraCluster) string   { return c.Name + "-config" }
func AdminSecretName(c *chimerav1.ChimeraCluster) string { return c.Name + "-admin-token" }

// AdminTLSSecretName is the Secret (kubernetes.io/tls) with the MDS's admin
// server certificate, issued by the operator's admin CA or, when the cluster
// names an issuer, by cert-manager (AdminCertificate).
func AdminTLSSecretName(c *chimerav1.ChimeraCluster) string { return c.Name + "-admin-tls" }
func MDSName(c *chimerav1.ChimeraCluster) string            { return c.Name + "-mds" }
func DSName(c *chimerav1.ChimeraCluster) string             { return c.Name + "-ds" }

// MDSAdminURL is the in-cluster admin API base URL of the MDS.
func MDSAdminURL(c *chimerav1.ChimeraCluster) string {
	return fmt.Sprintf("https://%s-0.%s.%s.svc:%d", MDSName(c), MDSName(c), c.Namespace, PortAdmin)
}

// MDSAdminServerName is the name admin clients verify the MDS's certificate
// against, whatever address they dial (the operator dials the pod IP): the
// MDS Service's DNS name, which is also what the CSI driver dials for a
// StorageClass naming the cluster.
func MDSAdminServerName(c *chimerav1.ChimeraCluster) string {
	return fmt.Sprintf("%s.%s.svc", MDSName(c), c.Namespace)
}

// AdminTLSNames are the names the MDS's admin certificate carries: its
// Service and its pod (StatefulSet ordinal 0) in every form a client in the
// cluster may use.
func AdminTLSNames(c *chimerav1.ChimeraCluster) []string {
	svc, pod := MDSName(c), MDSName(c)+"-0"
	return []string{
		MDSAdminServerName(c),
		svc, svc + "." + c.Namespace, svc + "." + c.Namespace + ".svc.cluster.local",
		pod + "." + svc + "." + c.Namespace + ".svc", pod + "." + svc + "." + c.Namespace + ".svc.cluster.local",
	}
}

// MDSEndpoint is host:port clients mount.
func MDSEndpoint(c *chimerav1.ChimeraCluster) string {
	return fmt.Sprintf("%s.%s.svc:%d", MDSName(c), c.Namespace, ClientPort(c))
}

// SelectorLabels identify the pods of one component of one cluster.
func SelectorLabels(c *chimerav1.ChimeraCluster, component string) map[string]string {
	return map[string]string{
		LabelName:      "chimera",
		LabelInstance:  c.Name,
		LabelComponent: component,
	}
}

// Labels are the selector labels plus the informational ones.
func Labels(c *chimerav1.ChimeraCluster, component string) map[string]string {
	l := SelectorLabels(c, component)
	l[LabelManagedBy] = ManagedBy
	l[LabelCluster] = c.Name
	return l
}

// Transport returns the effective transport (the schema defaults it).
func Transport(c *chimerav1.ChimeraCluster) chimerav1.Transport {
	if c.Spec.Network.Transport == "" {
		return chimerav1.TransportTCP
	}
	return c.Spec.Network.Transport
}

// ClientPort is the port clients use for the chosen transport.
func ClientPort(c *chimerav1.ChimeraCluster) int32 {
	if c.Spec.Network.Port != 0 {
		return c.Spec.Network.Port
	}
	if Transport(c) == chimerav1.TransportRDMA {
		return PortRDMADefault
	}
	return PortNFSDefault
}

// TCPPort is the NFS-over-TCP port (for rdma, the TCP fallback stays on 2049).
func TCPPort(c *chimerav1.ChimeraCluster) int32 {
	if Transport(c) == chimerav1.TransportRDMA {
		return PortNFSDefault
	}
	return ClientPort(c)
}

// DesiredDataServers is the DS pod count in StatefulSet mode (the DaemonSet
// controller decides it in DaemonSet mode; -1 then).
func DesiredDataServers(c *chimerav1.ChimeraCluster) int32 {
	if c.Spec.DataServers.Mode == chimerav1.DataServerModeDaemonSet {
		return -1
	}
	if c.Spec.DataServers.Count == nil {
		return 1
	}
	return *c.Spec.DataServers.Count
}
