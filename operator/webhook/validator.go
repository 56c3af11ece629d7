// Package webhook holds the ChimeraCluster validating admission webhook (the
// rules a CRD schema cannot express) and its serving-certificate handling.
package webhook

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/render"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// ValidatePath is where the API server sends ChimeraCluster admission reviews
// (controller-runtime's convention for the type; the chart uses the same path).
const ValidatePath = "/validate-storage-chimera-io-v1alpha1-chimeracluster"

// ImageBytesMax mirrors the schema's maxLength on spec.image.
const ImageBytesMax = 512

// +kubebuilder:webhook:path=/validate-storage-chimera-io-v1alpha1-chimeracluster,mutating=false,failurePolicy=fail,sideEffects=None,groups=storage.chimera.io,resources=chimeraclusters,verbs=create;update,versions=v1alpha1,name=vchimeracluster.storage.chimera.io,admissionReviewVersions=v1

// Validator implements admission.CustomValidator for ChimeraCluster.
type Validator struct{}

var _ admission.CustomValidator = Validator{}

// SetupWithManager registers the webhook on the manager's webhook server.
func SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr).For(&chimerav1.ChimeraCluster{}).WithValidator(Validator{}).Complete()
}

// ValidateCreate checks a new cluster.
func (Validator) ValidateCreate(_ context.Context, obj runtime.Object) (admission.Warnings, error) {
	c, ok := obj.(*chimerav1.ChimeraCluster)
	if !ok {
		return nil, fmt.Errorf("expected a ChimeraCluster, got %T", obj)
	}
	return warnings(c), toError(c, Validate(c))
}

// ValidateUpdate checks a change, including what may not change.
func (Validator) ValidateUpdate(_ context.Context, oldObj, newObj runtime.Object) (admission.Warnings, error) {
	c, ok := newObj.(*chimerav1.ChimeraCluster)
	old, ok2 := oldObj.(*chimerav1.ChimeraCluster)
	if !ok || !ok2 {
		return nil, fmt.Errorf("expected ChimeraClusters, got %T and %T", oldObj, newObj)
	}
	if c.DeletionTimestamp != nil {
		return nil, nil // let the finalizer be removed whatever the spec says
	}
	errs := Validate(c)
	errs = append(errs, ValidateUpdate(old, c)...)
	return warnings(c), toError(c, errs)
}

// ValidateDelete allows every deletion; the finalizer orders the teardown.
func (Validator) ValidateDelete(context.Context, runtime.Object) (admission.Warnings, error) {
	return nil, nil
}

func toError(c *chimerav1.ChimeraCluster, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(chimerav1.GroupVersion.WithKind("ChimeraCluster").GroupKind(), c.Name, errs)
}

// Validate holds the rules a schema cannot say: relations between fields of
// different sub-objects, and the names children will get.
func Validate(c *chimerav1.ChimeraCluster) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")

	for _, msg := range validation.IsDNS1035Label(c.Name) {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), c.Name, "children (Services) are named after the cluster: "+msg))
	}
	if len(c.Name) > chimerav1.ClusterNameLengthMax {
		errs = append(errs, field.TooLong(field.NewPath("metadata", "name"), c.Name, chimerav1.ClusterNameLengthMax))
	}
	if img := c.Spec.Image; strings.ContainsAny(img, " \t\n") || strings.HasPrefix(img, "-") || len(img) > ImageBytesMax {
		errs = append(errs, field.Invalid(spec.Child("image"), img, "not an image reference"))
	}

	ds := c.Spec.DataServers
	mirrors := c.Spec.PNFS.Mirrors
	if mirrors == 0 {
		mirrors = 1
	}
	if ds.Mode != chimerav1.DataServerModeDaemonSet {
		count := render.DesiredDataServers(c)
		if mirrors > count {
			errs = append(errs, field.Invalid(spec.Child("pnfs", "mirrors"), mirrors, fmt.Sprintf("must not exceed spec.dataServers.count (%d): each mirror needs its own data server", count)))
		}
	}

	if n := c.Spec.Storage.NVMe; n != nil {
		p := spec.Child("storage", "nvme")
		if n.ResourceName != "" && len(n.PCIAddresses) > 0 {
			errs = append(errs, field.Forbidden(p.Child("pciAddresses"), "set either resourceName (device plugin) or pciAddresses, not both"))
		}
		if c.Spec.Storage.Backend != chimerav1.BackendNVMe {
			errs = append(errs, field.Forbidden(p, "only valid with spec.storage.backend nvme"))
		}
		seen := map[chimerav1.PCIAddress]bool{}
		for i, a := range n.PCIAddresses {
			if seen[a] {
				errs = append(errs, field.Duplicate(p.Child("pciAddresses").Index(i), a))
			}
			seen[a] = true
		}
		errs = append(errs, validateDevicePaths(p.Child("devicePaths"), n.DevicePaths)...)
		if v := n.VolumeClaim; v != nil {
			vp := p.Child("volumeClaim")
			for _, msg := range validation.IsDNS1123Subdomain(v.StorageClassName) {
				errs = append(errs, field.Invalid(vp.Child("storageClassName"), v.StorageClassName, "not a StorageClass name: "+msg))
			}
			errs = append(errs, validateImageSize(vp.Child("size"), v.Size)...)
			if ds.Mode == chimerav1.DataServerModeDaemonSet {
				errs = append(errs, field.Forbidden(vp, "needs spec.dataServers.mode StatefulSet (a DaemonSet has no volume claims)"))
			}
		}
	} else if c.Spec.Storage.Backend == chimerav1.BackendNVMe {
		errs = append(errs, field.Required(spec.Child("storage", "nvme"), "backend nvme needs the NVMe devices"))
	}
	errs = append(errs, validateDurable(c)...)
	errs = append(errs, validateAccess(c)...)

	net := c.Spec.Network
	if net.Transport == chimerav1.TransportRDMA && net.RDMAResourceName == "" {
		errs = append(errs, field.Required(spec.Child("network", "rdmaResourceName"), "transport rdma needs the RDMA / SR-IOV device-plugin resource"))
	}
	if net.TOS != nil && net.Transport != chimerav1.TransportRDMA {
		errs = append(errs, field.Forbidden(spec.Child("network", "tos"), "the RoCE traffic class only applies to transport rdma"))
	}
	switch net.Port {
	case render.PortMount, render.PortAdmin, render.PortMetrics:
		errs = append(errs, field.Invalid(spec.Child("network", "port"), net.Port, fmt.Sprintf("collides with a fixed chimerad port (mount %d, admin %d, metrics %d)", render.PortMount, render.PortAdmin, render.PortMetrics)))
	}
	if net.Transport == chimerav1.TransportRDMA && net.Port == render.PortNFSDefault {
		errs = append(errs, field.Invalid(spec.Child("network", "port"), net.Port, "with transport rdma the TCP fallback uses 2049; pick another RDMA port (20049 is the standard one)"))
	}

	errs = append(errs, validateResources(c, spec.Child("metadataServer", "resources"), c.Spec.MetadataServer.Resources)...)
	errs = append(errs, validateResources(c, spec.Child("dataServers", "resources"), ds.Resources)...)
	return errs
}

