// Package kube is the real end-to-end: the user's whole path on a real
// kubelet node (a QEMU guest, see run.sh), timed step by step.
//
// TestRealNode proves, against a real kube-apiserver, kube-controller-manager,
// kube-scheduler and a real kubelet + containerd + runc node whose kernel has
// the NFS client, with our images built from the Dockerfile, that the user's
// path written in the root README works: its `sh deploy:<step>` blocks (helm
// install, the node label, the ChimeraCluster, the StorageClass, the PVC and
// fio Job, and each `kubectl wait`/`get` check) are run from README.md, with
// the guest's differences listed in readme_test.go. It proves:
//   - `helm install` of charts/chimera runs the operator and the CSI driver
//     (controller Deployment, node DaemonSet) in containers, and the kubelet
//     registers the node plugin (CSINode lists csi.chimera.io);
//   - the TCP/memfs ChimeraCluster sample (1 MDS + 2 DS) runs on the node the
//     README labelled and turns Available, and the MDS's admin API lists both
//     DS addresses;
//   - a PVC on a Chimera StorageClass is Bound to a volume created on the
//     MDS. The external-provisioner image cannot be had here, so our stand-in
//     (sidecars/, running as the chart's csi-provisioner container) plays it:
//     CreateVolume on our controller, then the PV with that sidecar's fields;
//   - the fio Job from config/samples (scaled down, verify=crc32c on the
//     layout phase) mounts it through the node plugin with the kernel NFSv4.1
//     client and completes with zero errors; mountstats show vers=4.1. Whether
//     the MDS granted flex-files layouts (LAYOUTGET > 0) is reported, and
//     when it did, the data servers' metrics must show the written bytes;
//   - the in-process-engine fio Job from config/samples (engine_test.go):
//     fio with our engine in pNFS mode, NFSv4.1 to the MDS pod and NFSv3 to
//     the DS pods, into the PVC's volume directory, verify=crc32c on the
//     layout phase, zero errors; the DSes' metrics grow by at least what fio
//     wrote (a failure here is reported and the flow goes on);
//   - CSI mountMode sidecar (sidecar_e2e_test.go): the annotated fio Job on
//     a sidecar-mode PVC runs through chimera-fuse; the node plugin's pod is
//     deleted mid-run and the Job still completes with zero errors; a second
//     pod reads the same checksums;
//   - bad input on the real path: a PVC larger than the cluster stays Pending
//     with a ProvisioningFailed event naming the capacity; a pod whose volume's
//     cluster is gone gets a FailedMount event naming the unreachable server
//     while the node plugin goes on serving the live volume (next step) without
//     a restart;
//   - a second pod mounts the same RWX volume and reads the first pod's files
//     (same SHA-256);
//   - deleting the PVC deletes the volume on the server (admin API 404);
//     deleting the cluster and `helm uninstall` leave no pods, no chart
//     objects and no NFS mount on the node.
//
// It needs the cluster run.sh starts (KUBECONFIG) and is skipped unless
// CHIMERA_KUBE_E2E=1; `make e2e` sets everything up and checks it ran.
package kube

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/render"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

const (
	releaseName = "chimera"
	releaseNS   = "chimera-system"
	clusterNS   = "chimera" // the samples' namespace
	clusterName = "chimera"
	driverName  = "csi.chimera.io"
	nodeName    = "localhost"
	scName      = "chimera" // the sample StorageClass's name

	pollInterval = 500 * time.Millisecond
	// Budgets per step on a loaded 2-core host running TCG emulation.
	podsUpTimeout    = 180 * time.Second
	clusterUpTimeout = 180 * time.Second
	pvcBoundTimeout  = 60 * time.Second
	fioJobTimeout    = 420 * time.Second
	teardownTimeout  = 120 * time.Second
	toolTimeout      = 120 * time.Second

	// The scaled-down cluster: memfs bounded per pod, small requests so the
	// MDS, two DSes, the chart and fio fit a 2-CPU guest.
	memfsBytes  = 128 << 20
	volumeBytes = 64 << 20
	// fio: SCALE percent of the sample's 32 jobs x 100 files (-> 1 job x 2
	// files of 8 MiB), RUNTIME_S per timed phase.
	fioScale    = "2"
	fioRuntimeS = "5"

	// A claim no cluster here can give: 1 TiB against memfsBytes.
	oversizeBytes = 1 << 40
	// An address on the guest's pod network (10.88.0.0/24, host-local IPAM
	// counting up from .2) that no pod holds: where a deleted cluster's
	// MDS used to answer.
	goneServer = "10.88.0.250"
)

type step struct {
	name string
	dur  time.Duration
	ok   bool
	note string
}

type timeline struct {
	t0    time.Time
	steps []step
}

// run executes one step, records its time and stops the test on failure.
func (tl *timeline) run(t *testing.T, name string, fn func() (string, error)) {
	t.Helper()
	start := time.Now()
	note, err := fn()
	s := step{name: name, dur: time.Since(start), ok: err == nil, note: note}
	tl.steps = append(tl.steps, s)
	status := "ok"
	if err != nil {
		status = "FAILED"
	}
	t.Logf("STEP %-52s %6.1fs  %s %s", name, s.dur.Seconds(), status, note)
	var soft *softError
	if errors.As(err, &soft) {
		// The flow goes on: later steps do not depend on this one.
		t.Errorf("step %q: %v", name, err)
	} else if err != nil {
		t.Fatalf("step %q: %v", name, err)
	}
}

