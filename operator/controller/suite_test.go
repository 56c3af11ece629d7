package controller_test

// The envtest suite runs the operator (reconciler + validating webhook) in
// this process against a REAL kube-apiserver and etcd (built from the Go
// module proxy by hack/build-k8s.sh; $KUBEBUILDER_ASSETS names them) with
// the generated CRD and webhook configuration installed. There is no
// kube-controller-manager: StatefulSets create no pods and garbage
// collection does not run, so tests create the pods a kubelet would report
// and deletion must be done by the operator itself.

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/controller"
	"github.com/chimera-k8s/chimera/operator/pki"
	"github.com/chimera-k8s/chimera/operator/render"
	"github.com/chimera-k8s/chimera/operator/webhook"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Every wait in the suite is bounded by this.
const waitTimeout = 30 * time.Second

// adminClientNS plays the release namespace the operator runs in, and
// suiteCABundle the admin CA's Secret and ConfigMap there (--admin-ca).
const (
	adminClientNS = "chimera-system"
	suiteCABundle = "chimera-admin-ca"
)

var (
	// suiteCA plays the operator's admin CA (pki.EnsureCA in the binary).
	suiteCA  *pki.CA
	k8s      client.Client
	scheme   = runtime.NewScheme()
	adminURL = &adminURLSwitch{}
)

// adminURLSwitch lets a test point the reconciler's admin calls at its own
// endpoint (a real chimerad or a recording fake) on 127.0.0.1.
type adminURLSwitch struct{ url atomicString }

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("CHIMERA_REQUIRE_ENVTEST") != "" {
			println("KUBEBUILDER_ASSETS is not set but CHIMERA_REQUIRE_ENVTEST is: run hack/build-k8s.sh")
			os.Exit(1)
		}
		println("skipping envtest suite: KUBEBUILDER_ASSETS not set (make test-operator sets it); running the tests that need no apiserver")
		flag.Parse()
		_ = flag.Set("test.run", "^TestAdminClient")
		os.Exit(m.Run())
	}
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(false)))
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(chimerav1.AddToScheme(scheme))

	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths:            []string{filepath.Join("..", "..", "config", "webhook")},
			LocalServingHost: "127.0.0.1",
		},
	}
	cfg, err := env.Start()
	if err != nil {
		println("envtest start failed:", err.Error())
		return 1
	}
	defer func() { _ = env.Stop() }()

	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		println(err.Error())
		return 1
	}
	wo := env.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Cache:   controller.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: ctrlwebhook.NewServer(ctrlwebhook.Options{
			Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir,
		}),
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		println(err.Error())
		return 1
	}
	// The admin CA and its bundle ConfigMap, as the binary keeps them.
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: adminClientNS}}); err != nil {
		println(err.Error())
		return 1
	}
	if suiteCA, err = pki.EnsureCA(context.Background(), k8s, adminClientNS, suiteCABundle, time.Now()); err != nil {
		println(err.Error())
		return 1
	}
	rec := &controller.Reconciler{
		AdminCA:  suiteCA,
		CABundle: types.NamespacedName{Namespace: adminClientNS, Name: suiteCABundle}, APIReader: mgr.GetAPIReader(),
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorderFor("chimera-operator"),
		AdminURL: func(*chimerav1.ChimeraCluster, *corev1.Pod) string { return adminURL.url.Load() },
		// As the chart runs it: the admin clients live in the release namespace.
		NetworkPolicy: render.NetworkPolicyOptions{Enabled: true, AdminClientNamespace: adminClientNS},
	}
	if err := rec.SetupWithManager(mgr); err != nil {
		println(err.Error())
		return 1
	}
	if err := webhook.SetupWithManager(mgr); err != nil {
		println(err.Error())
		return 1
	}
	// The sidecar injector as the binary registers it, counting the
	// reviews the API server sends (sidecar_injection_test.go).
	mgr.GetWebhookServer().Register(webhook.MutatePodPath, &ctrlwebhook.Admission{Handler: &podReviews})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			println("manager:", err.Error())
		}
	}()
	code := m.Run()
	cancel()
	<-done
	return code
}