// validateDevicePaths: each block device once, by a clean path under /dev
// (the schema's pattern allows "..", "//" and a trailing "/").
func validateDevicePaths(p *field.Path, paths []chimerav1.DevicePath) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, d := range paths {
		s := string(d)
		if !strings.HasPrefix(s, "/dev/") || path.Clean(s) != s || strings.Contains(s, "/../") || strings.HasSuffix(s, "/..") {
			errs = append(errs, field.Invalid(p.Index(i), s, "must be a clean absolute path of a block device under /dev/ (no .., //, or trailing /)"))
			continue
		}
		if seen[s] {
			errs = append(errs, field.Duplicate(p.Index(i), s))
		}
		seen[s] = true
	}
	return errs
}

// validateDurable: backend nvme needs the MDS's metadata volume, memfs has
// no use for it nor for diskfs tuning.
func validateDurable(c *chimerav1.ChimeraCluster) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec", "metadataServer", "storage")
	st := c.Spec.MetadataServer.Storage
	if c.Spec.Storage.Backend != chimerav1.BackendNVMe {
		if st != nil {
			errs = append(errs, field.Forbidden(p, "only with spec.storage.backend nvme: memfs keeps the namespace in memory"))
		}
		if c.Spec.Storage.Diskfs != nil {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "storage", "diskfs"), "only with spec.storage.backend nvme"))
		}
		return errs
	}
	if st == nil {
		return append(errs, field.Required(p, "backend nvme keeps the MDS's namespace on a PersistentVolume: name its storageClassName and size"))
	}
	for _, msg := range validation.IsDNS1123Subdomain(st.StorageClassName) {
		errs = append(errs, field.Invalid(p.Child("storageClassName"), st.StorageClassName, "not a StorageClass name: "+msg))
	}
	return append(errs, validateImageSize(p.Child("size"), st.Size)...)
}

// validateImageSize: a volume holding a diskfs image file.
func validateImageSize(p *field.Path, size resource.Quantity) field.ErrorList {
	var errs field.ErrorList
	if size.Cmp(*resource.NewQuantity(chimerav1.MetadataSizeBytesMin, resource.BinarySI)) < 0 {
		errs = append(errs, field.Invalid(p, size.String(), "must be at least 1Gi (the diskfs image holds the superblocks, the intent log and the inode tables)"))
	}
	if size.Cmp(resource.MustParse("1Pi")) > 0 {
		errs = append(errs, field.Invalid(p, size.String(), "must be at most 1Pi"))
	}
	return errs
}

