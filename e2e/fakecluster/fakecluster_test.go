package fakecluster

// Proves on a fake cluster (real apiserver, controller-manager, scheduler;
// kwok nodes and pod lifecycle): the chart installs; the operator's
// ChimeraCluster becomes StatefulSets whose pods the real scheduler places
// only on nodes with the hugepages, NVMe and RDMA capacity they request (a
// node lacking them gets no storage pod); the cluster reports Available once
// the MDS has the DS list; scaling DSes down and deleting the cluster and
// the release leave nothing behind.
//
// What is played by the test, and why: the operator runs in this process
// (its Deployment is installed by helm and "runs" on a kwok node, but kwok
// runs no containers); the chart's webhook is disabled (the apiserver could
// not reach a fake pod); the test writes the Multus network-status
// annotation a CNI would write; the MDS admin API is a recorder on 127.0.0.1.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/controller"
	"github.com/chimera-k8s/chimera/operator/render"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Bounds of the whole-cluster test.
const (
	waitTimeout    = 90 * time.Second
	processTimeout = 10 * time.Minute
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
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s: %v", waitTimeout, what, err)
}

// startProcess runs a control-plane binary until the test ends.
func startProcess(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
	cmd := exec.CommandContext(ctx, name, args...)
	logPath := filepath.Join(dir, filepath.Base(name)+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log tail:\n%s", filepath.Base(name), b)
		}
	})
}

func fakeNode(name string, labels map[string]string, capacity corev1.ResourceList) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      labels,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		},
		Spec:   corev1.NodeSpec{},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}

func storageCapacity(nvme, rdma string) corev1.ResourceList {
	rl := corev1.ResourceList{
		"cpu": resource.MustParse("128"), "memory": resource.MustParse("512Gi"), "pods": resource.MustParse("110"),
		"hugepages-1Gi": resource.MustParse("64Gi"),
	}
	if nvme != "" {
		rl["chimera.io/nvme"] = resource.MustParse(nvme)
	}
	if rdma != "" {
		rl["rdma/roce_a"] = resource.MustParse(rdma)
	}
	return rl
}

