package controller

import (
	"github.com/chimera-k8s/chimera/operator/render"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CacheOptions limits the manager's informers to objects the operator
// created (they all carry app.kubernetes.io/managed-by=chimera-operator): the
// operator then never holds every Secret or Pod of the cluster in memory.
// Reads of other objects of these kinds through the cached client see
// NotFound, which is why every child is labelled by the builders. Nodes are
// cached whole-cluster but stripped to their addresses.
func CacheOptions() cache.Options {
	mine := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{render.LabelManagedBy: render.ManagedBy})}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:                   mine,
		&corev1.Secret{}:                mine,
		&corev1.ConfigMap{}:             mine,
		&corev1.Service{}:               mine,
		&appsv1.StatefulSet{}:           mine,
		&appsv1.DaemonSet{}:             mine,
		&policyv1.PodDisruptionBudget{}: mine,
		&networkingv1.NetworkPolicy{}:   mine,
		// Nodes feed only the NetworkPolicy's addresses and the export
		// client rules (addresses, pod ranges): keep nothing else (a Node's
		// status carries its image list, often the bulk of it).
		&corev1.Node{}: {Transform: NodeAddressesOnly},
	}}
}

// NodeAddressesOnly strips a cached Node to its identity, addresses and pod
// ranges (spec.podCIDRs).
func NodeAddressesOnly(o any) (any, error) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return o, nil
	}
	return &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
			CreationTimestamp: n.CreationTimestamp, DeletionTimestamp: n.DeletionTimestamp,
		},
		Spec:   corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status: corev1.NodeStatus{Addresses: n.Status.Addresses},
	}, nil
}
