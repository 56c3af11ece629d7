package kube

// The rolling upgrade on the real node: a durable ChimeraCluster (backend
// nvme over PersistentVolumes — the MDS's namespace and each data server's
// data in diskfs image files on hostPath volumes of the guest's PV disk,
// storage.nvme.volumeClaim), mirrors 2 over its two data servers, and a
// kernel-mounted pNFS volume (NFSv4.1) under a fio Job that writes and
// verifies (crc32c, buffered with fsync; see rollScript) a file round after
// round. spec.image changes
// to a second tag of the same image (localhost/chimerad:dev2, tagged by
// node-init): the operator must replace chimera-ds-0, chimera-ds-1 and the MDS in
// that order (drain, restart, ready, undrain, resync; the MDS done after its
// grace period) while the rounds go on, and the Job must end with zero
// errors, a round completed after the rollout, and the file it wrote before
// the rollout verifying.
//
// The guest has no kube-proxy: the StorageClass names a VIP that node-init
// maps to the MDS pod (setVIP), and the test moves it when the MDS pod comes
// back with another IP — what a Service does in a real cluster.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/render"
)

const (
	// The flow's cluster is gone by now, and this one takes its name: the
	// CSI controller reaches MDSes by address (here the VIP), so the e2e
	// values pin the name it checks on their certificates to
	// chimera-mds.chimera.svc (csi.adminTLSServerName).
	rollName   = "chimera"
	rollVIP    = "10.96.0.53"
	rollClass  = "chimera-e2e-local"
	rollPVDir  = "/var/lib/chimera-pv"
	rollImage2 = "localhost/chimerad:dev2"
	rollPVC    = "roll-data"
	rollJob    = "roll-fio"
	// The whole rollout: three pods, each restarted under TCG, the MDS's
	// recovery and grace period.
	rollTimeout = 15 * time.Minute
)

// rollScript is the Job's workload: an 8 MiB file written once before the
// rollout (keep.dat), then 16 MiB rounds (write, then read back and verify
// every block) until /data/.stop appears, then keep.dat verified again.
// Any fio error (an I/O error, a block that does not verify) ends it with
// a non-zero status; each round prints "@@round N ok".
//
// Buffered writes with fsync, not O_DIRECT: the guest's client (Linux
// 6.1.192) has a bug in O_DIRECT over mirrored flex-files layouts. When a
// layout recall (every drain recalls) lands while direct writes to the DSes
// are queued, the client resets them to be resent (RESET_TO_PNFS), and the
// resend never happens: the write returns 0 bytes, no error, with no RPC sent
// after the reset, so fio reports "full resid" (EIO). Its own tracepoints
// show it (nfs_direct_write_reschedule_io, then nfs_direct_write_complete
// with count=0; logs/nfs-trace-run<N>.txt); the DSes had answered every
// write in full. About half the O_DIRECT runs here hit it. Buffered writes take the
// writeback path (reset pages stay dirty and are written again); the verify
// pass reads from the servers, because fio flushes and drops the file's
// cached pages before it.
const rollScript = `set -u
common="--ioengine=psync --direct=0 --bs=64k --rw=write --verify=crc32c --do_verify=1 --end_fsync=1 --invalidate=1 --minimal"
fio --name=keep --filename=/data/keep.dat --size=8m $common >/tmp/keep.txt 2>&1 || { echo "@@keep write FAILED"; cat /tmp/keep.txt; exit 1; }
echo "@@keep written"
i=0
deadline=$(( $(date +%s) + 1500 ))
while [ ! -e /data/.stop ]; do
  if [ "$(date +%s)" -ge "$deadline" ]; then echo "@@deadline: never told to stop"; exit 1; fi
  i=$((i + 1))
  fio --name=round --filename=/data/round.dat --size=16m $common >/tmp/round.txt 2>&1 || { echo "@@round $i FAILED"; cat /tmp/round.txt; exit 1; }
  echo "@@round $i ok"
done
fio --name=keep --filename=/data/keep.dat --size=8m $common --verify_only >/tmp/keep.txt 2>&1 || { echo "@@keep verify FAILED"; cat /tmp/keep.txt; exit 1; }
echo "@@keep verified after $i rounds"
`

var roundRE = regexp.MustCompile(`@@round (\d+) ok`)

