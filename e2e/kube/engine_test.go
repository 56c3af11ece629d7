package kube

// The in-process-engine Job (config/samples/fio/fio-engine-job.yaml) on the
// real node: fio with our engine (image localhost/chimera-fio-engine:dev)
// speaks NFSv4.1 to the MDS pod and NFSv3 straight to the data-server pods
// its flex-files layouts name — no kernel mount, no PVC in the pod. It
// writes into the PVC's volume directory (the engine mounts that path of
// the export), with the sample workload plus crc32c verify on the layout
// phase; the DSes' metrics must show the engine's writes arriving there.

import (
	"fmt"
	"path/filepath"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chimera-k8s/chimera/operator/render"
)

const engineImage = "localhost/chimera-fio-engine:dev"

// dsNFS3Bytes sums the data servers' NFSv3 WRITE bytes received and READ
// bytes sent.
func (e *env) dsNFS3Bytes(dsAddrs []string) (written, read float64, err error) {
	for _, a := range dsAddrs {
		code, body, err := e.nodeGet(fmt.Sprintf("http://%s:%d/metrics", a, render.PortMetrics), "")
		if err != nil || code != 200 {
			return 0, 0, fmt.Errorf("DS %s metrics: HTTP %d (%v)", a, code, err)
		}
		written += metricSum(body, "chimera_rpc_received_bytes_total", `program="nfs3"`, `op="write"`)
		read += metricSum(body, "chimera_rpc_sent_bytes_total", `program="nfs3"`, `op="read"`)
	}
	return written, read, nil
}

// engineJob runs the sample engine Job against the MDS at mdsIP, in the
// volume at exportPath, and checks its three phases and the DSes' metrics.
func (e *env) engineJob(samples, mdsIP, exportPath string, dsAddrs []string) (string, error) {
	if exportPath == "" || !strings.HasPrefix(exportPath, "/") {
		return "", fmt.Errorf("the PV has no exportPath in its volume attributes (%q)", exportPath)
	}
	cm := &corev1.ConfigMap{}
	if err := sampleObject(filepath.Join(samples, "fio", "fio-workload-configmap.yaml"), "ConfigMap", cm); err != nil {
		return "", err
	}
	job := &batchv1.Job{}
	if err := sampleObject(filepath.Join(samples, "fio", "fio-engine-job.yaml"), "Job", job); err != nil {
		return "", err
	}
	wl := cm.Data["workload.fio"]
	if !strings.Contains(wl, "[layout]\nrw=write\n") {
		return "", fmt.Errorf("the sample workload changed shape: update the test")
	}
	cm.Name = "fio-workload-engine"
	cm.Data["workload.fio"] = strings.Replace(wl, "[layout]\nrw=write\n", "[layout]\nrw=write\nverify=crc32c\ndo_verify=1\n", 1)
	cm.Data["run.sh"] += `
for phase in layout randwrite randread; do echo "@@fio-$phase-begin"; cat "/results/$phase.json"; echo "@@fio-$phase-end"; done
`
	if err := e.k8s.Create(e.ctx, cm); err != nil {
		return "", err
	}
	c := &job.Spec.Template.Spec.Containers[0]
	smallFio(c, engineImage, fioScale, fioRuntimeS)
	sawArgs := false
	for i := range c.Env {
		switch c.Env[i].Name {
		case "FIO_ARGS":
			// The sample names the MDS Service and the export; the guest
			// has no cluster DNS or Service proxy, and the test writes
			// into the PVC's volume directory.
			args := c.Env[i].Value
			for _, kv := range [][2]string{
				{"--chimera_server=chimera-mds.chimera.svc:2049", fmt.Sprintf("--chimera_server=%s:%d", mdsIP, render.PortNFSDefault)},
				{"--chimera_export=/data", "--chimera_export=" + exportPath},
			} {
				if !strings.Contains(args, kv[0]) {
					return "", fmt.Errorf("the sample engine Job's FIO_ARGS lack %q (%s): update the test", kv[0], args)
				}
				args = strings.Replace(args, kv[0], kv[1], 1)
			}
			if !strings.Contains(args, "--chimera_pnfs=1") {
				return "", fmt.Errorf("the sample engine Job is not in pNFS mode (%s)", args)
			}
			c.Env[i].Value = args
			sawArgs = true
		}
	}
	if !sawArgs {
		return "", fmt.Errorf("the sample engine Job has no FIO_ARGS")
	}
	for i := range job.Spec.Template.Spec.Volumes {
		if v := &job.Spec.Template.Spec.Volumes[i]; v.ConfigMap != nil {
			v.ConfigMap.Name = cm.Name
		}
	}
	w0, r0, err := e.dsNFS3Bytes(dsAddrs)
	if err != nil {
		return "", err
	}
	if err := e.k8s.Create(e.ctx, job); err != nil {
		return "", err
	}
	// Its pod is gone before the cluster's teardown counts pods.
	defer func() {
		_ = e.k8s.Delete(e.ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))
		_ = e.k8s.Delete(e.ctx, cm)
	}()
	err = e.waitJob(job, fioJobTimeout)
	out, lerr := e.tool(e.kubectl, "logs", "-n", clusterNS, "job/"+job.Name)
	if err != nil {
		return "", fmt.Errorf("%w\nfio log:\n%s", err, out)
	}
	if lerr != nil {
		return "", lerr
	}
	notes, fioWritten, err := fioPhases(out)
	if err != nil {
		return "", fmt.Errorf("%w\nfio log:\n%s", err, out)
	}
	w1, r1, err := e.dsNFS3Bytes(dsAddrs)
	if err != nil {
		return "", err
	}
	// Every byte fio wrote reaches at least one data server straight from
	// the engine (mirrored layouts write it more than once).
	if dw := w1 - w0; dw < float64(fioWritten) {
		return "", fmt.Errorf("fio wrote %d bytes through the engine but the DSes received %.0f NFSv3 WRITE bytes: I/O went elsewhere", fioWritten, dw)
	}
	notes = append(notes, fmt.Sprintf("DS write bytes +%.0f, DS read bytes +%.0f", w1-w0, r1-r0))
	return strings.Join(notes, ", "), nil
}
