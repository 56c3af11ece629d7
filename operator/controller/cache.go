package controller

import (
	"github.com/chimera-k8s/chimera/operator/render"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CacheOptions limits the manager's informers to objects the operator
// created (they all carry app.kubernetes.io/managed-by=chimera-operator): the
// operator then never holds every Secret or Pod of the cluster in memory.
// Reads of other objects of these kinds through the cached client see
// NotFound, which is why every child is labelled by the builders.
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
	}}
}
