package fakecluster

// Proves, on a whole cluster minus containers (real etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler; kwok fakes three nodes and
// the pod lifecycle):
//   - `helm install` of charts/chimera is accepted by the apiserver: CRDs,
//     operator Deployment, RBAC, the validating webhook, the CSI driver's
//     CSIDriver, controller Deployment, node DaemonSet and StorageClass; their
//     pods are scheduled and marked Running.
//   - the real operator binary (on the host, see below, with the identity and
//     so the RBAC of the chart's operator ServiceAccount) serves its webhook
//     with a self-managed certificate: a bad ChimeraCluster sent with
//     `kubectl apply` is refused with a message naming the field.
//   - `kubectl apply` of the production sample (RDMA + NVMe) gives MDS and DS
//     pods that the real scheduler places only on nodes with the hugepages,
//     NVMe and RDMA capacity they request (a node without them gets none),
//     with the device requests, Multus annotation, hugepage volume and
//     capabilities the design names, Running with pod IPs; backend nvme
//     (diskfs): the MDS's metadata claim binds (a static PV plays the
//     StorageClass's provisioner) and outlives the cluster, the pods start
//     through the ConfigMap's start script, DSes naming the device plugin's
//     PCIDEVICE_* variable.
//   - the MDS's export client rules (on the real chimerad) admit every
//     node's address and the sample's spec.access subnet; a node that joins
//     is admitted, one that leaves no longer.
//   - the operator reads each DS's storage address from its Multus
//     network-status annotation (or, for the TCP sample without Multus, its
//     pod IP) and pushes the list to a real chimerad's admin API; status turns Available with per-DS entries; a DS pod that is
//     deleted and comes back with a new address is re-pushed; scaling down
//     shrinks the list.
//   - a PVC on the chart's StorageClass is provisioned by our CSI controller
//     against the same chimerad and becomes Bound; deleting it deletes the
//     volume on the server.
//   - the operator records events for the transitions and holds its
//     leader-election lease.
//   - deleting the ChimeraCluster leaves no children (owner references +
//     the garbage collector in kube-controller-manager, after the finalizer),
//     and `helm uninstall` leaves nothing behind.
//
// What the test plays, and why:
//   - kwok runs no containers, so the operator Deployment's pod "runs" on a
//     fake node while the real operator binary runs on the host against the
//     apiserver (--mds-admin-url points it at chimerad on 127.0.0.1, which
//     stands for the MDS pod; the chart's webhook.url makes the apiserver
//     call the host's webhook at https://127.0.0.1:<port>).
//   - Multus: the test writes the network-status annotation a CNI would.
//   - external-provisioner: its image cannot be fetched here (TESTING.md),
//     so the test does what the sidecar does: CreateVolume over gRPC to the
//     chimera-csi controller with the StorageClass parameters and the
//     provisioner secret, then a PV bound to the PVC with the sidecar's
//     fields; on PVC deletion DeleteVolume and the PV removed. Its API calls
//     are made as the chart's CSI controller ServiceAccount, so the chart's
//     RBAC is tested too.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/internal/testutil"
	"github.com/chimera-k8s/chimera/operator/render"
	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// Bounds of the whole-cluster test (the Makefile's go test -timeout is the
// outer bound; processes die with the test through Pdeathsig and pid files).
const (
	waitTimeout    = 90 * time.Second
	processTimeout = 8 * time.Minute
	pollInterval   = 250 * time.Millisecond
	// The PVC's size: small, the server is a memfs of memfsCapacity.
	pvcBytes      = 64 << 20
	memfsCapacity = "256M"

	releaseNS    = "chimera-system"
	sampleNS     = "storage"
	clusterName  = "chimera-prod"
	scName       = "chimera"
	storageNet   = "192.168.50."
	samplePath   = "../../config/samples/storage_v1alpha1_chimeracluster_rdma_nvme.yaml"
	provisionerD = "csi.chimera.io"
)

func env(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CHIMERA_REQUIRE_FAKECLUSTER") != "" {
			t.Fatalf("%s is not set (make e2e-fakecluster sets it)", name)
		}
		t.Skipf("%s not set; run make e2e-fakecluster", name)
	}
	return v
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(pollInterval)
	}
	t.Fatalf("timed out after %v waiting for %s: %v", waitTimeout, what, err)
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startProcess runs a binary until stopped or the test ends. Its pid goes
// into dir/<name>.pid so controlplane.sh stop (run by the Makefile even when
// the test binary dies) kills it too; Pdeathsig covers a killed test.
func startProcess(t *testing.T, dir, name, bin string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	pidFile := filepath.Join(dir, name+".pid")
	_ = os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		cancel()
		f.Close()
		_ = os.Remove(pidFile)
		if t.Failed() {
			t.Logf("%s log tail:\n%s", name, tail(logPath, 3000))
		}
	})
	return p
}

// stop asks for an orderly exit, then kills.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// tool runs helm or kubectl against the cluster and returns its output.
func tool(kc, bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", kc)...).CombinedOutput()
	return string(out), err
}

