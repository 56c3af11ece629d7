package controller_test

// Proves the chimera-fuse sidecar injection on a real API server, with the
// hand-written MutatingWebhookConfiguration of config/webhook (the chart
// renders the same one, checked by operator/render's chart test): a pod
// annotated chimera.io/fuse-sidecar: "true" is stored with the emptyDir and
// the native sidecar first among its init containers; a pod without the
// annotation (or with "false") is stored as sent and never reaches the
// webhook (the matchConditions compile and filter); the CEL expression is
// accepted by the API server, or envtest would not have started.

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/chimera-k8s/chimera/operator/webhook"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// countingInjector is webhook.SidecarInjector counting the reviews it gets.
type countingInjector struct {
	n atomic.Int64
}

func (c *countingInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	c.n.Add(1)
	return (&webhook.SidecarInjector{Image: "chimera/chimerad:test"}).Handle(ctx, req)
}

var podReviews countingInjector

func fioPod(name, annotation string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fuse-sidecar"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "fio", Image: "fio"}},
		},
	}
	if annotation != "" {
		p.Annotations = map[string]string{webhook.SidecarAnnotation: annotation}
	}
	return p
}

func TestFuseSidecarInjectedByTheAPIServer(t *testing.T) {
	ctx := context.Background()
	namespace(t, "fuse-sidecar")

	before := podReviews.n.Load()
	for i, a := range []string{"", "false"} {
		p := fioPod([]string{"plain", "declined"}[i], a)
		if err := k8s.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if len(p.Spec.InitContainers) != 0 || len(p.Spec.Volumes) != 0 {
			t.Fatalf("pod with annotation %q was changed: init %+v volumes %+v", a, p.Spec.InitContainers, p.Spec.Volumes)
		}
	}
	if n := podReviews.n.Load() - before; n != 0 {
		t.Fatalf("the API server sent %d reviews of pods without the annotation: the matchConditions do not filter", n)
	}

	p := fioPod("annotated", "true")
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	if podReviews.n.Load() == before {
		t.Fatal("the annotated pod never reached the webhook")
	}
	if len(p.Spec.InitContainers) != 1 {
		t.Fatalf("stored pod's init containers %+v: want the chimera-fuse sidecar", p.Spec.InitContainers)
	}
	c := p.Spec.InitContainers[0]
	if c.Name != webhook.SidecarName || c.Image != "chimera/chimerad:test" || c.RestartPolicy == nil ||
		*c.RestartPolicy != corev1.ContainerRestartPolicyAlways || len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != webhook.SidecarDir {
		t.Fatalf("stored sidecar %+v", c)
	}
	found := false
	for _, v := range p.Spec.Volumes {
		found = found || v.Name == webhook.SidecarName && v.EmptyDir != nil
	}
	if !found {
		t.Fatalf("stored pod's volumes %+v lack the emptyDir %s", p.Spec.Volumes, webhook.SidecarName)
	}
}