func TestFakeCluster(t *testing.T) {
	assets := env(t, "KUBEBUILDER_ASSETS")
	bins := env(t, "CHIMERA_K8S_BIN") // kube-controller-manager, kube-scheduler
	kwok := env(t, "KWOK")
	stages := env(t, "KWOK_STAGES")
	helm := env(t, "HELM")
	_ = assets
	ctx := context.Background()
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(chimerav1.AddToScheme(scheme))
	te := &envtest.Environment{CRDDirectoryPaths: []string{"../../config/crd/bases"}, ErrorIfCRDPathMissing: true}
	cfg, err := te.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = te.Stop() })
	admin, err := te.AddUser(envtest.User{Name: "e2e-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	startProcess(t, dir, filepath.Join(bins, "kube-controller-manager"), "--kubeconfig="+kc,
		"--controllers=*,-serviceaccount-token", "--leader-elect=false", "--secure-port=0",
		"--concurrent-statefulset-syncs=2", "--node-monitor-grace-period=1h")
	startProcess(t, dir, filepath.Join(bins, "kube-scheduler"), "--kubeconfig="+kc, "--leader-elect=false", "--secure-port=0")
	startProcess(t, dir, kwok, "--kubeconfig="+kc, "--config="+stages, "--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--server-address=", "--cidr=10.0.0.1/24", "--node-ip=10.0.0.1")

	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	// Two storage nodes with the reference deployment's devices, and a node
	// carrying the storage label but none of the devices.
	nodes := []*corev1.Node{
		fakeNode("storage-1", map[string]string{"chimera.io/storage": "true", "chimera.io/mds": "true", "kubernetes.io/hostname": "storage-1"}, storageCapacity("16", "8")),
		fakeNode("storage-2", map[string]string{"chimera.io/storage": "true", "kubernetes.io/hostname": "storage-2"}, storageCapacity("16", "8")),
		fakeNode("plain-1", map[string]string{"chimera.io/storage": "true", "kubernetes.io/hostname": "plain-1"}, corev1.ResourceList{
			"cpu": resource.MustParse("128"), "memory": resource.MustParse("512Gi"), "pods": resource.MustParse("110")}),
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

	// helm install the chart (webhook off: the apiserver cannot reach a fake pod).
	helmRun := func(args ...string) {
		t.Helper()
		cmd := exec.Command(helm, append(args, "--kubeconfig", kc)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
	}
	helmRun("install", "chimera", "../../charts/chimera", "--namespace", "chimera-system", "--create-namespace",
		"--set", "webhook.enabled=false", "--set", "csi.enabled=false", "--skip-crds")
	eventually(t, "operator pod Running", func() error {
		return podsRunning(ctx, k8s, "chimera-system", client.MatchingLabels{"app.kubernetes.io/name": "chimera-operator"}, 1)
	})

	// The operator (in this process), pointed at a DS-list sink on 127.0.0.1.
	adminURL, dsPushes := startAdmin(t)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Cache: controller.CacheOptions(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&controller.Reconciler{Client: mgr.GetClient(), Scheme: scheme, Recorder: mgr.GetEventRecorderFor("chimera-operator"),
		AdminURL: func(*chimerav1.ChimeraCluster, *corev1.Pod) string { return adminURL }}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(ctx)
	var mwg sync.WaitGroup
	mwg.Add(1)
	go func() { defer mwg.Done(); _ = mgr.Start(mctx) }()
	t.Cleanup(func() { mcancel(); mwg.Wait() })

	// Apply the production sample (RDMA + NVMe, 2 DS) as shipped.
	c := loadSample(t, "../../config/samples/storage_v1alpha1_chimeracluster_rdma_nvme.yaml")
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.Namespace}}); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	// Play Multus: give every DS pod a storage-network address.
	stopMultus := playMultus(t, k8s, c)
	defer stopMultus()

	eventually(t, "MDS on storage-1, DSes on storage-1 and storage-2", func() error {
		placement, err := placementOf(ctx, k8s, c.Namespace)
		if err != nil {
			return err
		}
		want := "chimera-prod-ds-0,chimera-prod-ds-1=storage-1|storage-2 chimera-prod-mds-0=storage-1"
		if placement != want {
			return fmt.Errorf("placement %q, want %q", placement, want)
		}
		return podsRunning(ctx, k8s, c.Namespace, client.MatchingLabels{render.LabelCluster: c.Name}, 3)
	})
	noPodOn(t, ctx, k8s, "plain-1")

	eventually(t, "ChimeraCluster Available", func() error {
		cur := &chimerav1.ChimeraCluster{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
			return err
		}
		if cur.Status.Phase != chimerav1.PhaseAvailable || cur.Status.DataServersReady != 2 {
			return fmt.Errorf("phase %q ready %d conditions %+v", cur.Status.Phase, cur.Status.DataServersReady, cur.Status.Conditions)
		}
		return nil
	})
	if last := dsPushes(); !strings.Contains(last, "192.168.50.") {
		t.Fatalf("MDS never got storage-network addresses: %s", last)
	}

	// Scale the DSes down to one: the second DS pod goes, status follows.
	eventually(t, "scale down accepted", func() error {
		cur := &chimerav1.ChimeraCluster{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
			return err
		}
		one := int32(1)
		cur.Spec.DataServers.Count = &one
		return k8s.Update(ctx, cur)
	})
	eventually(t, "one DS left, cluster Available", func() error {
		cur := &chimerav1.ChimeraCluster{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), cur); err != nil {
			return err
		}
		pods := &corev1.PodList{}
		if err := k8s.List(ctx, pods, client.InNamespace(c.Namespace), client.MatchingLabels(render.SelectorLabels(c, render.ComponentDS))); err != nil {
			return err
		}
		if len(pods.Items) != 1 || cur.Status.DataServersDesired != 1 || cur.Status.Phase != chimerav1.PhaseAvailable || len(cur.Status.DataServers) != 1 {
			return fmt.Errorf("%d DS pods, status desired %d phase %q", len(pods.Items), cur.Status.DataServersDesired, cur.Status.Phase)
		}
		return nil
	})

	// Delete the cluster, then the release: nothing is left behind.
	if err := k8s.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	eventually(t, "cluster and its pods gone", func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(c), &chimerav1.ChimeraCluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still there: %v", err)
		}
		return noneLeft(ctx, k8s, c.Namespace)
	})
	helmRun("uninstall", "chimera", "--namespace", "chimera-system", "--wait", "--timeout", "60s")
	eventually(t, "release gone", func() error { return noneLeft(ctx, k8s, "chimera-system") })
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podsRunning(ctx context.Context, k8s client.Client, ns string, sel client.MatchingLabels, want int) error {
	pods := &corev1.PodList{}
	if err := k8s.List(ctx, pods, client.InNamespace(ns), sel); err != nil {
		return err
	}
	running := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning {
			running++
		}
	}
	if running != want {
		return fmt.Errorf("%d/%d pods running in %s", running, want, ns)
	}
	return nil
}