func TestFakeCluster(t *testing.T) {
	bins := env(t, "CHIMERA_K8S_BIN")
	kwok := env(t, "KWOK")
	stages := env(t, "KWOK_STAGES")
	helm := env(t, "HELM")
	kubectl := env(t, "KUBECTL")
	chimerad := env(t, "CHIMERAD")
	operator := env(t, "CHIMERA_OPERATOR")
	csiBin := env(t, "CHIMERA_CSI")
	dir := os.Getenv("FAKECLUSTER_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	ctx := context.Background()
	// Our client's warnings (the webhook's, on update) are asserted, not logged.
	logf.SetLogger(logr.Discard())

	// The control plane, torn down however the test ends.
	cp := exec.Command("./controlplane.sh", "start", dir)
	// Free ports rather than the script's defaults: two runs on one machine
	// (CI and a developer) must not collide.
	cpPorts := testutil.FreePorts(t, 3)
	cp.Env = append(os.Environ(), "K8S_BIN="+bins, fmt.Sprintf("APISERVER_PORT=%d", cpPorts[0]),
		fmt.Sprintf("ETCD_PORT=%d", cpPorts[1]), fmt.Sprintf("ETCD_PEER_PORT=%d", cpPorts[2]))
	if out, err := cp.CombinedOutput(); err != nil {
		t.Fatalf("controlplane.sh start: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
				t.Logf("%s log tail:\n%s", c, tail(filepath.Join(dir, c+".log"), 2000))
			}
		}
		_ = exec.Command("./controlplane.sh", "stop", dir).Run()
	})
	kc := filepath.Join(dir, "kubeconfig")
	kcBytes, err := os.ReadFile(kc)
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
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	startProcess(t, dir, "kwok", kwok, "--kubeconfig="+kc, "--config="+stages, "--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--server-address=",
		"--cidr=10.0.0.1/24", "--node-ip=10.0.0.1")

	// Two storage nodes shaped like the reference deployment (16 NVMe, RoCE
	// VFs, 1 GiB hugepages) and a node with the storage label but none of
	// the devices.
	nodes := []*corev1.Node{
		fakeNode("storage-1", map[string]string{"chimera.io/storage": "true", "chimera.io/mds": "true"}, storageCapacity(true)),
		fakeNode("storage-2", map[string]string{"chimera.io/storage": "true"}, storageCapacity(true)),
		fakeNode("plain-1", map[string]string{"chimera.io/storage": "true"}, storageCapacity(false)),
	}
	for _, n := range nodes {
		if err := k8s.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "fake nodes Ready", func() error {
		for _, n := range nodes {
			cur := &corev1.Node{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(n), cur); err != nil {
				return err
			}
			if !nodeReady(cur) {
				return fmt.Errorf("node %s not ready", n.Name)
			}
		}
		return nil
	})

	// The operator's webhook and probe ports are named on its command line
	// and in the chart before it runs (controller-runtime reports no bound
	// port): probed free ports, the only guessed ones besides the control
	// plane's. The MDS admin API is reached through adminProxy, which follows
	// the port each chimerad reports.
	ports := testutil.FreePorts(t, 2)
	webhookPort, probePort := ports[0], ports[1]
	admin := newAdminProxy(t)
	adminURL := admin.URL()
	installChart(t, ctx, k8s, kc, helm, webhookPort, adminURL)

	// The operator binary on the host, its webhook on 127.0.0.1, acting as
	// the chart's operator ServiceAccount: the chart's RBAC must be enough.
	opKC := impersonatingKubeconfig(t, kcBytes, filepath.Join(dir, "operator.kubeconfig"), "system:serviceaccount:"+releaseNS+":chimera-operator")
	opProc := startProcess(t, dir, "chimera-operator", operator, "--kubeconfig="+opKC,
		"--namespace="+releaseNS, "--leader-elect=true", "--metrics-bind-address=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probePort),
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", webhookPort),
		"--webhook-cert-dir="+filepath.Join(dir, "webhook-certs"), "--webhook-cert-extra-sans=127.0.0.1",
		"--mds-admin-url="+adminURL)
	eventually(t, "operator /readyz (webhook serving)", func() error {
		return httpOK(fmt.Sprintf("http://127.0.0.1:%d/readyz", probePort))
	})

	// The sample's namespace, then a bad cluster: refused by the webhook.
	sample, err := os.ReadFile(samplePath)
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sampleNS}}); err != nil {
		t.Fatal(err)
	}
	webhookRejectsBadCluster(t, ctx, k8s, kc, kubectl, string(sample))

	// The sample's MDS keeps its namespace on a claim of StorageClass
	// local-path; here a static PV of that class stands for the provisioner.
	metaPV := metadataVolume(t, ctx, k8s)

	// The production sample, as shipped, with kubectl.
	if out, err := tool(kc, kubectl, "apply", "-f", samplePath); err != nil {
		t.Fatalf("kubectl apply %s: %v\n%s", samplePath, err, out)
	}
	// The MDS (played by chimerad on 127.0.0.1) reads the token the operator
	// generated, as the MDS pod does from the mounted Secret.
	sec := &corev1.Secret{}
	eventually(t, "admin-token Secret", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: sampleNS, Name: clusterName + "-admin-token"}, sec)
	})
	mdsToken := string(sec.Data["token"])
	sampleCluster := &chimerav1.ChimeraCluster{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: sampleNS, Name: clusterName}, sampleCluster); err != nil {
		t.Fatal(err)
	}
	mdsProc := startChimerad(t, ctx, k8s, dir, "chimerad", chimerad, admin, sampleCluster, mdsToken)
	multus := playMultus(t, k8s)

	c := &chimerav1.ChimeraCluster{}
	eventually(t, "MDS on storage-1, one DS on each storage node, all Running with pod IPs", func() error {
		placement, err := placementOf(ctx, k8s, sampleNS)
		if err != nil {
			return err
		}
		want := clusterName + "-ds-0," + clusterName + "-ds-1=storage-1|storage-2 " + clusterName + "-mds-0=storage-1"
		if placement != want {
			return fmt.Errorf("placement %q, want %q", placement, want)
		}
		return podsRunningWithIPs(ctx, k8s, sampleNS, client.MatchingLabels{render.LabelCluster: clusterName}, 3)
	})
	noStoragePodOn(t, ctx, k8s, "plain-1")
	checkPodShapes(t, ctx, k8s)

	eventually(t, "ChimeraCluster Available with both DS addresses at the MDS", func() error {
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: sampleNS, Name: clusterName}, c); err != nil {
			return err
		}
		if c.Status.Phase != chimerav1.PhaseAvailable || c.Status.DataServersReady != 2 || len(c.Status.DataServers) != 2 {
			return fmt.Errorf("phase %q ready %d dataServers %+v conditions %+v", c.Status.Phase, c.Status.DataServersReady, c.Status.DataServers, c.Status.Conditions)
		}
		return mdsHas(adminURL, mdsToken, multus.addresses())
	})
	if got, err := mdsList(adminURL, mdsToken); err == nil {
		t.Logf("MDS data-server list: %s", got)
	}
	for _, ds := range c.Status.DataServers {
		if !strings.HasPrefix(ds.StorageAddress, storageNet) || ds.Node == "" || ds.Pod == "" || !ds.Ready {
			t.Fatalf("status entry %+v: want a ready pod on a node with a storage-network address", ds)
		}
	}
	if !conditionTrue(c, "Available") || c.Status.MetadataServerEndpoint == "" {
		t.Fatalf("Available condition / MDS endpoint missing: %+v endpoint %q", c.Status.Conditions, c.Status.MetadataServerEndpoint)
	}
	// The transitions were told as events, and the operator holds its
	// leader-election lease.
	eventually(t, "operator events on the cluster", func() error {
		return eventsSay(ctx, k8s, sampleNS, clusterName, "AdminTokenCreated", "PhaseAvailable")
	})
	lease := &coordinationv1.Lease{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: releaseNS, Name: "chimera-operator.storage.chimera.io"}, lease); err != nil ||
		lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatalf("leader-election lease: %v %+v", err, lease.Spec)
	}

	exportClientsFollowNodes(t, ctx, k8s, adminURL, mdsToken)

	// A DS rescheduled with a new storage address is re-pushed.
	ds1 := &corev1.Pod{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: sampleNS, Name: clusterName + "-ds-1"}, ds1); err != nil {
		t.Fatal(err)
	}
	oldAddr := multus.addressOf(ds1.UID)
	if err := k8s.Delete(ctx, ds1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ds-1 back with a new address, re-pushed to the MDS", func() error {
		cur := &corev1.Pod{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: sampleNS, Name: clusterName + "-ds-1"}, cur); err != nil {
			return err
		}
		newAddr := multus.addressOf(cur.UID)
		if cur.UID == ds1.UID || newAddr == "" || cur.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("ds-1 not replaced yet (uid %s phase %s)", cur.UID, cur.Status.Phase)
		}
		got, err := mdsList(adminURL, mdsToken)
		if err != nil {
			return err
		}
		if strings.Contains(got, `"`+oldAddr) || !strings.Contains(got, newAddr) {
			return fmt.Errorf("MDS list %s: want %s instead of %s", got, newAddr, oldAddr)
		}
		return nil
	})

	// The provisioner acts as the chart's CSI controller ServiceAccount, so
	// the chart's RBAC is what allows (or refuses) each of its calls.
	provCfg := rest.CopyConfig(cfg)
	provCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + releaseNS + ":chimera-csi-controller"}
	prov, err := client.New(provCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	provisionThroughCSI(t, ctx, k8s, prov, dir, csiBin, adminURL, mdsToken)

	// Scale the DSes down to one: the pod goes, the MDS list follows.
	eventually(t, "scale to one DS accepted", func() error {
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: sampleNS, Name: clusterName}, c); err != nil {
			return err
		}
		one := int32(1)
		c.Spec.DataServers.Count = &one
		return k8s.Update(ctx, c)
	})
	eventually(t, "one DS left, at the MDS too, cluster Available", func() error {
		pods := &corev1.PodList{}
		if err := k8s.List(ctx, pods, client.InNamespace(sampleNS), client.MatchingLabels(render.SelectorLabels(c, render.ComponentDS))); err != nil {
			return err
		}
		cur := &chimerav1.ChimeraCluster{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
			return err
		}
		got, err := mdsList(adminURL, mdsToken)
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 || cur.Status.Phase != chimerav1.PhaseAvailable || len(cur.Status.DataServers) != 1 || strings.Count(got, storageNet) != 1 {
			return fmt.Errorf("%d DS pods, phase %q, %d status entries, MDS list %s", len(pods.Items), cur.Status.Phase, len(cur.Status.DataServers), got)
		}
		return nil
	})

	// Deleting the cluster leaves no children.
	if out, err := tool(kc, kubectl, "delete", "chimeracluster", clusterName, "-n", sampleNS, "--wait=true", "--timeout=90s"); err != nil {
		t.Fatalf("kubectl delete chimeracluster: %v\n%s", err, out)
	}
	// The MDS's metadata claim outlives the cluster (the namespace is on
	// it); deleting it by hand frees it, and then nothing is left.
	claim := &corev1.PersistentVolumeClaim{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: sampleNS, Name: render.MetadataClaimName + "-" + clusterName + "-mds-0"}, claim); err != nil || claim.Spec.VolumeName != metaPV.Name {
		t.Fatalf("metadata claim not retained after the cluster's deletion (or not bound to %s): %v %+v", metaPV.Name, err, claim.Spec)
	}
	if err := k8s.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, metaPV); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, "no children of the cluster left", func() error { return noneLeft(ctx, k8s, sampleNS) })
	multus.stop()

	// Without Multus a DS's storage address is its pod IP (kwok's here).
	mdsProc.stop()
	podIPCluster(t, ctx, k8s, dir, kc, kubectl, chimerad, admin)

	// Uninstall: the operator goes first, as its pod would with the release.
	opProc.stop()
	if out, err := tool(kc, helm, "uninstall", "chimera", "--namespace", releaseNS, "--wait", "--timeout", "90s"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	eventually(t, "nothing of the release left", func() error {
		if err := noneLeft(ctx, k8s, releaseNS); err != nil {
			return err
		}
		return noClusterScopedLeft(ctx, k8s)
	})
}