// stop ends an eventuallyStop wait at once with its error.
type stop struct{ err error }

func (s *stop) Error() string { return s.err.Error() }

// eventuallyStop is eventually, but an error of type *stop ends it at once.
func eventuallyStop(e *env, timeout time.Duration, fn func() error) error {
	var fatal error
	err := eventually(e.ctx, timeout, func() error {
		err := fn()
		if s, ok := err.(*stop); ok {
			fatal = s.err
			return nil
		}
		return err
	})
	if fatal != nil {
		return fatal
	}
	return err
}

// setVIP maps vip to the pod address to ("" removes every mapping) through
// node-init's watcher, and waits until the node applied it.
func (e *env) setVIP(vip, to string) error {
	want := ""
	if to != "" {
		want = vip + " " + to + "\n"
	}
	f := filepath.Join(e.share, "vips")
	if err := os.WriteFile(f+".tmp", []byte(want), 0o644); err != nil {
		return err
	}
	if err := os.Rename(f+".tmp", f); err != nil {
		return err
	}
	return eventually(e.ctx, 30*time.Second, func() error {
		got, err := os.ReadFile(filepath.Join(e.share, "vips.applied"))
		if err != nil || string(got) != want {
			return fmt.Errorf("the node has not applied VIP %s -> %q yet (applied %q, %v)", vip, to, got, err)
		}
		return nil
	})
}

// rounds is the last "@@round N ok" in the Job's log so far (0: none).
func (e *env) rounds() int {
	out, _ := e.tool(e.kubectl, "logs", "-n", clusterNS, "job/"+rollJob)
	n := 0
	for _, m := range roundRE.FindAllStringSubmatch(out, -1) {
		if v, _ := strconv.Atoi(m[1]); v > n {
			n = v
		}
	}
	return n
}

func (e *env) waitRound(after int, timeout time.Duration) (int, error) {
	n := 0
	err := eventuallyStop(e, timeout, func() error {
		job := &batchv1.Job{}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: clusterNS, Name: rollJob}, job); err == nil && job.Status.Failed > 0 {
			out, _ := e.tool(e.kubectl, "logs", "-n", clusterNS, "job/"+rollJob)
			return &stop{fmt.Errorf("the fio Job failed:\n%s", out)}
		}
		if n = e.rounds(); n > after {
			return nil
		}
		return fmt.Errorf("fio has done %d rounds, waiting for round %d", n, after+1)
	})
	return n, err
}

