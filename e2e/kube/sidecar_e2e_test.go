package kube

// CSI mountMode: sidecar on the real node (config/samples/storageclass-
// sidecar.yaml and fio/fio-sidecar-job.yaml): a PVC of a sidecar-mode
// class, the annotated fio Job with chimera-fuse as its native sidecar. The
// node plugin mounts /dev/fuse on the pod's volume and hands the descriptor
// to the sidecar, which serves it with no privileges over NFSv3 to the MDS.
// The node plugin's pod is deleted while fio runs: the Job must complete
// with zero errors (the pod's volume does not depend on the plugin once
// handed over), end although its sidecar was running, and a second pod of
// the same kind must read the same files with the same checksums.
//
// The guest's API server runs on the host and cannot call a webhook inside
// the guest (values-e2e.yaml turns the webhook off), so the test injects
// the sidecar with the operator webhook's own function (InjectSidecar)
// before creating the pods; the webhook itself is proven against a real API
// server by operator/webhook's envtest.

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chimera-k8s/chimera/operator/webhook"
)

const (
	sidecarSCName    = "chimera-e2e-fuse"
	sidecarImage     = "localhost/chimerad:dev"
	sidecarVolBytes  = 32 << 20
	sidecarJobName   = "fio-sidecar"
	sidecarReader    = "fuse-reader"
	sidecarJobBudget = 420 * time.Second
)

// injected returns the pod template with what the webhook adds.
func injected(tpl *corev1.PodTemplateSpec) error {
	p := &corev1.Pod{ObjectMeta: tpl.ObjectMeta, Spec: tpl.Spec}
	if !webhook.InjectSidecar(p, sidecarImage) {
		return fmt.Errorf("the pod does not carry %s: \"true\"", webhook.SidecarAnnotation)
	}
	tpl.Spec = p.Spec
	return nil
}