// impersonatingKubeconfig writes a copy of the admin kubeconfig whose user
// acts as `as` (kubeconfig "as:"), so a binary gets exactly that identity's
// permissions.
func impersonatingKubeconfig(t *testing.T, admin []byte, path, as string) string {
	t.Helper()
	kcfg, err := clientcmd.Load(admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kcfg.AuthInfos {
		ai.Impersonate = as
	}
	if err := clientcmd.WriteToFile(*kcfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// installChart runs `helm install` with the CSI StorageClass pointing at the
// MDS admin API on 127.0.0.1 and the webhook reached by URL, then checks
// that every chart workload is scheduled and Running and the CSI objects
// have the fields the design names.
func installChart(t *testing.T, ctx context.Context, k8s client.Client, kc, helm string, webhookPort int, adminURL string) {
	t.Helper()
	out, err := tool(kc, helm, "install", "chimera", "../../charts/chimera", "--namespace", releaseNS, "--create-namespace",
		"--set", fmt.Sprintf("webhook.url=https://127.0.0.1:%d", webhookPort),
		"--set", "csi.storageClasses[0].name="+scName,
		"--set", "csi.storageClasses[0].adminEndpoint="+adminURL,
		"--set", "csi.storageClasses[0].secretName="+clusterName+"-admin-token",
		"--set", "csi.storageClasses[0].secretNamespace="+sampleNS,
		"--set", "csi.storageClasses[0].nconnect=4",
		"--wait", "--timeout", "90s")
	if err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	eventually(t, "chart workloads Running on fake nodes", func() error {
		if err := podsRunningWithIPs(ctx, k8s, releaseNS, client.MatchingLabels{"app.kubernetes.io/name": "chimera-operator"}, 1); err != nil {
			return err
		}
		if err := podsRunningWithIPs(ctx, k8s, releaseNS, client.MatchingLabels{"app.kubernetes.io/component": "csi-controller"}, 2); err != nil {
			return err
		}
		// The node plugin tolerates everything: one per node.
		return podsRunningWithIPs(ctx, k8s, releaseNS, client.MatchingLabels{"app.kubernetes.io/component": "csi-node"}, 3)
	})
	drv := &storagev1.CSIDriver{}
	if err := k8s.Get(ctx, types.NamespacedName{Name: provisionerD}, drv); err != nil {
		t.Fatalf("CSIDriver %s: %v", provisionerD, err)
	}
	if drv.Spec.AttachRequired == nil || *drv.Spec.AttachRequired || drv.Spec.PodInfoOnMount == nil || !*drv.Spec.PodInfoOnMount ||
		drv.Spec.FSGroupPolicy == nil || *drv.Spec.FSGroupPolicy != storagev1.FileFSGroupPolicy {
		t.Fatalf("CSIDriver spec %+v: want attachRequired false, podInfoOnMount true, fsGroupPolicy File", drv.Spec)
	}
	sc := &storagev1.StorageClass{}
	if err := k8s.Get(ctx, types.NamespacedName{Name: scName}, sc); err != nil {
		t.Fatalf("StorageClass %s: %v", scName, err)
	}
	if sc.Provisioner != provisionerD || sc.Parameters["adminEndpoint"] != adminURL {
		t.Fatalf("StorageClass %+v", sc)
	}
}

func webhookRejectsBadCluster(t *testing.T, ctx context.Context, k8s client.Client, kc, kubectl, sample string) {
	t.Helper()
	// Two DSes cannot hold three mirrors: only the webhook can say that
	// (the schema allows 1-3 mirrors and any count).
	bad := strings.Replace(sample[strings.Index(sample, "apiVersion: storage.chimera.io"):], "name: "+clusterName+"\n", "name: chimera-bad\n", 1)
	bad = strings.Replace(bad, "mirrors: 1", "mirrors: 3", 1)
	if !strings.Contains(bad, "mirrors: 3") || !strings.Contains(bad, "name: chimera-bad") {
		t.Fatal("sample changed shape: cannot derive the bad cluster")
	}
	f := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(f, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := tool(kc, kubectl, "apply", "-f", f)
	if err == nil {
		t.Fatalf("a cluster with 3 mirrors on 2 DSes was accepted:\n%s", out)
	}
	// The webhook answers with a field error (the apiserver passes it on as
	// is); its text exists only in operator/webhook, so seeing it proves the
	// apiserver called our webhook over TLS. The sample's transport rdma is
	// served by chimerad now: no warning about it.
	for _, want := range []string{`spec.pnfs.mirrors: Invalid value: 3`, "each mirror needs its own data server"} {
		if !strings.Contains(out, want) {
			t.Fatalf("rejection does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Warning: spec.network.transport rdma") {
		t.Fatalf("the webhook still warns about transport rdma:\n%s", out)
	}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: sampleNS, Name: "chimera-bad"}, &chimerav1.ChimeraCluster{}); !apierrors.IsNotFound(err) {
		t.Fatalf("rejected cluster exists: %v", err)
	}
	t.Logf("webhook refused the bad cluster: %s", strings.TrimSpace(out))
}

// metadataVolume creates StorageClass local-path (no provisioner) and one
// static PV of it, enough for the sample's MDS metadata claim.
func metadataVolume(t *testing.T, ctx context.Context, k8s client.Client) *corev1.PersistentVolume {
	t.Helper()
	immediate := storagev1.VolumeBindingImmediate
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local-path"}, Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &immediate}
	if err := k8s.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), sc) })
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "mds-metadata-1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("100Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              "local-path",
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/chimera-test/mds"}},
		},
	}
	if err := k8s.Create(ctx, pv); err != nil {
		t.Fatal(err)
	}
	return pv
}

