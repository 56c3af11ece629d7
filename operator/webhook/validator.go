// Package webhook holds the ChimeraCluster validating admission webhook (the
// rules a CRD schema cannot express) and its serving-certificate handling.
package webhook

import (
	"context"
	"fmt"
	"strings"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/render"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	} else if c.Spec.Storage.Backend == chimerav1.BackendNVMe {
		errs = append(errs, field.Required(spec.Child("storage", "nvme"), "backend nvme needs the NVMe devices"))
	}

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
	return errs
}

func warnings(c *chimerav1.ChimeraCluster) admission.Warnings {
	var w admission.Warnings
	if c.Spec.Storage.Backend == chimerav1.BackendNVMe {
		w = append(w, "spec.storage.backend nvme: this chimerad build serves memfs only; the NVMe (VFIO) module is not released yet")
	}
	if c.Spec.Network.Transport == chimerav1.TransportRDMA {
		w = append(w, "spec.network.transport rdma: this chimerad build parses RDMA settings but serves TCP only")
	}
	return w
}
