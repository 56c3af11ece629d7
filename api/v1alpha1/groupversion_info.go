// Package v1alpha1 holds the ChimeraCluster API (group storage.chimera.io).
//
// The types carry kubebuilder markers; controller-gen turns them into
// zz_generated.deepcopy.go and the CRD under config/crd/bases. Never edit the
// generated files by hand: run `make generate`.
//
// +kubebuilder:object:generate=true
// +groupName=storage.chimera.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "storage.chimera.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