// checkPodShapes: what the scheduler placed carries the devices, network,
// hugepages and only the capabilities the design names; the MDS runs the
// start script over its metadata claim, a DS names the device plugin's
// variable to it.
func checkPodShapes(t *testing.T, ctx context.Context, k8s client.Client) {
	t.Helper()
	pods := &corev1.PodList{}
	if err := k8s.List(ctx, pods, client.InNamespace(sampleNS), client.MatchingLabels{render.LabelCluster: clusterName}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		ctr := p.Spec.Containers[0]
		isDS := p.Labels[render.LabelComponent] == render.ComponentDS
		lim := ctr.Resources.Limits
		wantHuge := "8Gi"
		if isDS {
			wantHuge = "32Gi"
		}
		if q := lim["hugepages-1Gi"]; q.String() != wantHuge {
			t.Errorf("%s: hugepages-1Gi limit %s, want %s", p.Name, q.String(), wantHuge)
		}
		if q := lim["rdma/roce_a"]; q.Value() != 1 {
			t.Errorf("%s: rdma/roce_a limit %s, want 1", p.Name, q.String())
		}
		if q, ok := lim["chimera.io/nvme"]; isDS && q.Value() != 16 || !isDS && ok {
			t.Errorf("%s: chimera.io/nvme limit %s (set %v): want 16 on a DS, none on the MDS", p.Name, q.String(), ok)
		}
		if p.Annotations[render.AnnotationNetworks] != "roce-a" {
			t.Errorf("%s: %s annotation %q, want roce-a", p.Name, render.AnnotationNetworks, p.Annotations[render.AnnotationNetworks])
		}
		huge := false
		for _, v := range p.Spec.Volumes {
			if v.EmptyDir != nil && v.EmptyDir.Medium == "HugePages-1Gi" {
				huge = true
			}
			if v.HostPath != nil {
				t.Errorf("%s: hostPath %s: device-plugin NVMe needs none", p.Name, v.HostPath.Path)
			}
		}
		if !huge {
			t.Errorf("%s: no HugePages-1Gi emptyDir", p.Name)
		}
		if strings.Join(ctr.Command, " ") != "/bin/sh "+render.ConfigDir+"/"+render.ConfigKeyStart {
			t.Errorf("%s: command %v, want the start script (backend nvme)", p.Name, ctr.Command)
		}
		claimed := false
		for _, v := range p.Spec.Volumes {
			claimed = claimed || v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == render.MetadataClaimName+"-"+p.Name
		}
		pciVar := ""
		for _, e := range ctr.Env {
			if e.Name == render.EnvPCIDeviceVar {
				pciVar = e.Value
			}
		}
		if isDS && (claimed || pciVar != "PCIDEVICE_CHIMERA_IO_NVME") || !isDS && (!claimed || pciVar != "") {
			t.Errorf("%s: metadata claim %v, %s=%q: want the claim on the MDS only and the variable on DSes only", p.Name, claimed, render.EnvPCIDeviceVar, pciVar)
		}
		sc := ctr.SecurityContext
		var add []string
		for _, c := range sc.Capabilities.Add {
			add = append(add, string(c))
		}
		sort.Strings(add)
		want := "IPC_LOCK,NET_BIND_SERVICE"
		if isDS {
			want += ",SYS_RAWIO"
		}
		if strings.Join(add, ",") != want || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" ||
			(sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("%s: capabilities add %v drop %v privileged %v, want add %s drop ALL, unprivileged", p.Name, add, sc.Capabilities.Drop, sc.Privileged, want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

func fakeNode(name string, labels map[string]string, capacity corev1.ResourceList) *corev1.Node {
	labels["kubernetes.io/hostname"] = name
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      labels,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}

func storageCapacity(devices bool) corev1.ResourceList {
	rl := corev1.ResourceList{
		"cpu": resource.MustParse("128"), "memory": resource.MustParse("512Gi"), "pods": resource.MustParse("110"),
	}
	if devices {
		rl["hugepages-1Gi"] = resource.MustParse("64Gi")
		rl["chimera.io/nvme"] = resource.MustParse("16")
		rl["rdma/roce_a"] = resource.MustParse("8")
	}
	return rl
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// eventsSay: every reason was recorded on the ChimeraCluster.
func eventsSay(ctx context.Context, k8s client.Client, ns, name string, reasons ...string) error {
	evs := &corev1.EventList{}
	if err := k8s.List(ctx, evs, client.InNamespace(ns)); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind == "ChimeraCluster" && e.InvolvedObject.Name == name {
			seen[e.Reason] = true
		}
	}
	for _, r := range reasons {
		if !seen[r] {
			return fmt.Errorf("no %s event on ChimeraCluster %s/%s (seen %v)", r, ns, name, seen)
		}
	}
	return nil
}

func conditionTrue(c *chimerav1.ChimeraCluster, typ string) bool {
	for _, cond := range c.Status.Conditions {
		if cond.Type == typ {
			return cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == c.Generation
		}
	}
	return false
}

func podsRunningWithIPs(ctx context.Context, k8s client.Client, ns string, sel client.MatchingLabels, want int) error {
	pods := &corev1.PodList{}
	if err := k8s.List(ctx, pods, client.InNamespace(ns), sel); err != nil {
		return err
	}
	running := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			running++
		}
	}
	if running != want || len(pods.Items) != want {
		return fmt.Errorf("%d/%d pods Running with an IP in %s (%v), want %d", running, len(pods.Items), ns, sel, want)
	}
	return nil
}

// placementOf renders "ds-0,ds-1=nodeA|nodeB mds-0=node" (DS order-free:
// either DS may land on either storage node).
func placementOf(ctx context.Context, k8s client.Client, ns string) (string, error) {
	pods := &corev1.PodList{}
	if err := k8s.List(ctx, pods, client.InNamespace(ns)); err != nil {
		return "", err
	}
	var ds, dsNodes, out []string
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			return "", fmt.Errorf("pod %s not scheduled yet", p.Name)
		}
		if strings.Contains(p.Name, "-ds-") {
			ds = append(ds, p.Name)
			dsNodes = append(dsNodes, p.Spec.NodeName)
		} else {
			out = append(out, p.Name+"="+p.Spec.NodeName)
		}
	}
	sort.Strings(ds)
	sort.Strings(dsNodes)
	if len(ds) > 0 {
		out = append(out, strings.Join(ds, ",")+"="+strings.Join(dsNodes, "|"))
	}
	sort.Strings(out)
	return strings.Join(out, " "), nil
}