// rollingUpgrade runs the whole step; base is the flow's memfs cluster
// (deleted by now), whose guest-scaled spec it starts from.
// run numbers the repeats in one boot: each gets its own volumes' folders.
func (e *env) rollingUpgrade(base *chimerav1.ChimeraCluster, samples string, run int) (note string, err error) {
	cc := &chimerav1.ChimeraCluster{ObjectMeta: metav1.ObjectMeta{Name: rollName, Namespace: clusterNS}, Spec: *base.Spec.DeepCopy()}
	defer func() {
		if err != nil {
			e.rollDiag(cc)
		}
		e.nodeNFSTrace(run, err != nil)
		if cerr := e.rollCleanup(cc); cerr != nil && err == nil {
			err = fmt.Errorf("cleanup: %w", cerr)
		}
	}()

	// The node's NFS client tracepoints: nodeNFSTrace keeps them at the end
	// of every run and logs their errors when the step failed.
	if err := os.WriteFile(filepath.Join(e.share, "nfs-trace.on"), nil, 0o644); err != nil {
		return "", err
	}

	// Three hostPath volumes for the MDS's and the data servers' claims.
	if err := e.k8s.Create(e.ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: rollClass}, Provisioner: "kubernetes.io/no-provisioner"}); err != nil {
		return "", err
	}
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	for i := 0; i < 3; i++ {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", rollClass, i)},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              rollClass,
				PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
					Path: fmt.Sprintf("%s/%s-run%d-%d", rollPVDir, rollName, run, i), Type: &dirOrCreate}},
			},
		}
		if err := e.k8s.Create(e.ctx, pv); err != nil {
			return "", err
		}
	}

	// The durable cluster.
	gi := resource.MustParse("1Gi")
	cc.Spec.Storage = chimerav1.StorageSpec{
		Backend: chimerav1.BackendNVMe,
		NVMe:    &chimerav1.NVMeSpec{VolumeClaim: &chimerav1.DataVolumeClaimSpec{StorageClassName: rollClass, Size: gi}},
		Diskfs:  &chimerav1.DiskfsSpec{BlockCacheBlocks: 1024, InodeCacheInodes: 1024},
	}
	cc.Spec.MetadataServer.Storage = &chimerav1.MetadataStorageSpec{StorageClassName: rollClass, Size: gi}
	cc.Spec.PNFS.Mirrors = 2
	cc.Spec.Rollout.PodReadyTimeoutSeconds = 300
	cc.Spec.Rollout.DrainTimeoutSeconds = 180
	cc.Spec.Rollout.ResyncTimeoutSeconds = 300
	if err := e.k8s.Create(e.ctx, cc); err != nil {
		return "", err
	}
	if err := eventually(e.ctx, 2*clusterUpTimeout, func() error {
		if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(cc), cc); err != nil {
			return err
		}
		if cc.Status.Phase != chimerav1.PhaseAvailable || cc.Status.DataServersReady != 2 {
			return fmt.Errorf("phase %q, %d DS ready; pods: %s", cc.Status.Phase, cc.Status.DataServersReady, e.podStates(clusterNS))
		}
		return nil
	}); err != nil {
		return "", err
	}
	mdsIP, err := e.podIP(render.MDSName(cc) + "-0")
	if err != nil {
		return "", err
	}
	if err := e.setVIP(rollVIP, mdsIP); err != nil {
		return "", err
	}

	// The volume, through the VIP, and the fio Job on it.
	sc := &storagev1.StorageClass{}
	if err := sampleObject(filepath.Join(samples, "storageclass.yaml"), "StorageClass", sc); err != nil {
		return "", err
	}
	for k := range sc.Parameters {
		if strings.HasSuffix(k, "-secret-name") {
			sc.Parameters[k] = render.AdminSecretName(cc)
		}
		if strings.HasSuffix(k, "-secret-namespace") {
			sc.Parameters[k] = clusterNS
		}
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: rollPVC, Namespace: clusterNS},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{}},
		},
	}
	if err := e.claim(sc, "chimera-roll", rollVIP, pvc, 256<<20); err != nil {
		return "", err
	}
	if err := eventually(e.ctx, pvcBoundTimeout, func() error {
		if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("PVC %s: %s", pvc.Status.Phase, e.events(clusterNS, pvc.Name))
		}
		return nil
	}); err != nil {
		return "", err
	}
	zero := int32(0)
	ctr := corev1.Container{Name: "fio", Command: []string{"/bin/sh", "-c", rollScript},
		VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}
	smallFio(&ctr, "localhost/chimera-fio:dev", fioScale, fioRuntimeS)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: rollJob, Namespace: clusterNS},
		Spec: batchv1.JobSpec{BackoffLimit: &zero, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{ctr},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: rollPVC}}}},
		}}},
	}
	if err := e.k8s.Create(e.ctx, job); err != nil {
		return "", err
	}
	before, err := e.waitRound(0, fioJobTimeout)
	if err != nil {
		return "", fmt.Errorf("before the rollout: %w", err)
	}

	// The new image. The VIP follows the MDS pod; the MDS's counters are
	// read every second (they restart with it).
	if err := eventually(e.ctx, 30*time.Second, func() error {
		cur := &chimerav1.ChimeraCluster{}
		if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(cc), cur); err != nil {
			return err
		}
		cur.Spec.Image = rollImage2
		return e.k8s.Update(e.ctx, cur)
	}); err != nil {
		return "", err
	}
	t0 := time.Now()
	var resyncs, moves float64
	var done string
	err = eventuallyStop(e, rollTimeout, func() error {
		if ip, err := e.podIP(render.MDSName(cc) + "-0"); err == nil && ip != "" && ip != mdsIP {
			if err := e.setVIP(rollVIP, ip); err != nil {
				return err
			}
			mdsIP = ip
			moves++
		}
		if code, body, err := e.nodeGet(fmt.Sprintf("http://%s:%d/metrics", mdsIP, render.PortMetrics), ""); err == nil && code == 200 {
			resyncs = max(resyncs, metricSum(body, "chimera_pnfs_resyncs_total"))
		}
		job := &batchv1.Job{}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: clusterNS, Name: rollJob}, job); err == nil && job.Status.Failed > 0 {
			out, _ := e.tool(e.kubectl, "logs", "-n", clusterNS, "job/"+rollJob)
			return &stop{fmt.Errorf("the fio Job failed during the rollout:\n%s", out)}
		}
		cur := &chimerav1.ChimeraCluster{}
		if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(cc), cur); err != nil {
			return err
		}
		u := meta.FindStatusCondition(cur.Status.Conditions, chimerav1.ConditionUpToDate)
		if u != nil && u.Reason == render.ReasonRolloutFailed {
			return &stop{fmt.Errorf("rollout failed: %s", u.Message)}
		}
		r := cur.Status.Rollout
		if u == nil || u.Reason != "AllPodsAtRevision" || r == nil || r.DataServersUpdated != 2 || !r.MetadataServerUpdated {
			return fmt.Errorf("rolling: UpToDate %+v, status.rollout %+v; pods %s", u, r, e.podStates(clusterNS))
		}
		for _, p := range []string{rollName + "-ds-0", rollName + "-ds-1", rollName + "-mds-0"} {
			pod := &corev1.Pod{}
			if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: clusterNS, Name: p}, pod); err != nil {
				return err
			}
			if pod.Spec.Containers[0].Image != rollImage2 || !render.PodReady(pod) {
				return fmt.Errorf("pod %s: image %s, %s", p, pod.Spec.Containers[0].Image, podState(pod))
			}
		}
		done = u.Message
		return nil
	})
	if err != nil {
		return "", err
	}
	took := time.Since(t0)
	during := e.rounds()
	order, err := e.rolloutOrder(cc)
	if err != nil {
		return "", err
	}
	if want := []string{rollName + "-ds-0", rollName + "-ds-1", rollName + "-mds-0"}; strings.Join(order, ",") != strings.Join(want, ",") {
		return "", fmt.Errorf("pods replaced in the order %v, want %v", order, want)
	}
	if moves == 0 {
		return "", fmt.Errorf("the MDS pod kept its IP %s: was it replaced?", mdsIP)
	}
	// I/O after the rollout, then the end.
	after, err := e.waitRound(during, fioJobTimeout)
	if err != nil {
		return "", fmt.Errorf("after the rollout: %w", err)
	}
	pods, err := e.podsRunning(clusterNS, map[string]string{"job-name": rollJob}, 1)
	if err != nil {
		return "", err
	}
	if out, err := e.tool(e.kubectl, "exec", "-n", clusterNS, pods[0].Name, "--", "touch", "/data/.stop"); err != nil {
		return "", fmt.Errorf("telling fio to stop: %v %s", err, out)
	}
	err = e.waitJob(job, fioJobTimeout)
	out, _ := e.tool(e.kubectl, "logs", "-n", clusterNS, "job/"+rollJob)
	if err != nil {
		return "", fmt.Errorf("%w\nfio log:\n%s", err, out)
	}
	if !strings.Contains(out, "@@keep verified") {
		return "", fmt.Errorf("the file written before the rollout did not verify:\n%s", out)
	}
	if during <= before {
		return "", fmt.Errorf("no fio round completed during the rollout (%d before, %d at its end): the I/O stalled", before, during)
	}
	return fmt.Sprintf("replaced %v in %s (%s); fio rounds: %d before, %d during, %d at the end, zero errors, keep.dat verified; MDS moved IP %0.f time(s), resyncs seen %.0f",
		order, took.Round(time.Second), done, before, during-before, after, moves, resyncs), nil
}

