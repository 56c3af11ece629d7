package webhook

// Proves the chimera-fuse sidecar injection: a pod with the annotation gets
// the emptyDir and the native sidecar (first init container, restartPolicy
// Always, the dataplane image running chimera-fuse --sidecar-dir on the
// emptyDir, no privileges, small requests) as a JSON patch through the
// admission handler; a second pass changes nothing; a pod without the
// annotation (or with another value) passes untouched; a pod that already
// has either part keeps its own and gets only the missing one; garbage is
// refused with 400.

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const testImage = "chimera/chimerad:1"

func annotatedPod(value string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fio", Namespace: "apps"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "prepare", Image: "busybox"}},
			Containers: []corev1.Container{{Name: "fio", Image: "fio",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "fio"}}}},
		},
	}
	if value != "" {
		p.Annotations = map[string]string{SidecarAnnotation: value}
	}
	return p
}

func TestInjectSidecar(t *testing.T) {
	p := annotatedPod("true")
	if !InjectSidecar(p, testImage) {
		t.Fatal("an annotated pod was not changed")
	}
	if len(p.Spec.InitContainers) != 2 || p.Spec.InitContainers[1].Name != "prepare" {
		t.Fatalf("init containers %+v: want the sidecar first, then the pod's own", p.Spec.InitContainers)
	}
	c := p.Spec.InitContainers[0]
	if c.Name != "chimera-fuse" || c.Image != testImage || !reflect.DeepEqual(c.Command, []string{"/usr/local/bin/chimera-fuse"}) ||
		!reflect.DeepEqual(c.Args, []string{"--sidecar-dir", "/run/chimera-fuse"}) {
		t.Fatalf("sidecar %+v", c)
	}
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatal("the sidecar is not a native sidecar (restartPolicy Always)")
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0] != (corev1.VolumeMount{Name: "chimera-fuse", MountPath: "/run/chimera-fuse"}) {
		t.Fatalf("sidecar mounts %+v", c.VolumeMounts)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged != nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
		!reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Fatalf("sidecar security context %+v: want no privileges", sc)
	}
	if c.Resources.Requests.Cpu().MilliValue() > 100 || c.Resources.Requests.Memory().Value() > 128<<20 || c.Resources.Requests.Memory().IsZero() {
		t.Fatalf("sidecar requests %v: want small, non-zero", c.Resources.Requests)
	}
	var ed *corev1.Volume
	for i := range p.Spec.Volumes {
		if p.Spec.Volumes[i].Name == "chimera-fuse" {
			ed = &p.Spec.Volumes[i]
		}
	}
	if ed == nil || ed.EmptyDir == nil || len(p.Spec.Volumes) != 2 {
		t.Fatalf("volumes %+v: want the pod's own plus the emptyDir chimera-fuse", p.Spec.Volumes)
	}

	// Idempotent: a second pass (reinvocation) changes nothing.
	before := p.DeepCopy()
	if InjectSidecar(p, testImage) || !reflect.DeepEqual(p, before) {
		t.Fatal("a second injection changed the pod")
	}

	// Without the annotation, or with another value: untouched.
	for _, v := range []string{"", "false", "True", "yes"} {
		q := annotatedPod(v)
		before := q.DeepCopy()
		if InjectSidecar(q, testImage) || !reflect.DeepEqual(q, before) {
			t.Errorf("annotation %q: pod changed", v)
		}
	}

	// The user's own emptyDir named chimera-fuse is kept; only the sidecar is added.
	q := annotatedPod("true")
	q.Spec.Volumes = append(q.Spec.Volumes, corev1.Volume{Name: "chimera-fuse", VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
	if !InjectSidecar(q, testImage) || len(q.Spec.Volumes) != 2 || q.Spec.Volumes[1].EmptyDir.Medium != corev1.StorageMediumMemory ||
		q.Spec.InitContainers[0].Name != "chimera-fuse" {
		t.Fatalf("pod with its own emptyDir: volumes %+v init %+v", q.Spec.Volumes, q.Spec.InitContainers)
	}
}

func review(t *testing.T, obj []byte) admission.Response {
	t.Helper()
	h := &SidecarInjector{Image: testImage}
	return h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "1", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: obj},
	}})
}

func TestSidecarInjectorHandler(t *testing.T) {
	raw, _ := json.Marshal(annotatedPod("true"))
	r := review(t, raw)
	if !r.Allowed || len(r.Patches) == 0 {
		t.Fatalf("annotated pod: allowed %v, %d patches (%v)", r.Allowed, len(r.Patches), r.Result)
	}
	// The patch, applied to what the API server sent, gives the injected pod.
	ops, _ := json.Marshal(r.Patches)
	patch, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatal(err)
	}
	got, want := &corev1.Pod{}, annotatedPod("true")
	if err := json.Unmarshal(patched, got); err != nil {
		t.Fatal(err)
	}
	InjectSidecar(want, testImage)
	if !reflect.DeepEqual(got.Spec, want.Spec) {
		t.Fatalf("patched pod spec\n%+v\nwant\n%+v", got.Spec, want.Spec)
	}

	// Already injected (reinvocation): allowed, no patch.
	p := annotatedPod("true")
	InjectSidecar(p, testImage)
	raw, _ = json.Marshal(p)
	if r := review(t, raw); !r.Allowed || len(r.Patches) != 0 {
		t.Fatalf("injected pod: allowed %v, patches %v", r.Allowed, r.Patches)
	}
	// No annotation: allowed, no patch.
	raw, _ = json.Marshal(annotatedPod(""))
	if r := review(t, raw); !r.Allowed || len(r.Patches) != 0 {
		t.Fatalf("plain pod: allowed %v, patches %v", r.Allowed, r.Patches)
	}
	// Garbage: refused with 400.
	if r := review(t, []byte("{not json")); r.Allowed || r.Result == nil || r.Result.Code != http.StatusBadRequest {
		t.Fatalf("garbage: %+v", r)
	}
}