func noStoragePodOn(t *testing.T, ctx context.Context, k8s client.Client, node string) {
	t.Helper()
	pods := &corev1.PodList{}
	if err := k8s.List(ctx, pods); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.Labels[render.LabelManagedBy] == render.ManagedBy {
			t.Fatalf("storage pod %s landed on %s, which has no hugepages/NVMe/RDMA", p.Name, node)
		}
	}
}

// noneLeft lists what remains in ns of the kinds a release or a cluster
// creates (the per-namespace defaults excepted).
func noneLeft(ctx context.Context, k8s client.Client, ns string) error {
	lists := map[string]client.ObjectList{
		"Pod": &corev1.PodList{}, "Service": &corev1.ServiceList{}, "ConfigMap": &corev1.ConfigMapList{},
		"Secret": &corev1.SecretList{}, "ServiceAccount": &corev1.ServiceAccountList{},
		"StatefulSet": &appsv1.StatefulSetList{}, "DaemonSet": &appsv1.DaemonSetList{}, "Deployment": &appsv1.DeploymentList{},
		"PodDisruptionBudget": &policyv1.PodDisruptionBudgetList{}, "Role": &rbacv1.RoleList{}, "RoleBinding": &rbacv1.RoleBindingList{},
		"PersistentVolumeClaim": &corev1.PersistentVolumeClaimList{}, "NetworkPolicy": &networkingv1.NetworkPolicyList{},
	}
	var left []string
	for kind, l := range lists {
		if err := k8s.List(ctx, l, client.InNamespace(ns)); err != nil {
			return err
		}
		items, err := metaItems(l)
		if err != nil {
			return err
		}
		for _, o := range items {
			if (kind == "ConfigMap" && o.GetName() == "kube-root-ca.crt") || (kind == "ServiceAccount" && o.GetName() == "default") {
				continue
			}
			left = append(left, kind+"/"+o.GetName())
		}
	}
	if len(left) > 0 {
		sort.Strings(left)
		return fmt.Errorf("left in %s: %v", ns, left)
	}
	return nil
}

