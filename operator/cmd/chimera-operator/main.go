// chimera-operator runs the ChimeraCluster controller and its validating
// webhook in one controller-runtime manager, with leader election so only
// one replica reconciles at a time.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
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
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// certSetupTimeout bounds the start-up certificate work (API calls only).
const certSetupTimeout = 60 * time.Second

func main() {
	var (
		metricsAddr, probeAddr, certDir       string
		webhookPort                           int
		leaderElect, enableWebhook, selfCerts bool
		certSecret, webhookService, vwcName   string
		namespace, mdsAdminURL, extraSANs     string
		webhookHost                           string
		netpol                                bool
		nfsCIDRs, metricsNS, metricsPods      string
		adminCA                               string
		fuseImage, mwcName                    string
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "metrics endpoint address (0 disables)")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "/healthz and /readyz address")
	flag.BoolVar(&leaderElect, "leader-elect", true, "elect a leader so one replica reconciles")
	flag.BoolVar(&enableWebhook, "enable-webhook", true, "serve the validating admission webhook")
	flag.IntVar(&webhookPort, "webhook-port", 9443, "webhook server port")
	flag.StringVar(&webhookHost, "webhook-host", "", "address the webhook server binds (empty: all, as in a pod)")
	flag.StringVar(&certDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory holding tls.crt and tls.key")
	flag.BoolVar(&selfCerts, "self-managed-certs", true, "generate the webhook CA and certificate into --webhook-cert-secret (disable with cert-manager)")
	flag.StringVar(&certSecret, "webhook-cert-secret", "chimera-webhook-cert", "Secret holding the self-managed CA and serving certificate")
	flag.StringVar(&webhookService, "webhook-service", "chimera-webhook", "Service in front of the webhook (certificate DNS name)")
	flag.StringVar(&vwcName, "webhook-config-name", "chimera-validating-webhook", "ValidatingWebhookConfiguration whose caBundle the operator sets")
	flag.StringVar(&fuseImage, "fuse-sidecar-image", "", "dataplane image (it carries chimera-fuse) of the sidecar injected into pods annotated chimera.io/fuse-sidecar: \"true\" (CSI mountMode sidecar); empty: no injection")
	flag.StringVar(&mwcName, "mutating-webhook-config-name", "", "MutatingWebhookConfiguration (the chimera-fuse sidecar injector) whose caBundle the operator sets; empty: none")
	flag.StringVar(&adminCA, "admin-ca", "chimera-admin-ca", "Secret (ca.crt, ca.key) and ConfigMap (ca.crt, for the CSI driver) in --namespace holding the CA that issues every cluster's admin API certificate; created when missing")
	flag.StringVar(&namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace the operator runs in (default $POD_NAMESPACE)")
	// Out-of-cluster runs only (development, the fake-cluster e2e): there the
	// operator cannot reach MDS pod IPs, and the apiserver reaches the webhook
	// by URL instead of through its Service.
	flag.StringVar(&mdsAdminURL, "mds-admin-url", "", "admin API base URL (https://host:port) used for every cluster's MDS instead of https://<MDS pod IP>:8080; the certificate is still checked against the cluster's MDS Service name (out-of-cluster runs and tests only)")
	flag.StringVar(&extraSANs, "webhook-cert-extra-sans", "", "comma-separated extra DNS names / IPs for the self-managed webhook certificate (a webhook reached by URL)")
	flag.BoolVar(&netpol, "network-policy", true, "render a NetworkPolicy per ChimeraCluster (admin API from admin-client pods of --namespace, NFS from the nodes, metrics from the scrapers)")
	flag.StringVar(&nfsCIDRs, "network-policy-nfs-cidrs", "", "comma-separated CIDRs allowed on the NFS ports besides the nodes' addresses")
	flag.StringVar(&metricsNS, "network-policy-metrics-namespaces", "", "LabelSelector as JSON ({\"matchLabels\":{...}}) of the namespaces whose pods may scrape chimerad's metrics (both selectors empty: every pod of the cluster's own namespace)")
	flag.StringVar(&metricsPods, "network-policy-metrics-pods", "", "LabelSelector as JSON of the pods that may scrape chimerad's metrics")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	o := options{
		metricsAddr: metricsAddr, probeAddr: probeAddr, certDir: certDir, webhookPort: webhookPort,
		leaderElect: leaderElect, enableWebhook: enableWebhook, selfCerts: selfCerts,
		certSecret: certSecret, webhookService: webhookService, vwcName: vwcName, namespace: namespace,
		mdsAdminURL: strings.TrimRight(mdsAdminURL, "/"), webhookHost: webhookHost, adminCA: adminCA,
		fuseImage: fuseImage, mwcName: mwcName,
	}
	for _, s := range strings.Split(extraSANs, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.extraSANs = append(o.extraSANs, s)
		}
	}
	np, err := networkPolicyOptions(netpol, namespace, nfsCIDRs, metricsNS, metricsPods)
	if err != nil {
		log.Error(err, "bad network-policy flags")
		os.Exit(2)
	}
	o.netpol = np
	if o.mdsAdminURL != "" {
		log.Info("MDS admin API overridden for every cluster (out-of-cluster run)", "url", o.mdsAdminURL)
	}
	if err := run(o); err != nil {
		log.Error(err, "operator stopped")
		os.Exit(1)
	}
}