// validateAccess checks every client as chimerad reads it (addresses, CIDRs
// without host bits, "*"; no host names) so a bad rule is refused here, not
// by the MDS at push time.
func validateAccess(c *chimerav1.ChimeraCluster) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec", "access")
	if len(c.Spec.Access) > chimerav1.AccessRulesMax {
		errs = append(errs, field.TooMany(p, len(c.Spec.Access), chimerav1.AccessRulesMax))
	}
	for i, r := range c.Spec.Access {
		rp := p.Index(i)
		if len(r.Clients) == 0 {
			errs = append(errs, field.Required(rp.Child("clients"), "at least one client (an address, a CIDR or \"*\")"))
		}
		if len(r.Clients) > chimerav1.AccessClientsPerRuleMax {
			errs = append(errs, field.TooMany(rp.Child("clients"), len(r.Clients), chimerav1.AccessClientsPerRuleMax))
		}
		for j, cl := range r.Clients {
			if _, err := render.AccessClient(cl); err != nil {
				errs = append(errs, field.Invalid(rp.Child("clients").Index(j), cl, err.Error()))
			}
		}
		for name, id := range map[string]*int64{"anonUid": r.AnonUID, "anonGid": r.AnonGID} {
			if id != nil && (*id < 0 || *id > chimerav1.AnonIDMax) {
				errs = append(errs, field.Invalid(rp.Child(name), *id, fmt.Sprintf("must be 0..%d", int64(chimerav1.AnonIDMax))))
			}
		}
		if (r.AnonUID != nil || r.AnonGID != nil) && r.Squash == chimerav1.SquashNoRoot {
			errs = append(errs, field.Forbidden(rp.Child("anonUid"), "squash no_root_squash maps no one to the anonymous identity"))
		}
	}
	np := field.NewPath("spec", "network", "podNetworkCIDRs")
	for i, s := range c.Spec.Network.PodNetworkCIDRs {
		if cl, err := render.AccessClient(s); err != nil || !strings.Contains(cl, "/") {
			msg := "must be a CIDR (a.b.c.d/n or v6/n) without host bits"
			if err != nil {
				msg = err.Error()
			}
			errs = append(errs, field.Invalid(np.Index(i), s, msg))
		}
	}
	return errs
}

// validateResources: hugepages must be requested as the kubelet needs them
// (request == limit), and a configured hugepage size must be requested.
func validateResources(c *chimerav1.ChimeraCluster, p *field.Path, res corev1.ResourceRequirements) field.ErrorList {
	var errs field.ErrorList
	for _, name := range []corev1.ResourceName{"hugepages-1Gi", "hugepages-2Mi"} {
		req, hasReq := res.Requests[name]
		lim, hasLim := res.Limits[name]
		if hasReq && (!hasLim || req.Cmp(lim) != 0) {
			errs = append(errs, field.Invalid(p.Child("limits").Key(string(name)), lim.String(), "hugepages need limits equal to requests"))
		}
	}
	for _, name := range []string{c.Spec.Storage.NVMeResourceNameOrEmpty(), c.Spec.Network.RDMAResourceName} {
		if name == "" {
			continue
		}
		if _, ok := res.Limits[corev1.ResourceName(name)]; ok {
			errs = append(errs, field.Forbidden(p.Child("limits").Key(name), "device-plugin resources are added by the operator from spec.storage.nvme / spec.network; do not set them here"))
		}
	}
	if hp := c.Spec.Tuning.HugePageSize; hp != "" {
		name := corev1.ResourceName("hugepages-" + string(hp))
		if _, ok := res.Limits[name]; !ok {
			errs = append(errs, field.Required(p.Child("limits").Key(string(name)), fmt.Sprintf("spec.tuning.hugePageSize is %s, so the pod must request %s", hp, name)))
		}
	}
	return errs
}

// ValidateUpdate forbids changes that would lose data.
func ValidateUpdate(old, c *chimerav1.ChimeraCluster) field.ErrorList {
	var errs field.ErrorList
	if old.Spec.Storage.Backend != c.Spec.Storage.Backend {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "storage", "backend"), fmt.Sprintf("cannot change from %q to %q: the data would be lost; create a new cluster", old.Spec.Storage.Backend, c.Spec.Storage.Backend)))
	}
	if !equality.Semantic.DeepEqual(old.Spec.MetadataServer.Storage, c.Spec.MetadataServer.Storage) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "metadataServer", "storage"), "immutable: the MDS StatefulSet's volume claim cannot change (the namespace lives on it); create a new cluster"))
	}
	return errs
}

func warnings(c *chimerav1.ChimeraCluster) admission.Warnings {
	var w admission.Warnings
	for i, r := range c.Spec.Access {
		if slices.Contains(r.Clients, "*") && r.Access != chimerav1.AccessRO && r.Access != chimerav1.AccessNone && r.Squash == chimerav1.SquashNoRoot {
			w = append(w, fmt.Sprintf("spec.access[%d]: every client, read-write, root as root: the exports are open to any host that reaches the NFS port", i))
		}
	}
	if c.Spec.Rollout.AllowMemfsMetadataServerRestart && c.Spec.Storage.Backend != chimerav1.BackendNVMe {
		w = append(w, "spec.rollout.allowMemfsMetadataServerRestart: the next new image or config restarts the memfs MDS, which loses every file and volume")
	}
	return w
}