// rollDiag logs, before the cleanup removes them, what a failed rollout
// needs to be understood: the servers' logs, the MDS's pNFS metrics and
// admin view of the data servers, the rollout's events.
func (e *env) rollDiag(cc *chimerav1.ChimeraCluster) {
	for _, p := range []string{render.MDSName(cc) + "-0", rollName + "-ds-0", rollName + "-ds-1"} {
		out, _ := e.tool(e.kubectl, "logs", "-n", clusterNS, p, "--tail=80", "--timestamps")
		e.t.Logf("rollout diagnostics: logs of %s:\n%s", p, out)
	}
	if ip, err := e.podIP(render.MDSName(cc) + "-0"); err == nil && ip != "" {
		if code, body, err := e.nodeGet(fmt.Sprintf("http://%s:%d/metrics", ip, render.PortMetrics), ""); err == nil && code == 200 {
			var keep []string
			for _, l := range strings.Split(body, "\n") {
				if strings.HasPrefix(l, "chimera_pnfs_") {
					keep = append(keep, l)
				}
			}
			e.t.Logf("rollout diagnostics: MDS pNFS metrics:\n%s", strings.Join(keep, "\n"))
		}
	}
	out, _ := e.tool(e.kubectl, "get", "events", "-n", clusterNS, "--sort-by=.lastTimestamp", "--field-selector", "involvedObject.kind=ChimeraCluster")
	e.t.Logf("rollout diagnostics: the cluster's events:\n%s", out)
	out, _ = e.tool(e.kubectl, "logs", "-n", clusterNS, "job/"+rollJob, "--timestamps")
	e.t.Logf("rollout diagnostics: the fio Job:\n%s", out)
}