// noClusterScopedLeft: the release's cluster-scoped objects are gone (the
// CRD stays: helm never deletes CRDs, so clusters survive an uninstall).
func noClusterScopedLeft(ctx context.Context, k8s client.Client) error {
	var left []string
	vwcs := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	crs := &rbacv1.ClusterRoleList{}
	crbs := &rbacv1.ClusterRoleBindingList{}
	drivers := &storagev1.CSIDriverList{}
	scs := &storagev1.StorageClassList{}
	pvs := &corev1.PersistentVolumeList{}
	for _, l := range []client.ObjectList{vwcs, crs, crbs, drivers, scs, pvs} {
		if err := k8s.List(ctx, l); err != nil {
			return err
		}
		items, err := metaItems(l)
		if err != nil {
			return err
		}
		for _, o := range items {
			if strings.Contains(o.GetName(), "chimera") || o.GetLabels()["app.kubernetes.io/instance"] == "chimera" {
				left = append(left, fmt.Sprintf("%T/%s", o, o.GetName()))
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("cluster-scoped objects left: %v", left)
	}
	return nil
}

// multus plays the Multus CNI: every DS pod, once scheduled, gets a
// network-status annotation with a fresh storage-network address (a
// replaced pod gets a new one, as a new VF would).
type multus struct {
	mu     sync.Mutex
	byUID  map[types.UID]string
	next   int
	cancel context.CancelFunc
	done   chan struct{}
}

func playMultus(t *testing.T, k8s client.Client) *multus {
	ctx, cancel := context.WithCancel(context.Background())
	m := &multus{byUID: map[types.UID]string{}, next: 10, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			pods := &corev1.PodList{}
			if err := k8s.List(ctx, pods, client.InNamespace(sampleNS), client.MatchingLabels{render.LabelCluster: clusterName, render.LabelComponent: render.ComponentDS}); err == nil {
				for i := range pods.Items {
					m.annotate(ctx, k8s, &pods.Items[i])
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(m.stop)
	return m
}

func (m *multus) annotate(ctx context.Context, k8s client.Client, p *corev1.Pod) {
	if p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
		return
	}
	if _, ok := p.Annotations[render.AnnotationNetworkStatus]; ok {
		return
	}
	m.mu.Lock()
	addr, ok := m.byUID[p.UID]
	if !ok {
		addr = fmt.Sprintf("%s%d", storageNet, m.next)
		m.next++
		m.byUID[p.UID] = addr
	}
	m.mu.Unlock()
	status := fmt.Sprintf(`[{"name":"kwok","interface":"eth0","ips":[%q],"default":true},{"name":"%s/roce-a","interface":"net1","ips":[%q]}]`, p.Status.PodIP, sampleNS, addr)
	patch := client.MergeFrom(p.DeepCopy())
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[render.AnnotationNetworkStatus] = status
	_ = k8s.Patch(ctx, p, patch)
}

func (m *multus) addressOf(uid types.UID) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byUID[uid]
}

func (m *multus) addresses() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, a := range m.byUID {
		out = append(out, a)
	}
	return out
}

func (m *multus) stop() {
	m.cancel()
	<-m.done
}

// startChimerad runs the real chimerad as the MDS: admin API on 127.0.0.1
// with the cluster's token, pNFS on, a memfs for CSI volumes.
func startChimerad(t *testing.T, ctx context.Context, k8s client.Client, dir, name, bin string, admin *adminProxy, c *chimerav1.ChimeraCluster, token string) *proc {
	t.Helper()
	tokenFile := filepath.Join(dir, name+"-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The admin certificate the operator issued for this cluster, as the MDS
	// pod mounts it; clients verify it against the operator's CA bundle.
	tlsSec := &corev1.Secret{}
	eventually(t, name+" admin TLS Secret", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: render.AdminTLSSecretName(c)}, tlsSec)
	})
	certFile, keyFile := filepath.Join(dir, name+"-tls.crt"), filepath.Join(dir, name+"-tls.key")
	for f, data := range map[string][]byte{certFile: tlsSec.Data[corev1.TLSCertKey], keyFile: tlsSec.Data[corev1.TLSPrivateKeyKey]} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	useAdminCA(t, ctx, k8s, render.MDSAdminServerName(c))
	cfg := map[string]any{
		"common": map[string]any{"log_level": "info"},
		"server": map[string]any{
			"role": "mds", "bind": "127.0.0.1", "threads": 1, "nfs_port": 0, "mount_port": 0, "portmap_port": 0,
			"pnfs": map[string]any{"enabled": true, "mirrors": 1},
		},
		"mounts":  map[string]any{"data": map[string]any{"module": "memfs", "path": "/", "capacity_bytes": memfsCapacity}},
		"exports": map[string]any{"/data": map[string]any{"path": "/data"}},
		"admin": map[string]any{"bind": "127.0.0.1", "port": 0, "token_file": tokenFile,
			"tls": map[string]any{"cert_file": certFile, "key_file": keyFile}},
		"metrics": map[string]any{"enabled": false},
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	cfgPath := filepath.Join(dir, name+".json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, dir, name, bin, "--config", cfgPath)
	// The kernel picked the port; chimerad logged it.
	ports, err := testutil.ChimeradPorts(filepath.Join(dir, name+".log"), []string{"admin"}, p.done, 30*time.Second)
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, tail(filepath.Join(dir, name+".log"), 2000))
	}
	admin.point(ports["admin"])
	eventually(t, name+" /healthz", func() error {
		_, err := adminGet(admin.URL()+"/healthz", "")
		return err
	})
	// A client that does not trust the operator's CA gets no answer, the
	// token it would send never leaves it; plain HTTP gets none either.
	if _, err := (&http.Client{Timeout: 5 * time.Second}).Get(admin.URL() + "/healthz"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("%s: a client without the operator's CA must fail the handshake, got %v", name, err)
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + strings.TrimPrefix(admin.URL(), "https://") + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatalf("%s: plain HTTP on the admin port answered HTTP %d", name, resp.StatusCode)
	}
	return p
}

// adminClient is the test's own admin API client: it trusts only the CA
// bundle the operator published (ConfigMap chimera-admin-ca, what the
// chart mounts into the CSI controller) and checks the certificate against
// the MDS Service name of the cluster whose chimerad the proxy reaches.
var adminClient atomic.Pointer[http.Client]

// adminCABundle is that ConfigMap's ca.crt, also given to the CSI controller.
var adminCABundle atomic.Pointer[[]byte]

func useAdminCA(t *testing.T, ctx context.Context, k8s client.Client, serverName string) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	eventually(t, "admin CA bundle ConfigMap", func() error {
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: releaseNS, Name: "chimera-admin-ca"}, cm); err != nil {
			return err
		}
		if cm.Data["ca.crt"] == "" {
			return fmt.Errorf("ConfigMap chimera-admin-ca has no ca.crt yet")
		}
		return nil
	})
	pem := []byte(cm.Data["ca.crt"])
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("ConfigMap chimera-admin-ca: ca.crt holds no certificate")
	}
	adminCABundle.Store(&pem)
	adminClient.Store(&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12},
	}})
}

// adminProxy is the one address the operator, the chart's StorageClass and
// the CSI controller are given for the MDS admin API, fixed before any
// chimerad runs: the test holds its listener (port 0, never closed until the
// end, so nothing can take it) and forwards each connection to the chimerad
// currently playing the MDS, at the port that chimerad reported. A chimerad
// started later gets a new port; point() moves the proxy to it.
type adminProxy struct {
	l      net.Listener
	target atomic.Int64
}

