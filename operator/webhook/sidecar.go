package webhook

// The mutating webhook for CSI mountMode sidecar (csi/README.md): a pod
// carrying the annotation chimera.io/fuse-sidecar: "true" gets an emptyDir
// "chimera-fuse" and a native sidecar (an init container with restartPolicy
// Always) running `chimera-fuse --sidecar-dir /run/chimera-fuse` with no
// privileges. The CSI node plugin finds the emptyDir through the kubelet's
// pods directory and hands each sidecar volume's /dev/fuse descriptor to
// the sidecar over a socket in it. Pods without the annotation pass
// unchanged; injecting twice changes nothing.

import (
	"context"
	"encoding/json"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// The names the CSI node plugin relies on (csi/pkg/driver/sidecar.go holds
// the same values; the operator must not import the driver).
const (
	// SidecarAnnotation is what a pod sets to "true" to get the sidecar.
	SidecarAnnotation = "chimera.io/fuse-sidecar"
	// SidecarName names both the injected container and its emptyDir.
	SidecarName = "chimera-fuse"
	// SidecarDir is where the emptyDir is mounted in the sidecar.
	SidecarDir = "/run/chimera-fuse"
	// SidecarBinary is chimera-fuse in the dataplane image (whose
	// entrypoint is chimerad).
	SidecarBinary = "/usr/local/bin/chimera-fuse"
	// MutatePodPath is where the API server sends pod admission reviews.
	MutatePodPath = "/mutate-v1-pod-chimera-fuse"
)

// sidecarContainer is the injected native sidecar.
func sidecarContainer(image string) corev1.Container {
	always := corev1.ContainerRestartPolicyAlways
	no, yes := false, true
	return corev1.Container{
		Name:          SidecarName,
		Image:         image,
		Command:       []string{SidecarBinary},
		Args:          []string{"--sidecar-dir", SidecarDir},
		RestartPolicy: &always,
		VolumeMounts:  []corev1.VolumeMount{{Name: SidecarName, MountPath: SidecarDir}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("50m"),
				corev1.ResourceMemory: resource.MustParse("64Mi"),
			},
		},
		// No mount(2) in the sidecar: it serves a descriptor the node
		// plugin mounted, so it needs no capability at all.
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   &yes,
			RunAsNonRoot:             &no,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// WantsSidecar says whether the pod asks for the sidecar.
func WantsSidecar(pod *corev1.Pod) bool {
	return pod.Annotations[SidecarAnnotation] == "true"
}

// InjectSidecar adds the emptyDir and the sidecar (first among the init
// containers, so it runs before the others, which may use the volumes) to
// a pod that asks for them; what is already there is left alone. It
// reports whether the pod changed.
func InjectSidecar(pod *corev1.Pod, image string) bool {
	if !WantsSidecar(pod) {
		return false
	}
	changed := false
	if !hasVolume(pod, SidecarName) {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
			Name:         SidecarName,
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
		})
		changed = true
	}
	if !hasContainer(pod, SidecarName) {
		pod.Spec.InitContainers = append([]corev1.Container{sidecarContainer(image)}, pod.Spec.InitContainers...)
		changed = true
	}
	return changed
}

func hasVolume(pod *corev1.Pod, name string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Name == name {
			return true
		}
	}
	return false
}

func hasContainer(pod *corev1.Pod, name string) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if c.Name == name {
				return true
			}
		}
	}
	return false
}

// SidecarInjector is the admission handler for pods.
type SidecarInjector struct {
	// Image is the dataplane image, which carries chimera-fuse.
	Image string
}

// Handle patches a pod that carries the annotation; any other pod passes
// unchanged (the configuration's matchConditions already keep most of them
// away, and failurePolicy Ignore keeps pods creatable when we are down).
func (s *SidecarInjector) Handle(_ context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := json.Unmarshal(req.Object.Raw, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if !InjectSidecar(pod, s.Image) {
		if WantsSidecar(pod) {
			return admission.Allowed("the chimera-fuse sidecar is already there")
		}
		return admission.Allowed("no " + SidecarAnnotation + " annotation")
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, raw)
}

// SetupSidecarInjector registers the pod mutating webhook on the manager's
// webhook server.
func SetupSidecarInjector(mgr ctrl.Manager, image string) {
	mgr.GetWebhookServer().Register(MutatePodPath, &ctrlwebhook.Admission{Handler: &SidecarInjector{Image: image}})
}