// nodeNFSTrace has the node copy its NFS client trace (since the last
// dump), kernel log and mountstats to the share's logs/ (kept as
// nfs-trace-run<run>.txt, ...) and, for a failed step, logs what stands out
// in them: the trace's error results and layout events, and the kernel
// log's NFS lines.
func (e *env) nodeNFSTrace(run int, failed bool) {
	logs := filepath.Join(e.share, "logs")
	done := filepath.Join(logs, "nfs-trace.done")
	os.Remove(done)
	if err := os.WriteFile(filepath.Join(e.share, "nfs-trace.dump"), nil, 0o644); err != nil {
		e.t.Logf("rollout diagnostics: asking the node for its NFS trace: %v", err)
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(done); err == nil {
			break
		}
		if time.Now().After(deadline) {
			e.t.Logf("rollout diagnostics: the node did not dump its NFS trace in 30 s")
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, f := range []string{"nfs-trace", "dmesg", "mountstats"} {
		os.Rename(filepath.Join(logs, f+".txt"), filepath.Join(logs, fmt.Sprintf("%s-run%d.txt", f, run)))
	}
	e.t.Logf("the node's NFS client trace of this step: logs/nfs-trace-run%d.txt in the run's share", run)
	if !failed {
		return
	}
	pick := func(file string, keep *regexp.Regexp, max int) string {
		b, err := os.ReadFile(filepath.Join(logs, file))
		if err != nil {
			return err.Error()
		}
		var got []string
		for _, l := range strings.Split(string(b), "\n") {
			if keep.MatchString(l) {
				got = append(got, l)
			}
		}
		if len(got) > max {
			got = got[len(got)-max:]
		}
		return strings.Join(got, "\n")
	}
	e.t.Logf("rollout diagnostics: the node's NFS trace (logs/nfs-trace-run%d.txt), errors and layout events, last 200:\n%s", run,
		pick(fmt.Sprintf("nfs-trace-run%d.txt", run), regexp.MustCompile(`(?i)error=-|status=-|error=[1-9]|layout|recall|pnfs|ff_|short`), 200))
	e.t.Logf("rollout diagnostics: the node's kernel log, NFS lines:\n%s",
		pick(fmt.Sprintf("dmesg-run%d.txt", run), regexp.MustCompile(`(?i)nfs|rpc|pnfs`), 60))
}

// rolloutOrder lists the pods the operator deleted for the rollout, in the
// order of its events ("deleted pod X for revision R") about this cluster
// object (by UID: a repeat's cluster has the same name, and events outlive it).
func (e *env) rolloutOrder(cc *chimerav1.ChimeraCluster) ([]string, error) {
	var evs corev1.EventList
	if err := e.k8s.List(e.ctx, &evs, client.InNamespace(clusterNS)); err != nil {
		return nil, err
	}
	type ev struct {
		at   time.Time
		name string
	}
	var got []ev
	for _, x := range evs.Items {
		if x.InvolvedObject.Name != cc.Name || x.InvolvedObject.UID != cc.UID || x.Reason != "RolloutStep" || !strings.HasPrefix(x.Message, "deleted pod ") {
			continue
		}
		at := x.LastTimestamp.Time
		if x.EventTime.Time.After(at) {
			at = x.EventTime.Time
		}
		got = append(got, ev{at, strings.Fields(x.Message)[2]})
	}
	sort.SliceStable(got, func(i, j int) bool { return got[i].at.Before(got[j].at) })
	var names []string
	for _, g := range got {
		names = append(names, g.name)
	}
	return names, nil
}

func (e *env) podIP(name string) (string, error) {
	p := &corev1.Pod{}
	if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: clusterNS, Name: name}, p); err != nil {
		return "", err
	}
	if p.DeletionTimestamp != nil {
		return "", fmt.Errorf("pod %s is being deleted", name)
	}
	return p.Status.PodIP, nil
}