func newAdminProxy(t *testing.T) *adminProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &adminProxy{l: l}
	t.Cleanup(func() { l.Close() })
	go p.serve()
	return p
}

// URL is https: the proxy forwards TCP, so TLS runs end to end between
// each client and chimerad.
func (p *adminProxy) URL() string { return "https://" + p.l.Addr().String() }

func (p *adminProxy) point(port int) { p.target.Store(int64(port)) }

func (p *adminProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return // closed at the end of the test
		}
		go func() {
			defer c.Close()
			port := p.target.Load()
			if port == 0 {
				return // no chimerad yet: the client sees the connection closed
			}
			u, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
			if err != nil {
				return
			}
			defer u.Close()
			go func() {
				_, _ = io.Copy(u, c)
				_ = u.(*net.TCPConn).CloseWrite()
			}()
			_, _ = io.Copy(c, u)
		}()
	}
}

func httpOK(url string) error {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return nil
}

func adminGet(url, token string) (string, error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := adminClient.Load()
	if c == nil {
		return "", fmt.Errorf("no admin CA loaded yet")
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: HTTP %d: %s", url, resp.StatusCode, b)
	}
	return string(b), nil
}

func mdsList(adminURL, token string) (string, error) {
	return adminGet(adminURL+"/api/v1/dataservers", token)
}

// exportClientsFollowNodes: the MDS's export client rules (GET
// /api/v1/access/data on the real chimerad) admit every node's address and
// the sample's spec.access subnet; a node that joins is admitted, and no
// longer once it leaves.
func exportClientsFollowNodes(t *testing.T, ctx context.Context, k8s client.Client, adminURL, token string) {
	t.Helper()
	const joiner, joinerIP = "joiner-1", "10.99.0.7"
	has := func(want bool) error {
		got, err := adminGet(adminURL+"/api/v1/access/data", token)
		if err != nil {
			return err
		}
		if !strings.Contains(got, `"10.20.0.0/16"`) {
			return fmt.Errorf("the sample's spec.access subnet is not in the MDS rules: %s", got)
		}
		nodes := &corev1.NodeList{}
		if err := k8s.List(ctx, nodes); err != nil {
			return err
		}
		for _, a := range render.NodeAddresses(nodes.Items) {
			if !strings.Contains(got, `"`+a+`"`) {
				return fmt.Errorf("node address %s not in the MDS rules: %s", a, got)
			}
		}
		if strings.Contains(got, `"`+joinerIP+`"`) != want {
			return fmt.Errorf("MDS rules %s: want %s admitted: %v", got, joinerIP, want)
		}
		return nil
	}
	eventually(t, "MDS export rules admit the nodes", func() error { return has(false) })
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: joiner, Labels: map[string]string{"kubernetes.io/hostname": joiner}}}
	if err := k8s.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	// The node lifecycle controller and kwok write the new node too: retry
	// on conflicts with a fresh copy.
	eventually(t, "the joining node's address set", func() error {
		cur := &corev1.Node{}
		if err := k8s.Get(ctx, types.NamespacedName{Name: joiner}, cur); err != nil {
			return err
		}
		cur.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: joinerIP}}
		return k8s.Status().Update(ctx, cur)
	})
	eventually(t, "a joining node admitted by the MDS", func() error { return has(true) })
	if err := k8s.Delete(ctx, n); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a leaving node no longer admitted", func() error { return has(false) })
	got, _ := adminGet(adminURL+"/api/v1/access/data", token)
	t.Logf("MDS export rules: %s", got)
}

func mdsHas(adminURL, token string, addrs []string) error {
	got, err := mdsList(adminURL, token)
	if err != nil {
		return err
	}
	if len(addrs) == 0 {
		return fmt.Errorf("no DS addresses handed out yet")
	}
	for _, a := range addrs {
		if !strings.Contains(got, a) {
			return fmt.Errorf("MDS list %s lacks %s", got, a)
		}
	}
	return nil
}

// podIPCluster applies the small TCP memfs sample (no Multus network): the
// MDS must get the DS pod IPs kwok assigned. The cluster has its own admin
// token, so a fresh chimerad plays its MDS behind the same admin URL.
func podIPCluster(t *testing.T, ctx context.Context, k8s client.Client, dir, kc, kubectl, chimerad string, admin *adminProxy) {
	t.Helper()
	const path, ns, name = "../../config/samples/storage_v1alpha1_chimeracluster_tcp_memfs.yaml", "chimera", "chimera"
	if out, err := tool(kc, kubectl, "apply", "-f", path); err != nil {
		t.Fatalf("kubectl apply %s: %v\n%s", path, err, out)
	}
	sec := &corev1.Secret{}
	eventually(t, "TCP cluster admin-token Secret", func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-admin-token"}, sec)
	})
	token := string(sec.Data["token"])
	adminURL := admin.URL()
	tcp := &chimerav1.ChimeraCluster{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, tcp); err != nil {
		t.Fatal(err)
	}
	startChimerad(t, ctx, k8s, dir, "chimerad-tcp", chimerad, admin, tcp, token)
	eventually(t, "TCP cluster Available with the DS pod IPs at the MDS", func() error {
		pods := &corev1.PodList{}
		if err := k8s.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{render.LabelCluster: name, render.LabelComponent: render.ComponentDS}); err != nil {
			return err
		}
		var ips []string
		for _, p := range pods.Items {
			if p.Status.PodIP == "" {
				return fmt.Errorf("pod %s has no IP yet", p.Name)
			}
			ips = append(ips, p.Status.PodIP)
		}
		if len(ips) != 2 {
			return fmt.Errorf("%d DS pods, want 2", len(ips))
		}
		c := &chimerav1.ChimeraCluster{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, c); err != nil {
			return err
		}
		if c.Status.Phase != chimerav1.PhaseAvailable {
			return fmt.Errorf("phase %q conditions %+v", c.Status.Phase, c.Status.Conditions)
		}
		return mdsHas(adminURL, token, ips)
	})
	if out, err := tool(kc, kubectl, "delete", "-f", path, "--wait=true", "--timeout=90s"); err != nil {
		t.Fatalf("kubectl delete -f %s: %v\n%s", path, err, out)
	}
	eventually(t, "TCP cluster's children gone", func() error { return noneLeft(ctx, k8s, ns) })
}