func (e *env) sidecarFlow(samples, mdsIP string) (string, error) {
	sc := &storagev1.StorageClass{}
	if err := sampleObject(filepath.Join(samples, "storageclass-sidecar.yaml"), "StorageClass", sc); err != nil {
		return "", err
	}
	if sc.Parameters["mountMode"] != "sidecar" {
		return "", fmt.Errorf("the sample sidecar StorageClass has mountMode %q", sc.Parameters["mountMode"])
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := sampleObject(filepath.Join(samples, "fio", "fio-sidecar-job.yaml"), "PersistentVolumeClaim", pvc); err != nil {
		return "", err
	}
	if err := e.claim(sc, sidecarSCName, mdsIP, pvc, sidecarVolBytes); err != nil {
		return "", err
	}
	job := &batchv1.Job{}
	if err := sampleObject(filepath.Join(samples, "fio", "fio-sidecar-job.yaml"), "Job", job); err != nil {
		return "", err
	}
	bg := client.PropagationPolicy(metav1.DeletePropagationBackground)
	// Everything goes before the next steps: they count pods and mounts,
	// and the PVC's deletion must reach the server while it is up.
	defer func() {
		_ = e.k8s.Delete(e.ctx, job, bg)
		_ = e.k8s.Delete(e.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sidecarReader, Namespace: clusterNS}})
		_ = eventually(e.ctx, teardownTimeout, func() error {
			var pods corev1.PodList
			if err := e.k8s.List(e.ctx, &pods, client.InNamespace(clusterNS)); err != nil {
				return err
			}
			for _, p := range pods.Items {
				if p.Labels["job-name"] == sidecarJobName || p.Name == sidecarReader {
					return fmt.Errorf("pod %s still there", p.Name)
				}
			}
			return nil
		})
		_ = e.k8s.Delete(e.ctx, pvc)
		_ = eventually(e.ctx, teardownTimeout, func() error {
			err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(pvc), pvc)
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("PVC %s still there (%v)", pvc.Name, err)
		})
		_ = e.k8s.Delete(e.ctx, sc)
	}()

	tpl := &job.Spec.Template
	if err := injected(tpl); err != nil {
		return "", err
	}
	var fioC *corev1.Container
	for i := range tpl.Spec.Containers {
		if tpl.Spec.Containers[i].Name == "fio" {
			fioC = &tpl.Spec.Containers[i]
		}
	}
	if fioC == nil {
		return "", fmt.Errorf("the sample sidecar Job has no fio container")
	}
	// RUNTIME_S: long enough for the node plugin's pod to be replaced mid-run.
	smallFio(fioC, "localhost/chimera-fio:dev", fioScale, "20")
	if err := e.k8s.Create(e.ctx, job); err != nil {
		return "", err
	}

	// fio running through the sidecar's mount → delete the node plugin's pod.
	var podName string
	err := eventually(e.ctx, sidecarJobBudget, func() error {
		var pods corev1.PodList
		if err := e.k8s.List(e.ctx, &pods, client.InNamespace(clusterNS), client.MatchingLabels{"job-name": job.Name}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.Name == "fio" && cs.State.Running != nil {
					podName = p.Name
					return nil
				}
			}
			if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
				return fmt.Errorf("pod %s ended (%s) before fio was seen running", p.Name, p.Status.Phase)
			}
		}
		var states []string
		for i := range pods.Items {
			states = append(states, pods.Items[i].Name+"="+podState(&pods.Items[i])+" "+e.events(clusterNS, pods.Items[i].Name))
		}
		return fmt.Errorf("fio not running yet: %v", states)
	})
	if err != nil {
		return "", err
	}
	// Let fio get into its work, then take the plugin away.
	time.Sleep(5 * time.Second)
	var plugins corev1.PodList
	if err := e.k8s.List(e.ctx, &plugins, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/component": "csi-node"}); err != nil {
		return "", err
	}
	if len(plugins.Items) != 1 {
		return "", fmt.Errorf("%d node plugin pods, want 1", len(plugins.Items))
	}
	old := plugins.Items[0].Name
	if err := e.k8s.Delete(e.ctx, &plugins.Items[0], client.GracePeriodSeconds(0)); err != nil {
		return "", err
	}
	killedAt := time.Now()

	err = e.waitJob(job, sidecarJobBudget)
	out, lerr := e.tool(e.kubectl, "logs", "-n", clusterNS, "job/"+job.Name, "-c", "fio")
	if err != nil {
		side, _ := e.tool(e.kubectl, "logs", "-n", clusterNS, podName, "-c", webhook.SidecarName)
		return "", fmt.Errorf("%w\nfio log:\n%s\nsidecar log:\n%s", err, out, side)
	}
	if lerr != nil {
		return "", lerr
	}
	notes, _, err := fioPhases(out)
	if err != nil {
		return "", fmt.Errorf("%w\nfio log:\n%s", err, out)
	}
	if strings.Contains(section(out, "mountstats"), "/data with fstype nfs") {
		return "", fmt.Errorf("/data is a kernel NFS mount in the sidecar-mode pod")
	}
	want := section(out, "sha256")
	if want == "" {
		return "", fmt.Errorf("the Job printed no checksums")
	}
	// The plugin came back (the DaemonSet) and the job outlived its loss.
	if _, err := e.podsRunning(releaseNS, map[string]string{"app.kubernetes.io/component": "csi-node"}, 1); err != nil {
		return "", fmt.Errorf("the node plugin did not come back after %s was deleted: %w", old, err)
	}
	notes = append(notes, fmt.Sprintf("node plugin %s deleted mid-run, Job completed %.0fs later", old, time.Since(killedAt).Seconds()))

	// A second pod of the same kind reads the files back.
	reader := readerPod(sidecarReader, pvc.Name, "cd /data/fio && sha256sum *", true)
	reader.Annotations = map[string]string{webhook.SidecarAnnotation: "true"}
	rtpl := &corev1.PodTemplateSpec{ObjectMeta: reader.ObjectMeta, Spec: reader.Spec}
	if err := injected(rtpl); err != nil {
		return "", err
	}
	reader.Spec = rtpl.Spec
	if err := e.k8s.Create(e.ctx, reader); err != nil {
		return "", err
	}
	err = e.waitPodDone(reader, podsUpTimeout)
	got, lerr := e.tool(e.kubectl, "logs", "-n", clusterNS, reader.Name, "-c", "reader")
	if err != nil {
		return "", fmt.Errorf("%w\nreader log:\n%s", err, got)
	}
	if lerr != nil {
		return "", lerr
	}
	if strings.TrimSpace(got) != want {
		return "", fmt.Errorf("the second pod read other checksums:\n%s\nwant:\n%s", got, want)
	}
	notes = append(notes, fmt.Sprintf("second pod: %d files, same SHA-256", len(strings.Split(want, "\n"))))
	return strings.Join(notes, ", "), nil
}