// softError fails the test but lets the flow continue.
type softError struct{ err error }

func (s *softError) Error() string { return s.err.Error() }

func (tl *timeline) print(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "timeline (real node, wall clock):\n")
	var at time.Duration
	for _, s := range tl.steps {
		at += s.dur
		mark := "ok"
		if !s.ok {
			mark = "FAILED"
		}
		fmt.Fprintf(&b, "  %7.1fs  +%6.1fs  %-52s %s  %s\n", at.Seconds(), s.dur.Seconds(), s.name, mark, s.note)
	}
	t.Log(b.String())
}

type env struct {
	t       *testing.T
	ctx     context.Context
	k8s     client.Client
	kc      string
	helm    string
	kubectl string
	repo    string
	share   string
}

func mustEnv(t *testing.T, k string) string {
	v := os.Getenv(k)
	if v == "" {
		t.Fatalf("%s is not set (make e2e sets it)", k)
	}
	return v
}

// tool runs helm or kubectl against the cluster (the flag goes first: args
// may end with `-- command...`).
func (e *env) tool(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(e.ctx, toolTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", e.kc}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// eventually polls fn until it returns nil or the timeout passes.
func eventually(ctx context.Context, timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}

// podsRunning waits for exactly n pods matching the labels with every
// container running (readiness aside: on a loaded TCG guest a probe with a
// 1 s timeout flaps without anything being wrong).
func (e *env) podsRunning(ns string, labels map[string]string, n int) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := eventually(e.ctx, podsUpTimeout, func() error {
		if err := e.k8s.List(e.ctx, &pods, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
			return err
		}
		running := 0
		var states []string
		for i := range pods.Items {
			p := &pods.Items[i]
			all := p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && len(p.Status.ContainerStatuses) == len(p.Spec.Containers)
			for _, cs := range p.Status.ContainerStatuses {
				all = all && cs.State.Running != nil
			}
			if all {
				running++
			}
			states = append(states, p.Name+"="+podState(p))
		}
		if running != n || len(pods.Items) != n {
			return fmt.Errorf("%d/%d pods running in %s %v: %v", running, n, ns, labels, states)
		}
		return nil
	})
	return pods.Items, err
}

// podState is a one-word summary of why a pod is not running, for messages.
func podState(p *corev1.Pod) string {
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			return fmt.Sprintf("%s(%s:%s %s)", p.Status.Phase, cs.Name, w.Reason, w.Message)
		}
		if tm := cs.State.Terminated; tm != nil && tm.ExitCode != 0 {
			return fmt.Sprintf("%s(%s:exit %d %s)", p.Status.Phase, cs.Name, tm.ExitCode, tm.Reason)
		}
	}
	return string(p.Status.Phase)
}

// nodeGet runs `chimera-e2e-sidecar httpget` in the node plugin's
// livenessprobe container: on the node's network, where pod IPs are
// reachable (from the host they are not). Returns the status code and body.
func (e *env) nodeGet(url, token string) (int, string, error) {
	pods, err := e.podsRunning(releaseNS, map[string]string{"app.kubernetes.io/component": "csi-node"}, 1)
	if err != nil {
		return 0, "", err
	}
	args := []string{"exec", "-n", releaseNS, pods[0].Name, "-c", "liveness-probe", "--", "/chimera-e2e-sidecar", "httpget", url}
	if strings.HasPrefix(url, "https://") {
		// The admin API: verified as the operator and the CSI controller
		// do, against the operator's published CA, for the MDS's name.
		cm := &corev1.ConfigMap{}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: releaseNS, Name: releaseName + "-admin-ca"}, cm); err != nil {
			return 0, "", fmt.Errorf("admin CA bundle: %w", err)
		}
		args = append(args, token, cm.Data["ca.crt"], clusterName+"-mds."+clusterNS+".svc")
	} else if token != "" {
		args = append(args, token)
	}
	out, err := e.tool(e.kubectl, args...)
	if err != nil {
		return 0, "", err
	}
	first, body, _ := strings.Cut(out, "\n")
	code, err := strconv.Atoi(strings.TrimPrefix(first, "HTTP "))
	if err != nil {
		return 0, "", fmt.Errorf("httpget printed %q", first)
	}
	return code, body, nil
}

// nodeNFSMounts reads the NFS mounts the guest's init publishes on the share
// every second (independent of any pod still running there).
func (e *env) nodeNFSMounts() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(e.share, "nfs-mounts"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}

func readYAMLDocs(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(d, "")) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs, nil
}

// sampleObject decodes the document of the given kind from a samples file.
func sampleObject(path, kind string, into any) error {
	docs, err := readYAMLDocs(path)
	if err != nil {
		return err
	}
	for _, d := range docs {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(d, &meta); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if meta.Kind == kind {
			return yaml.UnmarshalStrict(d, into)
		}
	}
	return fmt.Errorf("%s has no %s", path, kind)
}

