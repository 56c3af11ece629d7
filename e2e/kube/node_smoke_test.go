package kube

// TestNodeSmoke proves the guest is a working Kubernetes node for our
// product, with the parts that do not depend on the dataplane:
//   - a pod from a preloaded image (no registry: imagePullPolicy Never) runs
//     on node `localhost` to Succeeded, and its log (fio's version line)
//     reaches kubectl through the apiserver -> kubelet path over loopback;
//   - `kubectl exec` into a running pod works;
// TestNodeSmokeChart (run by `make test-kube-node`) adds the chart's CSI
// registration alone; TestRealNode, which `make e2e` runs after this one in
// the same boot, makes the same checks (CSINode lists the driver after helm
// install, nothing left in CSINode after helm uninstall) on top of the
// dataplane, so `make e2e` does not install the chart twice.

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestNodeSmoke(t *testing.T) {
	e := newEnv(t)
	tl := &timeline{t0: time.Now()}
	t.Cleanup(func() {
		tl.print(t)
		if t.Failed() {
			e.dumpState()
		}
	})
	const ns = "default"
	tl.run(t, "pod from a preloaded image Succeeded, log via kubelet", func() (string, error) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "smoke-once", Namespace: ns},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "fio", Image: "localhost/chimera-fio:dev",
					ImagePullPolicy: corev1.PullNever, Command: []string{"fio", "--version"}}},
			},
		}
		if err := e.k8s.Create(e.ctx, p); err != nil {
			return "", err
		}
		err := eventually(e.ctx, podsUpTimeout, func() error {
			if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return err
			}
			if p.Status.Phase == corev1.PodFailed {
				return fmt.Errorf("pod failed: %s", podState(p))
			}
			if p.Status.Phase != corev1.PodSucceeded {
				return fmt.Errorf("pod %s %s", podState(p), e.events(ns, p.Name))
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		if p.Spec.NodeName != nodeName {
			return "", fmt.Errorf("pod ran on %q, want %q", p.Spec.NodeName, nodeName)
		}
		out, err := e.tool(e.kubectl, "logs", "-n", ns, p.Name)
		if err != nil {
			return "", err
		}
		if !strings.HasPrefix(strings.TrimSpace(out), "fio-") {
			return "", fmt.Errorf("fio --version printed %q", out)
		}
		return strings.TrimSpace(out), nil
	})
	tl.run(t, "kubectl exec into a running pod", func() (string, error) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "smoke-exec", Namespace: ns, Labels: map[string]string{"app": "smoke-exec"}},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "c", Image: "localhost/chimera-fio:dev",
					ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "600"}}},
			},
		}
		if err := e.k8s.Create(e.ctx, p); err != nil {
			return "", err
		}
		if _, err := e.podsRunning(ns, map[string]string{"app": "smoke-exec"}, 1); err != nil {
			return "", err
		}
		out, err := e.tool(e.kubectl, "exec", "-n", ns, p.Name, "--", "cat", "/proc/sys/kernel/hostname")
		if err != nil {
			return "", err
		}
		if strings.TrimSpace(out) != p.Name {
			return "", fmt.Errorf("exec saw hostname %q, want %q", out, p.Name)
		}
		return "", e.k8s.Delete(e.ctx, p, client.GracePeriodSeconds(0))
	})
}

// TestNodeSmokeChart: `helm install` of the chart with the e2e values runs
// the CSI node plugin in a container and the kubelet registers it through
// the plugin-registration API (our registrar stand-in): CSINode `localhost`
// lists csi.chimera.io with nodeID `localhost`; `helm uninstall` removes the
// plugin and the kubelet deregisters it.
func TestNodeSmokeChart(t *testing.T) {
	e := newEnv(t)
	tl := &timeline{t0: time.Now()}
	t.Cleanup(func() {
		tl.print(t)
		if t.Failed() {
			e.dumpState()
		}
	})
	tl.run(t, "helm install: CSINode lists csi.chimera.io", func() (string, error) {
		if _, err := e.tool(e.helm, "install", releaseName, filepath.Join(e.repo, "charts", "chimera"),
			"--namespace", releaseNS, "--create-namespace", "-f", filepath.Join(e.repo, "e2e", "kube", "values-e2e.yaml")); err != nil {
			return "", err
		}
		if _, err := e.podsRunning(releaseNS, map[string]string{"app.kubernetes.io/component": "csi-node"}, 1); err != nil {
			return "", err
		}
		return "", eventually(e.ctx, podsUpTimeout, func() error { return e.csiNodeHasDriver(true) })
	})
	tl.run(t, "helm uninstall: the kubelet deregisters the driver", func() (string, error) {
		if _, err := e.tool(e.helm, "uninstall", releaseName, "--namespace", releaseNS, "--wait", "--timeout", "120s"); err != nil {
			return "", err
		}
		return "", eventually(e.ctx, teardownTimeout, func() error { return e.csiNodeHasDriver(false) })
	})
}

// csiNodeHasDriver checks CSINode `localhost` lists (or no longer lists) our driver.
func (e *env) csiNodeHasDriver(want bool) error {
	cn := &storagev1.CSINode{}
	if err := e.k8s.Get(e.ctx, client.ObjectKey{Name: nodeName}, cn); err != nil {
		return err
	}
	for _, d := range cn.Spec.Drivers {
		if d.Name == driverName {
			if !want {
				return fmt.Errorf("CSINode still lists %s", driverName)
			}
			if d.NodeID != nodeName {
				return fmt.Errorf("CSINode driver %s has nodeID %q, want %q", driverName, d.NodeID, nodeName)
			}
			return nil
		}
	}
	if want {
		return fmt.Errorf("CSINode %s drivers %+v", nodeName, cn.Spec.Drivers)
	}
	return nil
}