// placementOf renders "mds-0=node ds-0,ds-1=nodeA|nodeB" (DS order-free:
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

func noPodOn(t *testing.T, ctx context.Context, k8s client.Client, node string) {
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

func noneLeft(ctx context.Context, k8s client.Client, ns string) error {
	var left []string
	for kind, l := range map[string]client.ObjectList{
		"Pod": &corev1.PodList{}, "Service": &corev1.ServiceList{}, "ConfigMap": &corev1.ConfigMapList{}, "Secret": &corev1.SecretList{},
	} {
		if err := k8s.List(ctx, l, client.InNamespace(ns)); err != nil {
			return err
		}
		items, _ := metaItems(l)
		for _, o := range items {
			if kind == "ConfigMap" && o.GetName() == "kube-root-ca.crt" {
				continue
			}
			left = append(left, kind+"/"+o.GetName())
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("left in %s: %v", ns, left)
	}
	return nil
}

func loadSample(t *testing.T, path string) *chimerav1.ChimeraCluster {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		c := &chimerav1.ChimeraCluster{}
		if err := dec.Decode(c); err != nil {
			t.Fatalf("%s: no ChimeraCluster found: %v", path, err)
		}
		if c.Kind == "ChimeraCluster" {
			return c
		}
	}
}

// playMultus annotates DS pods with a storage-network address, as the
// Multus CNI would once the pod's sandbox exists.
func playMultus(t *testing.T, k8s client.Client, c *chimerav1.ChimeraCluster) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			pods := &corev1.PodList{}
			if err := k8s.List(ctx, pods, client.InNamespace(c.Namespace), client.MatchingLabels(render.SelectorLabels(c, render.ComponentDS))); err == nil {
				for i := range pods.Items {
					p := &pods.Items[i]
					if _, ok := p.Annotations[render.AnnotationNetworkStatus]; ok || p.Spec.NodeName == "" {
						continue
					}
					idx := strings.TrimPrefix(p.Name, c.Name+"-ds-")
					patch := client.MergeFrom(p.DeepCopy())
					if p.Annotations == nil {
						p.Annotations = map[string]string{}
					}
					p.Annotations[render.AnnotationNetworkStatus] = fmt.Sprintf(`[{"name":"%s/roce-a","interface":"net1","ips":["192.168.50.1%s"]}]`, c.Namespace, idx)
					_ = k8s.Patch(ctx, p, patch)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); <-done }
}

// startAdmin is the MDS admin API the operator pushes to: a recorder that
// wants a bearer token (the envtest suite covers the real chimerad).
func startAdmin(t *testing.T) (string, func() string) {
	var mu sync.Mutex
	last := ""
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		mu.Lock()
		last = string(b)
		mu.Unlock()
		_, _ = w.Write([]byte(`{"generation":1,"dataServers":[]}`))
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String(), func() string { mu.Lock(); defer mu.Unlock(); return last }
}