// provisionThroughCSI plays external-provisioner (its image cannot be
// fetched here) against our CSI controller: the calls and the PV fields are
// the sidecar's, the driver and the server are real.
func provisionThroughCSI(t *testing.T, ctx context.Context, k8s, prov client.Client, dir, csiBin, adminURL, token string) {
	t.Helper()
	sock := filepath.Join(dir, "csi.sock")
	// The CA bundle as the chart mounts it; the StorageClass's endpoint is the
	// proxy on 127.0.0.1, so the certificate is checked for the MDS's name.
	caFile := filepath.Join(dir, "admin-ca.crt")
	if err := os.WriteFile(caFile, *adminCABundle.Load(), 0o600); err != nil {
		t.Fatal(err)
	}
	startProcess(t, dir, "chimera-csi", csiBin, "--mode=controller", "--endpoint=unix://"+sock,
		"--admin-ca-file="+caFile, "--admin-tls-server-name="+clusterName+"-mds."+sampleNS+".svc")
	var conn *grpc.ClientConn
	eventually(t, "CSI controller socket", func() error {
		if _, err := os.Stat(sock); err != nil {
			return err
		}
		var err error
		conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		return err
	})
	defer conn.Close()
	ctrlClient := csi.NewControllerClient(conn)

	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: sampleNS, Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: ptr(scName),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(pvcBytes, resource.BinarySI)}},
		},
	}
	if err := k8s.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	// kube-controller-manager hands the claim to our driver.
	eventually(t, "PVC handed to csi.chimera.io", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return err
		}
		if pvc.Annotations["volume.kubernetes.io/storage-provisioner"] != provisionerD {
			return fmt.Errorf("annotations %v", pvc.Annotations)
		}
		return nil
	})
	sc := &storagev1.StorageClass{}
	if err := prov.Get(ctx, types.NamespacedName{Name: scName}, sc); err != nil {
		t.Fatal(err)
	}
	params, secretRef := map[string]string{}, types.NamespacedName{}
	for k, v := range sc.Parameters {
		switch k {
		case "csi.storage.k8s.io/provisioner-secret-name":
			secretRef.Name = v
		case "csi.storage.k8s.io/provisioner-secret-namespace":
			secretRef.Namespace = v
		default:
			if !strings.HasPrefix(k, "csi.storage.k8s.io/") {
				params[k] = v
			}
		}
	}
	sec := &corev1.Secret{}
	if err := prov.Get(ctx, secretRef, sec); err != nil {
		t.Fatalf("provisioner secret %v: %v", secretRef, err)
	}
	secrets := map[string]string{}
	for k, v := range sec.Data {
		secrets[k] = string(v)
	}
	pvName := "pvc-" + string(pvc.UID)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := ctrlClient.CreateVolume(cctx, &csi.CreateVolumeRequest{
		Name:          pvName,
		CapacityRange: &csi.CapacityRange{RequiredBytes: pvcBytes},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: sc.MountOptions}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
		}},
		Parameters: params,
		Secrets:    secrets,
	})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	vol := resp.GetVolume()
	if vol.GetCapacityBytes() < pvcBytes {
		t.Fatalf("CreateVolume gave %d bytes, asked %d", vol.GetCapacityBytes(), pvcBytes)
	}
	got, err := adminGet(adminURL+"/api/v1/volumes", token)
	if err != nil || !strings.Contains(got, pvName) {
		t.Fatalf("volume %s not on the server: %v %s", pvName, err, got)
	}
	// The PV as external-provisioner writes it.
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: pvName,
			Annotations: map[string]string{
				"pv.kubernetes.io/provisioned-by":                            provisionerD,
				"volume.kubernetes.io/provisioner-deletion-secret-name":      secretRef.Name,
				"volume.kubernetes.io/provisioner-deletion-secret-namespace": secretRef.Namespace,
			},
			Finalizers: []string{"external-provisioner.volume.kubernetes.io/finalizer"},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(vol.GetCapacityBytes(), resource.BinarySI)},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: *sc.ReclaimPolicy,
			StorageClassName:              scName,
			MountOptions:                  sc.MountOptions,
			VolumeMode:                    pvc.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: pvc.Namespace, Name: pvc.Name,
				UID: pvc.UID, ResourceVersion: pvc.ResourceVersion,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: provisionerD, VolumeHandle: vol.GetVolumeId(), VolumeAttributes: vol.GetVolumeContext(),
				ControllerExpandSecretRef: &corev1.SecretReference{Name: sc.Parameters["csi.storage.k8s.io/controller-expand-secret-name"], Namespace: sc.Parameters["csi.storage.k8s.io/controller-expand-secret-namespace"]},
			}},
		},
	}
	if err := prov.Create(ctx, pv); err != nil {
		t.Fatalf("create PV: %v", err)
	}
	eventually(t, "PVC Bound to the provisioned PV", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName != pvName {
			return fmt.Errorf("PVC phase %s volume %q", pvc.Status.Phase, pvc.Spec.VolumeName)
		}
		return nil
	})
	t.Logf("PVC %s/%s Bound to %s (volume %s, context %v)", pvc.Namespace, pvc.Name, pvName, vol.GetVolumeId(), vol.GetVolumeContext())

	// Delete the claim: the PV is Released (reclaim Delete, external
	// provisioner), the sidecar's DeleteVolume removes the server volume.
	if err := k8s.Delete(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "PV Released", func() error {
		if err := prov.Get(ctx, types.NamespacedName{Name: pvName}, pv); err != nil {
			return err
		}
		if pv.Status.Phase != corev1.VolumeReleased {
			return fmt.Errorf("PV phase %s", pv.Status.Phase)
		}
		return nil
	})
	delSec := &corev1.Secret{}
	if err := prov.Get(ctx, types.NamespacedName{Namespace: pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-namespace"],
		Name: pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-name"]}, delSec); err != nil {
		t.Fatal(err)
	}
	delSecrets := map[string]string{}
	for k, v := range delSec.Data {
		delSecrets[k] = string(v)
	}
	if _, err := ctrlClient.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, Secrets: delSecrets}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	got, err = adminGet(adminURL+"/api/v1/volumes", token)
	if err != nil || strings.Contains(got, pvName) {
		t.Fatalf("volume %s still on the server after DeleteVolume: %v %s", pvName, err, got)
	}
	patch := client.MergeFrom(pv.DeepCopy())
	pv.Finalizers = nil
	if err := prov.Patch(ctx, pv, patch); err != nil {
		t.Fatal(err)
	}
	if err := prov.Delete(ctx, pv); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, "PV gone", func() error {
		if err := k8s.Get(ctx, types.NamespacedName{Name: pvName}, &corev1.PersistentVolume{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("PV still there: %v", err)
		}
		return nil
	})
}

func ptr[T any](v T) *T { return &v }