// section returns the lines between "@@<name>-begin" and "@@<name>-end".
func section(log, name string) string {
	_, rest, ok := strings.Cut(log, "@@"+name+"-begin")
	if !ok {
		return ""
	}
	body, _, _ := strings.Cut(rest, "@@"+name+"-end")
	return strings.TrimSpace(body)
}

// mountStats finds the NFS mount at mountpoint in /proc/self/mountstats
// text: its opts line and per-operation call counts.
func mountStats(text, mountpoint string) (opts string, ops map[string]int64, ok bool) {
	ops = map[string]int64{}
	in := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "device ") {
			in = strings.Contains(l, " mounted on "+mountpoint+" with fstype nfs")
			ok = ok || in
			continue
		}
		if !in {
			continue
		}
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "opts:" {
			opts = f[1]
		}
		if len(f) >= 2 && strings.HasSuffix(f[0], ":") && f[0] == strings.ToUpper(f[0]) {
			if n, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				ops[strings.TrimSuffix(f[0], ":")] = n
			}
		}
	}
	return opts, ops, ok
}

// fioErrors returns the error count and bytes moved over every job of one
// fio JSON report.
func fioSummary(js string) (errs int, readBytes, writeBytes int64, err error) {
	var r struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"read"`
			Write struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := yaml.Unmarshal([]byte(js), &r); err != nil {
		return 0, 0, 0, err
	}
	if len(r.Jobs) == 0 {
		return 0, 0, 0, fmt.Errorf("no jobs in the report")
	}
	for _, j := range r.Jobs {
		errs += j.Error
		readBytes += j.Read.IOBytes
		writeBytes += j.Write.IOBytes
	}
	return errs, readBytes, writeBytes, nil
}

// metricSum adds the values of every sample of a metric whose labels contain
// all the given fragments.
func metricSum(text, name string, fragments ...string) float64 {
	var sum float64
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		match := true
		for _, f := range fragments {
			match = match && strings.Contains(l, f)
		}
		if f := strings.Fields(l); match && len(f) >= 2 {
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// newEnv connects to the cluster run.sh started; skips without it.
func newEnv(t *testing.T) *env {
	if os.Getenv("CHIMERA_KUBE_E2E") != "1" {
		t.Skip("needs the guest node cluster: run `make e2e`")
	}
	e := &env{t: t, ctx: context.Background(), kc: mustEnv(t, "KUBECONFIG"), helm: mustEnv(t, "HELM"),
		kubectl: mustEnv(t, "KUBECTL"), repo: mustEnv(t, "CHIMERA_REPO"), share: mustEnv(t, "NODE_SHARE")}
	kcBytes, err := os.ReadFile(e.kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kcBytes)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(chimerav1.AddToScheme(scheme))
	if e.k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestRealNode(t *testing.T) {
	e := newEnv(t)
	tl := &timeline{t0: time.Now()}
	t.Cleanup(func() {
		tl.print(t)
		if t.Failed() {
			e.dumpState()
		}
	})
	samples := filepath.Join(e.repo, "config", "samples")

	// The user's path is the README's (readme_test.go): its blocks run here,
	// as written but for the guest's edits listed there.
	blocks := mustDeployBlocks(t, e.repo)
	guest := &guestParams{dir: t.TempDir()}

	tl.run(t, "README deploy:install — helm install chimera (+ e2e values)", func() (string, error) {
		_, err := e.readmeStep(blocks, "install", guest, toolTimeout, nil)
		return "", err
	})
	tl.run(t, "README deploy:check-install — operator, CSI controller + node plugin", func() (string, error) {
		if _, err := e.readmeStep(blocks, "check-install", guest, 2*podsUpTimeout, nil); err != nil {
			return "", err
		}
		if _, err := e.podsRunning(releaseNS, map[string]string{"app.kubernetes.io/name": "chimera-operator"}, 1); err != nil {
			return "", err
		}
		if _, err := e.podsRunning(releaseNS, map[string]string{"app.kubernetes.io/component": "csi-controller"}, 1); err != nil {
			return "", err
		}
		_, err := e.podsRunning(releaseNS, map[string]string{"app.kubernetes.io/component": "csi-node"}, 1)
		return "", err
	})
	tl.run(t, "CSINode lists csi.chimera.io (kubelet registration)", func() (string, error) {
		return "", eventually(e.ctx, podsUpTimeout, func() error { return e.csiNodeHasDriver(true) })
	})

	tl.run(t, "README deploy:label — the storage node labelled", func() (string, error) {
		if _, err := e.readmeStep(blocks, "label", guest, toolTimeout, nil); err != nil {
			return "", err
		}
		n := &corev1.Node{}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Name: nodeName}, n); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: chimera.io/storage=%s", nodeName, n.Labels["chimera.io/storage"]), nil
	})

	// The TCP/memfs sample (1 MDS + 2 DS), scaled to the guest (guestCluster).
	cc := &chimerav1.ChimeraCluster{}
	tl.run(t, "README deploy:cluster + check-cluster — ChimeraCluster Available", func() (string, error) {
		if _, err := e.readmeStep(blocks, "cluster", guest, toolTimeout, nil); err != nil {
			return "", err
		}
		if _, err := e.readmeStep(blocks, "check-cluster", guest, clusterUpTimeout, nil); err != nil {
			return "", err
		}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: clusterNS, Name: clusterName}, cc); err != nil {
			return "", err
		}
		if cc.Status.Phase != chimerav1.PhaseAvailable || cc.Status.DataServersReady != 2 || len(cc.Status.DataServers) != 2 {
			var pods corev1.PodList
			_ = e.k8s.List(e.ctx, &pods, client.InNamespace(clusterNS))
			var states []string
			for i := range pods.Items {
				states = append(states, pods.Items[i].Name+"="+podState(&pods.Items[i]))
			}
			return "", fmt.Errorf("Available, yet phase %q, %d DS ready, status %+v, pods %v", cc.Status.Phase, cc.Status.DataServersReady, cc.Status.DataServers, states)
		}
		return fmt.Sprintf("MDS %s", cc.Status.MetadataServerEndpoint), nil
	})

	var mdsIP, token string
	var dsAddrs []string
	tl.run(t, "MDS admin API lists both DS addresses", func() (string, error) {
		mds := &corev1.Pod{}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: clusterNS, Name: render.MDSName(cc) + "-0"}, mds); err != nil {
			return "", err
		}
		mdsIP = mds.Status.PodIP
		sec := &corev1.Secret{}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: clusterNS, Name: render.AdminSecretName(cc)}, sec); err != nil {
			return "", err
		}
		token = string(sec.Data[render.SecretKeyToken])
		for _, ds := range cc.Status.DataServers {
			if ds.StorageAddress == "" || !ds.Ready {
				return "", fmt.Errorf("DS %s has no ready storage address: %+v", ds.Pod, ds)
			}
			dsAddrs = append(dsAddrs, ds.StorageAddress)
		}
		var body string
		err := eventually(e.ctx, 30*time.Second, func() error {
			code, b, err := e.nodeGet(fmt.Sprintf("https://%s:%d/api/v1/dataservers", mdsIP, render.PortAdmin), token)
			if err != nil {
				return err
			}
			if code != 200 {
				return fmt.Errorf("GET /api/v1/dataservers: HTTP %d %s", code, b)
			}
			for _, a := range dsAddrs {
				if !strings.Contains(b, a) {
					return fmt.Errorf("MDS data servers %s lack %s", b, a)
				}
			}
			body = b
			return nil
		})
		// An unauthenticated call must be refused.
		if err == nil {
			if code, _, err2 := e.nodeGet(fmt.Sprintf("https://%s:%d/api/v1/dataservers", mdsIP, render.PortAdmin), ""); err2 != nil || code != 401 {
				err = fmt.Errorf("admin API without a token: HTTP %d (%v), want 401", code, err2)
			}
		}
		return fmt.Sprintf("%v %s", dsAddrs, strings.TrimSpace(body)), err
	})

	// The sample StorageClass names the MDS by its Service's DNS name; this
	// node has no cluster DNS and no kube-proxy, so the guest's copy names
	// the MDS by pod IP (guestClass).
	pvc := &corev1.PersistentVolumeClaim{}
	var pv corev1.PersistentVolume
	var serverVolID string
	tl.run(t, "README deploy:storageclass + fio + check-pvc — PVC Bound (provisioner stand-in)", func() (string, error) {
		guest.mdsIP = mdsIP
		if _, err := e.readmeStep(blocks, "storageclass", guest, toolTimeout, nil); err != nil {
			return "", err
		}
		// The claim and the fio Job come in one file: the Job starts as
		// soon as the claim is Bound (its wait is the check-fio step).
		if _, err := e.readmeStep(blocks, "fio", guest, toolTimeout, nil); err != nil {
			return "", err
		}
		if _, err := e.readmeStep(blocks, "check-pvc", guest, pvcBoundTimeout, nil); err != nil {
			return "", fmt.Errorf("%w\nevents: %s", err, e.events(clusterNS, pvcName))
		}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: clusterNS, Name: pvcName}, pvc); err != nil {
			return "", err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return "", fmt.Errorf("PVC %s: %s", pvc.Status.Phase, e.events(clusterNS, pvc.Name))
		}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
			return "", err
		}
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driverName || pv.Annotations["pv.kubernetes.io/provisioned-by"] != driverName {
			return "", fmt.Errorf("PV %s is not a %s volume: %+v", pv.Name, driverName, pv.Spec.PersistentVolumeSource)
		}
		parts := strings.Split(pv.Spec.CSI.VolumeHandle, "#")
		serverVolID = parts[len(parts)-1]
		code, body, err := e.nodeGet(fmt.Sprintf("https://%s:%d/api/v1/volumes/%s", mdsIP, render.PortAdmin, serverVolID), token)
		if err != nil || code != 200 {
			return "", fmt.Errorf("the server does not know volume %s: HTTP %d %s (%v)", serverVolID, code, body, err)
		}
		return fmt.Sprintf("%s -> server volume %s", pv.Name, serverVolID), nil
	})

	// Bad input on the real path (1): a claim larger than the whole cluster.
	tl.run(t, "oversize PVC: ProvisioningFailed event names the capacity", func() (string, error) {
		big := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "too-big", Namespace: clusterNS},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
				StorageClassName: pvc.Spec.StorageClassName,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceStorage: *resource.NewQuantity(oversizeBytes, resource.BinarySI)}},
			},
		}
		if err := e.k8s.Create(e.ctx, big); err != nil {
			return "", err
		}
		msg, err := e.waitEvent(clusterNS, big.Name, "ProvisioningFailed", pvcBoundTimeout,
			"ResourceExhausted", "exceeds the cluster's storage capacity", strconv.FormatInt(memfsBytes, 10))
		if err != nil {
			return "", err
		}
		if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(big), big); err != nil {
			return "", err
		}
		if big.Status.Phase != corev1.ClaimPending || big.Spec.VolumeName != "" {
			return "", fmt.Errorf("the oversize PVC is %s (volume %q), want Pending and unbound", big.Status.Phase, big.Spec.VolumeName)
		}
		if err := e.k8s.Delete(e.ctx, big); err != nil {
			return "", err
		}
		return msg, nil
	})

	var fioLog string
	var layoutGets int64
	tl.run(t, "README deploy:check-fio — fio Job (sample, scaled, verify=crc32c) Completed", func() (string, error) {
		job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: clusterNS, Name: jobName}}
		failed := func() error {
			j := &batchv1.Job{}
			if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(job), j); err != nil {
				return nil
			}
			for _, cond := range j.Status.Conditions {
				if cond.Type == batchv1.JobFailed && cond.Status == corev1.ConditionTrue {
					return fmt.Errorf("job failed: %s %s", cond.Reason, cond.Message)
				}
			}
			return nil
		}
		// The block's last command prints the Job's log: what is asserted on.
		out, err := e.readmeStep(blocks, "check-fio", guest, fioJobTimeout, failed)
		fioLog = out
		if err != nil {
			// waitJob names the pods' states and events.
			if werr := e.waitJob(job, time.Second); werr != nil {
				err = fmt.Errorf("%w\n%v", err, werr)
			}
			log, _ := e.tool(e.kubectl, "logs", "-n", clusterNS, "job/"+jobName)
			return "", fmt.Errorf("%w\nfio log:\n%s", err, log)
		}
		notes, _, err := fioPhases(fioLog)
		if err != nil {
			return "", err
		}
		opts, ops, ok := mountStats(section(fioLog, "mountstats"), "/data")
		if !ok {
			return "", fmt.Errorf("no NFS mount at /data in the pod's mountstats")
		}
		if !strings.Contains(opts, "vers=4.1") {
			return "", fmt.Errorf("/data is not NFSv4.1: opts %s", opts)
		}
		if ops["WRITE"]+ops["READ"] == 0 && ops["LAYOUTGET"] == 0 {
			return "", fmt.Errorf("mountstats show no READ/WRITE/LAYOUTGET: %v", ops)
		}
		layoutGets = ops["LAYOUTGET"]
		notes = append(notes, fmt.Sprintf("vers=4.1, MDS ops WRITE %d READ %d LAYOUTGET %d", ops["WRITE"], ops["READ"], ops["LAYOUTGET"]))
		return strings.Join(notes, ", "), nil
	})

	tl.run(t, "pNFS flex-files: layouts granted, I/O on the DSes", func() (string, error) {
		if layoutGets == 0 {
			t.Logf("FLEXFILES-CHECK: OFF — the MDS granted no layouts (LAYOUTGET 0 in mountstats): all I/O went through the MDS; the DS-metrics assertion turns on when it does")
			return "SKIPPED: LAYOUTGET 0 (I/O through the MDS)", nil
		}
		var written, read, dsOps float64
		for _, a := range dsAddrs {
			code, body, err := e.nodeGet(fmt.Sprintf("http://%s:%d/metrics", a, render.PortMetrics), "")
			if err != nil || code != 200 {
				return "", fmt.Errorf("DS %s metrics: HTTP %d (%v)", a, code, err)
			}
			written += metricSum(body, "chimera_rpc_received_bytes_total", `program="nfs3"`, `op="write"`)
			read += metricSum(body, "chimera_rpc_sent_bytes_total", `program="nfs3"`, `op="read"`)
			dsOps += metricSum(body, "chimera_rpc_ops_total")
		}
		_, ops, _ := mountStats(section(fioLog, "mountstats"), "/data")
		mds := fmt.Sprintf("MDS mount ops: WRITE %d READ %d COMMIT %d LAYOUTGET %d GETDEVICEINFO %d LAYOUTRETURN %d LAYOUTERROR %d LAYOUTCOMMIT %d",
			ops["WRITE"], ops["READ"], ops["COMMIT"], ops["LAYOUTGET"], ops["GETDEVICEINFO"], ops["LAYOUTRETURN"], ops["LAYOUTERROR"], ops["LAYOUTCOMMIT"])
		t.Logf("FLEXFILES-CHECK: ON — LAYOUTGET %d; DS nfs3 write bytes in %.0f, read bytes out %.0f, DS RPC ops %.0f; %s", layoutGets, written, read, dsOps, mds)
		if written < volumeBytes/8 {
			return "", &softError{fmt.Errorf("layouts were granted (LAYOUTGET %d) but the DSes received %.0f WRITE bytes (%.0f RPC ops): the kernel client's I/O went through the MDS; %s", layoutGets, written, dsOps, mds)}
		}
		return fmt.Sprintf("LAYOUTGET %d, DS write bytes %.0f, DS read bytes %.0f", layoutGets, written, read), nil
	})

	// The in-process engine Job (engine_test.go): no later step depends on
	// it, so a failure is reported and the flow goes on.
	tl.run(t, "fio engine Job (in-process client, pNFS, verify) Completed", func() (string, error) {
		note, err := e.engineJob(samples, mdsIP, pv.Spec.CSI.VolumeAttributes["exportPath"], dsAddrs)
		if err != nil {
			return note, &softError{err}
		}
		return note, nil
	})

	// CSI mountMode: sidecar (sidecar_e2e_test.go), soft as the engine Job.
	tl.run(t, "sidecar-mode PVC: fio through chimera-fuse, node plugin deleted mid-run, RWX reader", func() (string, error) {
		note, err := e.sidecarFlow(samples, mdsIP)
		if err != nil {
			return note, &softError{err}
		}
		return note, nil
	})

	// Bad input on the real path (2): a volume whose cluster is gone. A PV
	// outlives a deleted ChimeraCluster; what is left is its volume handle
	// and context naming a server address nobody answers on any more. The
	// test writes such a PV by hand (the bound PV's fields, the server moved
	// to goneServer, an unused pod-network address) instead of booting and
	// deleting a second cluster on the emulated guest. The pod must get a
	// clear mount error; the next step, run while this pod still fails,
	// proves the node plugin goes on serving the live volume.
	var csiNodeRestarts int32
	tl.run(t, "volume of a gone cluster: FailedMount event, plugin unaffected", func() (string, error) {
		restarts, err := e.csiNodeRestarts()
		if err != nil {
			return "", err
		}
		csiNodeRestarts = restarts
		attrs := map[string]string{}
		for k, v := range pv.Spec.CSI.VolumeAttributes {
			attrs[k] = v
		}
		attrs["server"] = goneServer
		gonePV := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "gone-pv"},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      pv.Spec.Capacity,
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				MountOptions:                  pv.Spec.MountOptions,
				ClaimRef:                      &corev1.ObjectReference{Namespace: clusterNS, Name: "gone-pvc"},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver:           driverName,
					VolumeHandle:     fmt.Sprintf("chimera1#http://%s:%d#gone", goneServer, render.PortAdmin),
					VolumeAttributes: attrs,
				}},
			},
		}
		empty := ""
		gonePVC := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "gone-pvc", Namespace: clusterNS},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
				StorageClassName: &empty,
				VolumeName:       gonePV.Name,
				Resources:        corev1.VolumeResourceRequirements{Requests: pv.Spec.Capacity},
			},
		}
		pod := readerPod("gone-reader", gonePVC.Name, "ls /data", false)
		for _, o := range []client.Object{gonePV, gonePVC, pod} {
			if err := e.k8s.Create(e.ctx, o); err != nil {
				return "", err
			}
		}
		msg, err := e.waitEvent(clusterNS, pod.Name, "FailedMount", podsUpTimeout, "Unavailable", goneServer+":", "does not answer")
		if err != nil {
			return "", err
		}
		if err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return "", err
		}
		if pod.Status.Phase != corev1.PodPending {
			return "", fmt.Errorf("the pod of the gone volume is %s, want Pending", pod.Status.Phase)
		}
		return msg, nil
	})

	tl.run(t, "second pod reads the first pod's files over RWX", func() (string, error) {
		want := section(fioLog, "sha256")
		if want == "" {
			return "", fmt.Errorf("the fio pod printed no checksums")
		}
		reader := readerPod("rwx-reader", pvc.Name, "cd /data/fio && sha256sum *", true)
		if err := e.k8s.Create(e.ctx, reader); err != nil {
			return "", err
		}
		if err := e.waitPodDone(reader, podsUpTimeout); err != nil {
			out, _ := e.tool(e.kubectl, "logs", "-n", clusterNS, reader.Name)
			return "", fmt.Errorf("%w\nreader log:\n%s", err, out)
		}
		got, err := e.tool(e.kubectl, "logs", "-n", clusterNS, reader.Name)
		if err != nil {
			return "", err
		}
		if strings.TrimSpace(got) != want {
			return "", fmt.Errorf("the reader saw\n%s\nthe writer wrote\n%s", got, want)
		}
		// All the while the gone volume's pod kept failing, in the same plugin.
		gone := &corev1.Pod{}
		if err := e.k8s.Get(e.ctx, client.ObjectKey{Namespace: clusterNS, Name: "gone-reader"}, gone); err != nil {
			return "", err
		}
		if gone.Status.Phase != corev1.PodPending {
			return "", fmt.Errorf("the gone volume's pod is %s, want still Pending", gone.Status.Phase)
		}
		if r, err := e.csiNodeRestarts(); err != nil || r != csiNodeRestarts {
			return "", fmt.Errorf("the CSI node plugin restarted (%d -> %d, %v) while a volume's server was gone", csiNodeRestarts, r, err)
		}
		return fmt.Sprintf("%d files, same SHA-256; gone volume's pod still Pending, node plugin restarts %d", len(strings.Split(want, "\n")), csiNodeRestarts), nil
	})

	tl.run(t, "pods gone: no NFS mount left on the node", func() (string, error) {
		bg := client.PropagationPolicy(metav1.DeletePropagationBackground)
		for _, o := range []client.Object{
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "rwx-reader", Namespace: clusterNS}},
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gone-reader", Namespace: clusterNS}},
			&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "gone-pvc", Namespace: clusterNS}},
			&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "gone-pv"}},
		} {
			if err := e.k8s.Delete(e.ctx, o); err != nil {
				return "", err
			}
		}
		if err := e.k8s.Delete(e.ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "fio-kernel", Namespace: clusterNS}}, bg); err != nil {
			return "", err
		}
		if err := e.k8s.Delete(e.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fio-workload", Namespace: clusterNS}}); err != nil {
			return "", err
		}
		return "", eventually(e.ctx, teardownTimeout, func() error {
			var pods corev1.PodList
			if err := e.k8s.List(e.ctx, &pods, client.InNamespace(clusterNS), client.MatchingLabels{"job-name": "fio-kernel"}); err != nil {
				return err
			}
			if len(pods.Items) != 0 {
				return fmt.Errorf("%d fio pods left", len(pods.Items))
			}
			m, err := e.nodeNFSMounts()
			if err != nil {
				return err
			}
			if len(m) != 0 {
				return fmt.Errorf("NFS mounts left on the node: %v", m)
			}
			return nil
		})
	})

	tl.run(t, "delete PVC deletes the server volume", func() (string, error) {
		if err := e.k8s.Delete(e.ctx, pvc); err != nil {
			return "", err
		}
		return "", eventually(e.ctx, teardownTimeout, func() error {
			err := e.k8s.Get(e.ctx, client.ObjectKey{Name: pv.Name}, &corev1.PersistentVolume{})
			if err == nil {
				return fmt.Errorf("PV %s still exists: %s", pv.Name, e.events("", pv.Name))
			}
			if !apierrors.IsNotFound(err) {
				return err
			}
			code, body, err := e.nodeGet(fmt.Sprintf("https://%s:%d/api/v1/volumes/%s", mdsIP, render.PortAdmin, serverVolID), token)
			if err != nil {
				return err
			}
			if code != 404 {
				return fmt.Errorf("server volume %s: HTTP %d %s, want 404", serverVolID, code, body)
			}
			return nil
		})
	})

	tl.run(t, "delete ChimeraCluster: its pods and objects gone", func() (string, error) {
		if err := e.k8s.Delete(e.ctx, cc); err != nil {
			return "", err
		}
		return "", eventually(e.ctx, teardownTimeout, func() error {
			err := e.k8s.Get(e.ctx, client.ObjectKeyFromObject(cc), &chimerav1.ChimeraCluster{})
			if err == nil {
				return fmt.Errorf("ChimeraCluster still exists")
			}
			if !apierrors.IsNotFound(err) {
				return err
			}
			var pods corev1.PodList
			if err := e.k8s.List(e.ctx, &pods, client.InNamespace(clusterNS)); err != nil {
				return err
			}
			if len(pods.Items) != 0 {
				return fmt.Errorf("%d pods left in %s", len(pods.Items), clusterNS)
			}
			return nil
		})
	})

	// Upgrades without an I/O error (rollout_e2e_test.go): a durable
	// cluster of its own, rolled to a second image tag under a fio verify
	// Job; it cleans up after itself, so the checks below still hold.
	// CHIMERA_E2E_ROLLOUT=N runs it N times (make e2e: once; make
	// e2e-rollout ROLLOUTS=N), ~4 minutes each on this guest.
	if n, _ := strconv.Atoi(os.Getenv("CHIMERA_E2E_ROLLOUT")); n > 0 {
		for run := 1; run <= n; run++ {
			name := "rolling upgrade (diskfs on PVs, pNFS mirrors 2) under a fio verify Job: zero errors"
			if n > 1 {
				name += fmt.Sprintf(" (run %d of %d)", run, n)
			}
			tl.run(t, name, func() (string, error) {
				return e.rollingUpgrade(cc, samples, run)
			})
		}
	} else {
		t.Logf("CHIMERA_E2E_ROLLOUT=%q: the rolling-upgrade step does not run (make e2e runs it once)", os.Getenv("CHIMERA_E2E_ROLLOUT"))
	}

	tl.run(t, "helm uninstall: nothing left, no mounts", func() (string, error) {
		if _, err := e.tool(e.helm, "uninstall", releaseName, "--namespace", releaseNS, "--wait", "--timeout", "120s"); err != nil {
			return "", err
		}
		if err := e.k8s.Delete(e.ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: scName}}); err != nil {
			return "", err
		}
		var left []string
		err := eventually(e.ctx, teardownTimeout, func() error {
			left = e.leftovers()
			if len(left) != 0 {
				return fmt.Errorf("left behind: %v", left)
			}
			m, err := e.nodeNFSMounts()
			if err != nil {
				return err
			}
			if len(m) != 0 {
				return fmt.Errorf("NFS mounts left on the node: %v", m)
			}
			return nil
		})
		return "", err
	})
}

// leftovers lists what the product left in the cluster: pods and workloads in
// the release and cluster namespaces, PVs, the CSIDriver, the driver in
// CSINode. (The CRD stays: helm never deletes CRDs. The namespaces' default
// objects are not ours.)
func (e *env) leftovers() []string {
	var left []string
	for _, ns := range []string{releaseNS, clusterNS} {
		lists := map[string]client.ObjectList{
			"pods": &corev1.PodList{}, "services": &corev1.ServiceList{}, "secrets": &corev1.SecretList{},
			"configmaps": &corev1.ConfigMapList{}, "serviceaccounts": &corev1.ServiceAccountList{},
			"pvcs": &corev1.PersistentVolumeClaimList{},
		}
		keys := make([]string, 0, len(lists))
		for k := range lists {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, kind := range keys {
			l := lists[kind]
			if err := e.k8s.List(e.ctx, l, client.InNamespace(ns)); err != nil {
				left = append(left, fmt.Sprintf("%s/%s: %v", ns, kind, err))
				continue
			}
			items, _ := metaNames(l)
			for _, n := range items {
				if n == "kube-root-ca.crt" || n == "default" {
					continue
				}
				left = append(left, fmt.Sprintf("%s %s/%s", kind, ns, n))
			}
		}
	}
	var pvs corev1.PersistentVolumeList
	if err := e.k8s.List(e.ctx, &pvs); err == nil {
		for _, p := range pvs.Items {
			left = append(left, "pv "+p.Name)
		}
	}
	if err := e.k8s.Get(e.ctx, client.ObjectKey{Name: driverName}, &storagev1.CSIDriver{}); err == nil {
		left = append(left, "csidriver "+driverName)
	}
	cn := &storagev1.CSINode{}
	if err := e.k8s.Get(e.ctx, client.ObjectKey{Name: nodeName}, cn); err == nil {
		for _, d := range cn.Spec.Drivers {
			left = append(left, "csinode driver "+d.Name)
		}
	}
	return left
}

func metaNames(l client.ObjectList) ([]string, error) {
	items, err := meta.ExtractList(l)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(items))
	for _, o := range items {
		m, err := meta.Accessor(o)
		if err != nil {
			return nil, err
		}
		out = append(out, m.GetName())
	}
	return out, nil
}

// events returns the messages of the events about one object, oldest first.
func (e *env) events(ns, name string) string {
	var evs corev1.EventList
	if err := e.k8s.List(e.ctx, &evs, client.InNamespace(ns)); err != nil {
		return ""
	}
	var out []string
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Name == name {
			out = append(out, fmt.Sprintf("[%s %s: %s]", ev.Type, ev.Reason, ev.Message))
		}
	}
	return strings.Join(out, " ")
}

// eventMessage returns the newest message of an event with this reason about
// one object, prefixed by the event's reason, or "".
// readerPod is a one-shot pod of the preloaded fio image running `script`
// with claim mounted at /data.
func readerPod(name, claim, script string, readOnly bool) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: clusterNS},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "reader", Image: "localhost/chimera-fio:dev", ImagePullPolicy: corev1.PullNever,
				Command:      []string{"/bin/sh", "-c", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: readOnly}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: readOnly}}}},
		},
	}
}

// waitEvent waits up to timeout for the newest `reason` event on object
// `name` to carry every string of want; it returns that event's message, or
// an error listing the object's events.
func (e *env) waitEvent(ns, name, reason string, timeout time.Duration, want ...string) (string, error) {
	var msg string
	err := eventually(e.ctx, timeout, func() error {
		msg = e.eventMessage(ns, name, reason)
		for _, w := range want {
			if !strings.Contains(msg, w) {
				return fmt.Errorf("no %s event on %s with %q yet: %s", reason, name, w, e.events(ns, name))
			}
		}
		return nil
	})
	return msg, err
}

func (e *env) eventMessage(ns, name, reason string) string {
	var evs corev1.EventList
	if err := e.k8s.List(e.ctx, &evs, client.InNamespace(ns)); err != nil {
		return ""
	}
	var msg string
	var last time.Time
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Name != name || ev.Reason != reason {
			continue
		}
		if t := ev.LastTimestamp.Time; msg == "" || t.After(last) {
			msg, last = reason+": "+ev.Message, t
		}
	}
	return msg
}

// csiNodeRestarts sums the restart counts of the CSI node plugin's containers.
func (e *env) csiNodeRestarts() (int32, error) {
	var pods corev1.PodList
	if err := e.k8s.List(e.ctx, &pods, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/component": "csi-node"}); err != nil {
		return 0, err
	}
	if len(pods.Items) != 1 {
		return 0, fmt.Errorf("%d CSI node plugin pods, want 1", len(pods.Items))
	}
	var n int32
	for _, cs := range pods.Items[0].Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n, nil
}

// dumpState logs what a failed run needs to be understood.
func (e *env) dumpState() {
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		{"get", "chimeraclusters", "-A", "-o", "yaml"},
		{"logs", "-n", releaseNS, "-l", "app.kubernetes.io/name=chimera-csi", "--all-containers", "--tail=60"},
		{"logs", "-n", releaseNS, "-l", "app.kubernetes.io/name=chimera-operator", "--tail=60"},
		{"logs", "-n", clusterNS, "-l", "app.kubernetes.io/name=chimera", "--tail=40"},
	} {
		out, _ := e.tool(e.kubectl, args...)
		e.t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
	}
}
