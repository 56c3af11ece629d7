package kube

// What the three fio Jobs of the flow share (kernel mount, in-process
// engine, chimera-fuse sidecar): the sample's container made small for the
// guest, waiting for a Job, and reading its three phases from the log.

import (
	"fmt"
	"time"

	storagev1 "k8s.io/api/storage/v1"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// claim creates the sample StorageClass sc as `name` naming the MDS by pod
// IP (the guest has no cluster DNS and no kube-proxy: adminEndpoint; the NFS
// server defaults to the same host), then pvc (decoded from a sample by the
// caller) on it with `bytes` of storage.
func (e *env) claim(sc *storagev1.StorageClass, name, mdsIP string, pvc *corev1.PersistentVolumeClaim, bytes int64) error {
	sc.Name = name
	guestStorageClass(sc, mdsIP)
	if err := e.k8s.Create(e.ctx, sc); err != nil {
		return err
	}
	pvc.Spec.StorageClassName = &sc.Name
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = *resource.NewQuantity(bytes, resource.BinarySI)
	return e.k8s.Create(e.ctx, pvc)
}

// smallFio points a sample Job's fio container at a preloaded image with
// requests that fit the guest, and scales its workload by SCALE and
// RUNTIME_S.
func smallFio(c *corev1.Container, image, scale, runtimeS string) {
	c.Image, c.ImagePullPolicy = image, corev1.PullNever
	c.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
	}
	for i := range c.Env {
		switch c.Env[i].Name {
		case "SCALE":
			c.Env[i].Value = scale
		case "RUNTIME_S":
			c.Env[i].Value = runtimeS
		}
	}
}

// waitJob waits up to timeout for the Job to complete; a failed Job ends
// the wait at once. While it runs, the error names its pods' states and
// events.
func (e *env) waitJob(job *batchv1.Job, timeout time.Duration) error {
	var failed error
	err := eventually(e.ctx, timeout, func() error {
		if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return err
		}
		for _, cond := range job.Status.Conditions {
			if cond.Type == batchv1.JobFailed && cond.Status == corev1.ConditionTrue {
				failed = fmt.Errorf("job failed: %s %s", cond.Reason, cond.Message)
				return nil
			}
			if cond.Type == batchv1.JobComplete && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		var pods corev1.PodList
		_ = e.k8s.List(e.ctx, &pods, client.InNamespace(job.Namespace), client.MatchingLabels{"job-name": job.Name})
		var states []string
		for i := range pods.Items {
			states = append(states, pods.Items[i].Name+"="+podState(&pods.Items[i])+" "+e.events(job.Namespace, pods.Items[i].Name))
		}
		return fmt.Errorf("job active %d, pods %v", job.Status.Active, states)
	})
	if err != nil {
		return err
	}
	return failed
}

// fioPhases checks the sample workload's three phases in a Job's log (the
// JSON reports between @@fio-<phase>-begin/-end): no errors, data moved
// (writes in layout and randwrite, reads in layout and randread). It
// returns a note per phase and the bytes written over all three.
func fioPhases(log string) (notes []string, written int64, err error) {
	for _, phase := range []string{"layout", "randwrite", "randread"} {
		errs, rb, wb, err := fioSummary(section(log, "fio-"+phase))
		if err != nil {
			return nil, 0, fmt.Errorf("fio %s report: %v", phase, err)
		}
		if errs != 0 {
			return nil, 0, fmt.Errorf("fio %s: %d errors", phase, errs)
		}
		if (phase != "randread" && wb == 0) || (phase != "randwrite" && rb == 0) {
			return nil, 0, fmt.Errorf("fio %s moved no data (read %d, write %d bytes)", phase, rb, wb)
		}
		written += wb
		notes = append(notes, fmt.Sprintf("%s w%dKiB/r%dKiB", phase, wb>>10, rb>>10))
	}
	return notes, written, nil
}

// waitPodDone waits up to timeout for a run-to-completion pod to succeed; a
// failed pod ends the wait at once.
func (e *env) waitPodDone(pod *corev1.Pod, timeout time.Duration) error {
	var failed error
	err := eventually(e.ctx, timeout, func() error {
		if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded:
			return nil
		case corev1.PodFailed:
			failed = fmt.Errorf("pod %s failed: %s", pod.Name, podState(pod))
			return nil
		}
		return fmt.Errorf("pod %s: %s %s", pod.Name, podState(pod), e.events(pod.Namespace, pod.Name))
	})
	if err != nil {
		return err
	}
	return failed
}