func (e *env) podStates(ns string) string {
	var pods corev1.PodList
	_ = e.k8s.List(e.ctx, &pods, client.InNamespace(ns))
	var s []string
	for i := range pods.Items {
		s = append(s, pods.Items[i].Name+"="+podState(&pods.Items[i]))
	}
	return strings.Join(s, " ")
}

// rollCleanup removes everything the step made, whether it passed or not,
// so the flow's teardown checks find nothing of it: the Job, the claim (its
// server volume through the VIP), the cluster, its retained claims, the
// PVs, the classes, the VIP.
func (e *env) rollCleanup(cc *chimerav1.ChimeraCluster) error {
	bg := client.PropagationPolicy(metav1.DeletePropagationBackground)
	ignore := func(err error) error {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	var errs []string
	note := func(what string, err error) {
		if err != nil {
			errs = append(errs, what+": "+err.Error())
		}
	}
	note("job", ignore(e.k8s.Delete(e.ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: rollJob, Namespace: clusterNS}}, bg)))
	note("job pods", eventually(e.ctx, teardownTimeout, func() error {
		var pods corev1.PodList
		if err := e.k8s.List(e.ctx, &pods, client.InNamespace(clusterNS), client.MatchingLabels{"job-name": rollJob}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d fio pods left", len(pods.Items))
		}
		return nil
	}))
	note("claim", ignore(e.k8s.Delete(e.ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: rollPVC, Namespace: clusterNS}})))
	note("claim's volume", eventually(e.ctx, teardownTimeout, func() error {
		var pvs corev1.PersistentVolumeList
		if err := e.k8s.List(e.ctx, &pvs); err != nil {
			return err
		}
		for _, pv := range pvs.Items {
			if pv.Spec.StorageClassName == "chimera-roll" {
				return fmt.Errorf("PV %s (%s) not deleted yet", pv.Name, pv.Status.Phase)
			}
		}
		return nil
	}))
	note("class", ignore(e.k8s.Delete(e.ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "chimera-roll"}})))
	note("cluster", ignore(e.k8s.Delete(e.ctx, &chimerav1.ChimeraCluster{ObjectMeta: metav1.ObjectMeta{Name: cc.Name, Namespace: clusterNS}})))
	note("cluster pods", eventually(e.ctx, teardownTimeout, func() error {
		err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(cc), &chimerav1.ChimeraCluster{})
		if err == nil {
			return fmt.Errorf("ChimeraCluster %s still exists", cc.Name)
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		if s := e.podStates(clusterNS); s != "" {
			return fmt.Errorf("pods left: %s", s)
		}
		return nil
	}))
	// The servers' claims are retained by design (the data lives there).
	for _, name := range []string{render.MetadataClaimName + "-" + rollName + "-mds-0", render.DataClaimName + "-" + rollName + "-ds-0", render.DataClaimName + "-" + rollName + "-ds-1"} {
		note("claim "+name, ignore(e.k8s.Delete(e.ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: clusterNS}})))
	}
	for i := 0; i < 3; i++ {
		note("PV", ignore(e.k8s.Delete(e.ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", rollClass, i)}})))
	}
	note("PVs gone", eventually(e.ctx, teardownTimeout, func() error {
		var pvs corev1.PersistentVolumeList
		if err := e.k8s.List(e.ctx, &pvs); err != nil {
			return err
		}
		for _, pv := range pvs.Items {
			if pv.Spec.StorageClassName == rollClass {
				return fmt.Errorf("PV %s still there (%s)", pv.Name, pv.Status.Phase)
			}
		}
		return nil
	}))
	note("local class", ignore(e.k8s.Delete(e.ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: rollClass}})))
	note("VIP", e.setVIP(rollVIP, ""))
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}