type options struct {
	metricsAddr, probeAddr, certDir       string
	webhookPort                           int
	leaderElect, enableWebhook, selfCerts bool
	certSecret, webhookService, vwcName   string
	namespace, mdsAdminURL, webhookHost   string
	adminCA                               string
	fuseImage, mwcName                    string
	extraSANs                             []string
	netpol                                render.NetworkPolicyOptions
}

// networkPolicyOptions parses the --network-policy-* flags.
func networkPolicyOptions(enabled bool, namespace, cidrs, metricsNS, metricsPods string) (render.NetworkPolicyOptions, error) {
	o := render.NetworkPolicyOptions{Enabled: enabled, AdminClientNamespace: namespace}
	if !enabled {
		return o, nil
	}
	if namespace == "" {
		return o, fmt.Errorf("--network-policy needs --namespace (or $POD_NAMESPACE): the admin clients run there")
	}
	for _, s := range strings.Split(cidrs, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.NFSClientCIDRs = append(o.NFSClientCIDRs, s)
		}
	}
	var err error
	if o.MetricsNamespaceSelector, err = labelSelectorFlag("--network-policy-metrics-namespaces", metricsNS); err != nil {
		return o, err
	}
	if o.MetricsPodSelector, err = labelSelectorFlag("--network-policy-metrics-pods", metricsPods); err != nil {
		return o, err
	}
	return o, nil
}

// labelSelectorFlag parses a LabelSelector given as JSON (the chart passes
// its values with toJson); empty means none, {} selects everything.
func labelSelectorFlag(name, v string) (*metav1.LabelSelector, error) {
	if strings.TrimSpace(v) == "" || strings.TrimSpace(v) == "null" {
		return nil, nil
	}
	sel := &metav1.LabelSelector{}
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(sel); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return sel, nil
}

func run(o options) error {
	metricsAddr, probeAddr, certDir, webhookPort := o.metricsAddr, o.probeAddr, o.certDir, o.webhookPort
	leaderElect, enableWebhook, selfCerts := o.leaderElect, o.enableWebhook, o.selfCerts
	certSecret, webhookService, vwcName, namespace := o.certSecret, o.webhookService, o.vwcName, o.namespace
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(chimerav1.AddToScheme(scheme))
	cfg := ctrl.GetConfigOrDie()

	if enableWebhook && selfCerts {
		if namespace == "" {
			return fmt.Errorf("--namespace (or $POD_NAMESPACE) is required for self-managed webhook certificates")
		}
		direct, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), certSetupTimeout)
		defer cancel()
		if err := webhook.EnsureCerts(ctx, direct, webhook.CertOptions{
			Namespace: namespace, SecretName: certSecret, ServiceName: webhookService, WebhookName: vwcName, CertDir: certDir,
			MutatingWebhookName: o.mwcName, ExtraSANs: o.extraSANs,
		}); err != nil {
			return fmt.Errorf("webhook certificates: %w", err)
		}
	}

	// The admin API's CA: loaded (or created) before anything reconciles,
	// so every cluster's certificate and every admin call use it.
	if namespace == "" {
		return fmt.Errorf("--namespace (or $POD_NAMESPACE) is required: the admin API's CA (--admin-ca) lives there")
	}
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	caCtx, caCancel := context.WithTimeout(context.Background(), certSetupTimeout)
	defer caCancel()
	ca, err := pki.EnsureCA(caCtx, direct, namespace, o.adminCA, time.Now())
	if err != nil {
		return fmt.Errorf("admin API CA: %w", err)
	}

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controller.CacheOptions(),
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr, SecureServing: metricsAddr != "0"},
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "chimera-operator.storage.chimera.io",
		LeaderElectionNamespace: namespace,
		// Step down promptly on SIGTERM so a new leader takes over fast.
		LeaderElectionReleaseOnCancel: true,
		WebhookServer:                 ctrlwebhook.NewServer(ctrlwebhook.Options{Host: o.webhookHost, Port: webhookPort, CertDir: certDir}),
	})
	if err != nil {
		return err
	}
	r := &controller.Reconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorderFor("chimera-operator"),
		NetworkPolicy: o.netpol, AdminCA: ca,
		// Clusters whose certificate cert-manager issues publish their CA
		// beside the operator's, for the CSI controller.
		CABundle: types.NamespacedName{Namespace: namespace, Name: o.adminCA}, APIReader: mgr.GetAPIReader(),
	}
	if o.mdsAdminURL != "" {
		r.AdminURL = func(*chimerav1.ChimeraCluster, *corev1.Pod) string { return o.mdsAdminURL }
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	if enableWebhook {
		if err := webhook.SetupWithManager(mgr); err != nil {
			return err
		}
		if o.fuseImage != "" {
			webhook.SetupSidecarInjector(mgr, o.fuseImage)
		}
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
