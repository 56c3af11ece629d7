// Package controller reconciles ChimeraCluster objects: it applies the
// children computed by package render, pushes the data-server list to the
// MDS admin API and writes status last.
package controller

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/pki"
	"github.com/chimera-k8s/chimera/operator/render"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

const (
	// Finalizer holds the ChimeraCluster until its servers are gone, so the
	// DSes stop before the MDS and nothing is left half torn down.
	Finalizer = "storage.chimera.io/teardown"
	// FieldOwner is the server-side-apply manager name.
	FieldOwner = "chimera-operator"
	// ResyncInterval re-pushes the DS list even without events: an MDS that
	// restarted has forgotten it.
	ResyncInterval = 30 * time.Second
	// TeardownPollInterval is how often deletion checks that pods are gone.
	TeardownPollInterval = 2 * time.Second
	// adminTokenBytes of randomness in a generated admin token.
	adminTokenBytes = 32
	// CertificatePollInterval: how often a cluster waiting for cert-manager
	// to issue its admin certificate looks again (besides the Secret's
	// events).
	CertificatePollInterval = 5 * time.Second
)

// adminAuth is what admin calls to one cluster's MDS need: the bearer token
// and the CA its certificate is verified against.
type adminAuth struct {
	Token string
	CAPEM []byte
}

// Reconciler reconciles one ChimeraCluster at a time.
type Reconciler struct {
	Client   client.Client
	Scheme   *runtime.Scheme
	Recorder record.EventRecorder
	Admin    *AdminClient
	// AdminURL returns the admin API base URL of the MDS pod. The default
	// uses the pod IP (no cluster DNS needed); tests point it at 127.0.0.1.
	AdminURL func(c *chimerav1.ChimeraCluster, mds *corev1.Pod) string
	// NetworkPolicy: whether and how each cluster's servers are isolated.
	NetworkPolicy render.NetworkPolicyOptions
	// AdminCA signs each cluster's admin server certificate; the admin
	// client trusts only it. Required.
	AdminCA *pki.CA
	// Now is the clock certificates are issued and checked against.
	Now func() time.Time
	// CABundle is the admin CA ConfigMap the CSI controller mounts
	// (pki.EnsureCA keeps its ca.crt); the reconciler publishes there, under
	// render.CABundleKey, the ca.crt of each cluster whose certificate
	// cert-manager issues. Empty: nothing is published.
	CABundle types.NamespacedName
	// APIReader reads the CABundle ConfigMap, which the chart creates
	// without the labels the manager's cache selects. Required with CABundle.
	APIReader client.Reader

	// accessPushed remembers, per cluster (namespace/name), the export rules
	// last pushed, so a change is told once as an event. In memory only: a
	// restarted operator tells the current rules once more.
	accessPushed sync.Map
}

// +kubebuilder:rbac:groups=storage.chimera.io,resources=chimeraclusters,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=storage.chimera.io,resources=chimeraclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=storage.chimera.io,resources=chimeraclusters/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=statefulsets;daemonsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services;configmaps;secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=cert-manager.io,resources=certificates,verbs=get;list;watch;create;update;patch;delete

// SetupWithManager registers the reconciler and its watches.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.AdminCA == nil {
		return errors.New("reconciler: AdminCA is required (the admin API's certificates come from it)")
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.CABundle.Name != "" && r.APIReader == nil {
		return errors.New("reconciler: APIReader is required with CABundle")
	}
	if r.Admin == nil {
		r.Admin = NewAdminClient(r.AdminCA.Pool())
	}
	if r.AdminURL == nil {
		// The pod IP (no cluster DNS needed); the certificate is checked
		// against the MDS Service's name (AdminClient).
		r.AdminURL = func(_ *chimerav1.ChimeraCluster, mds *corev1.Pod) string {
			return fmt.Sprintf("https://%s:%d", mds.Status.PodIP, render.PortAdmin)
		}
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&chimerav1.ChimeraCluster{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&appsv1.DaemonSet{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.Secret{}).
		// The admin TLS Secret cert-manager writes is not ours to own; it
		// carries the cluster's labels (the Certificate's secretTemplate).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(labelledToCluster)).
		Owns(&policyv1.PodDisruptionBudget{}).
		// Pods are not owned by us but their readiness and network status
		// drive status and the DS list: map them to their cluster by label.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(labelledToCluster)).
		// The exports (and the NetworkPolicy's NFS ports) admit the nodes'
		// addresses: a node that joins, leaves or changes address
		// reconciles every cluster, which pushes the new client rules.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allClusters), builder.WithPredicates(nodeAddressesChanged()))
	if r.NetworkPolicy.Enabled {
		b = b.Owns(&networkingv1.NetworkPolicy{})
	}
	return b.Complete(r)
}

func (r *Reconciler) allClusters(ctx context.Context, _ client.Object) []reconcile.Request {
	list := &chimerav1.ChimeraClusterList{}
	if err := r.Client.List(ctx, list); err != nil {
		logf.FromContext(ctx).Error(err, "list clusters for a node change")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, c := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
	}
	return reqs
}

// nodeAddressesChanged lets node creation and deletion through, and updates
// only when the addresses or pod ranges differ (status heartbeats would
// re-render every cluster otherwise).
func nodeAddressesChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Node)
		n, ok2 := e.ObjectNew.(*corev1.Node)
		return !ok1 || !ok2 || !equality.Semantic.DeepEqual(o.Status.Addresses, n.Status.Addresses) ||
			!equality.Semantic.DeepEqual(o.Spec.PodCIDRs, n.Spec.PodCIDRs)
	}}
}

// labelledToCluster maps an object carrying the cluster labels the builders
// write (pods, the admin TLS Secret) to its cluster.
func labelledToCluster(_ context.Context, o client.Object) []reconcile.Request {
	name, ok := o.GetLabels()[render.LabelCluster]
	if !ok || o.GetLabels()[render.LabelManagedBy] != render.ManagedBy {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// Reconcile is the entry point: normal or delete.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	c := &chimerav1.ChimeraCluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, c); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if c.DeletionTimestamp != nil {
		return r.reconcileDelete(ctx, c)
	}
	return r.reconcileNormal(ctx, c)
}

func (r *Reconciler) reconcileNormal(ctx context.Context, c *chimerav1.ChimeraCluster) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	if !controllerutil.ContainsFinalizer(c, Finalizer) {
		controllerutil.AddFinalizer(c, Finalizer)
		if err := r.Client.Update(ctx, c); err != nil {
			return ctrl.Result{}, err
		}
	}
	var obs render.Observed
	var access []render.AccessRule
	var revision string
	var auth adminAuth
	var err error
	auth.Token, err = r.ensureAdminSecret(ctx, c)
	if err == nil {
		auth.CAPEM, obs.AdminTLS, err = r.ensureAdminTLS(ctx, c)
	}
	if err == nil {
		err = r.publishCA(ctx, c, auth.CAPEM)
	}
	// Without a usable certificate the servers are not started nor rolled:
	// an MDS pod would wait for its Secret volume, and the admin API could
	// not be verified.
	tlsWaiting := !obs.AdminTLS.Ready
	if err == nil && !tlsWaiting {
		access, revision, err = r.applyChildren(ctx, c)
	}
	if err != nil {
		obs.ApplyErr = err
		log.Error(err, "apply failed")
	}
	if err := r.observe(ctx, c, &obs); err != nil {
		return ctrl.Result{}, err
	}
	var ro *rollout
	var rolloutErr error
	if obs.ApplyErr == nil && !tlsWaiting {
		// Only with the templates applied: a pod deleted now comes back
		// at the new revision.
		ro, rolloutErr = r.planRollout(ctx, c, revision, auth, &obs)
		if ro != nil { // else the pods could not be read: pushing now could undrain a draining DS
			r.pushToMDS(ctx, c, auth, access, ro.draining(), &obs)
			ro.finishRollout(&obs)
		}
	}
	if err := r.writeStatus(ctx, c, obs); err != nil {
		return ctrl.Result{}, err
	}
	if obs.ApplyErr != nil {
		return ctrl.Result{}, obs.ApplyErr // retried with backoff
	}
	switch obs.AdminTLS.Reason {
	case render.ReasonWaitingForCertificate:
		// The Secret's change reconciles too; this bounds a missed one.
		return ctrl.Result{RequeueAfter: CertificatePollInterval}, nil
	case render.ReasonCertManagerNotInstalled:
		return ctrl.Result{RequeueAfter: ResyncInterval}, nil
	}
	if rolloutErr != nil {
		return ctrl.Result{}, rolloutErr
	}
	if ro.moving() || (ro != nil && ro.st.Failure == "" && obs.RolloutPending && !obs.MDSRestartRefused) {
		return ctrl.Result{RequeueAfter: RolloutPollInterval}, nil
	}
	return ctrl.Result{RequeueAfter: ResyncInterval}, nil
}

// ensureAdminSecret creates the admin-token Secret once and never rewrites
// the token (the MDS reads it at start; a new token would lock us out).
func (r *Reconciler) ensureAdminSecret(ctx context.Context, c *chimerav1.ChimeraCluster) (string, error) {
	s := &corev1.Secret{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: render.AdminSecretName(c)}, s)
	if err == nil {
		tok := string(s.Data[render.SecretKeyToken])
		if tok == "" {
			return "", fmt.Errorf("secret %s/%s has no %q key", c.Namespace, s.Name, render.SecretKeyToken)
		}
		return tok, nil
	}
	if !apierrors.IsNotFound(err) {
		return "", err
	}
	buf := make([]byte, adminTokenBytes)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	tok := base64.RawURLEncoding.EncodeToString(buf)
	s = render.AdminSecret(c, tok)
	if err := controllerutil.SetControllerReference(c, s, r.Scheme); err != nil {
		return "", err
	}
	if err := r.Client.Create(ctx, s); err != nil {
		return "", fmt.Errorf("create admin secret: %w", err)
	}
	r.Recorder.Eventf(c, corev1.EventTypeNormal, "AdminTokenCreated", "created admin-token Secret %s", s.Name)
	return tok, nil
}

// ensureAdminTLS keeps the MDS's admin certificate Secret usable and
// returns the CA admin clients must verify the MDS against: the operator's
// own (ensureSelfManagedTLS) or, when the cluster names a cert-manager
// issuer, the ca.crt of the Secret cert-manager fills
// (ensureCertManagerTLS).
func (r *Reconciler) ensureAdminTLS(ctx context.Context, c *chimerav1.ChimeraCluster) ([]byte, render.AdminTLSState, error) {
	if render.IssuerRef(c) != nil {
		return r.ensureCertManagerTLS(ctx, c)
	}
	if err := r.ensureSelfManagedTLS(ctx, c); err != nil {
		return nil, render.AdminTLSState{}, err
	}
	return r.AdminCA.CertPEM, render.AdminTLSState{Ready: true, Reason: render.ReasonSelfManagedCA,
		Message: fmt.Sprintf("Secret %s holds a certificate from the operator's admin CA", render.AdminTLSSecretName(c))}, nil
}

// ensureSelfManagedTLS keeps the MDS's admin server certificate Secret valid:
// issued by the admin CA for render.AdminTLSNames, reissued when the CA
// changed, a name is missing, it is damaged or within
// pki.ServerRenewBefore of expiry. chimerad watches the mounted files and
// serves a reissued certificate without a restart (once the kubelet has
// updated the Secret volume).
func (r *Reconciler) ensureSelfManagedTLS(ctx context.Context, c *chimerav1.ChimeraCluster) error {
	names := render.AdminTLSNames(c)
	now := r.Now()
	s := &corev1.Secret{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: render.AdminTLSSecretName(c)}, s)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	exists := err == nil
	if exists && r.AdminCA.ServerValid(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], names, now) &&
		string(s.Data[render.SecretKeyCA]) == string(r.AdminCA.CertPEM) {
		return nil
	}
	// The cluster may have named an issuer before: its Certificate would
	// have cert-manager overwrite what is written here.
	if err := r.deleteAdminCertificate(ctx, c); err != nil {
		return err
	}
	certPEM, keyPEM, err := r.AdminCA.IssueServer(names, now)
	if err != nil {
		return fmt.Errorf("issue admin certificate: %w", err)
	}
	want := render.AdminTLSSecret(c, certPEM, keyPEM, r.AdminCA.CertPEM)
	if err := controllerutil.SetControllerReference(c, want, r.Scheme); err != nil {
		return err
	}
	if !exists {
		if err := r.Client.Create(ctx, want); err != nil {
			return fmt.Errorf("create admin TLS secret: %w", err)
		}
		r.Recorder.Eventf(c, corev1.EventTypeNormal, "AdminCertificateIssued", "issued the admin API certificate in Secret %s", want.Name)
		return nil
	}
	s.Data, s.Type = want.Data, want.Type
	if err := r.Client.Update(ctx, s); err != nil {
		return fmt.Errorf("renew admin TLS secret: %w", err)
	}
	r.Recorder.Eventf(c, corev1.EventTypeNormal, "AdminCertificateRenewed", "reissued the admin API certificate in Secret %s", s.Name)
	return nil
}

// ensureCertManagerTLS applies the cluster's cert-manager Certificate and
// reads the Secret cert-manager fills. Not ready (the servers wait) until
// the Secret holds a certificate for the MDS names that verifies against
// its own ca.crt, which is then the CA returned. cert-manager not being
// installed is a condition, not an error: nothing to retry faster than the
// resync.
func (r *Reconciler) ensureCertManagerTLS(ctx context.Context, c *chimerav1.ChimeraCluster) ([]byte, render.AdminTLSState, error) {
	ref := render.IssuerRef(c)
	cert := render.AdminCertificate(c)
	if err := r.apply(ctx, c, cert); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, render.AdminTLSState{Reason: render.ReasonCertManagerNotInstalled, Message: fmt.Sprintf(
				"spec.adminTLS.issuerRef names %s, but the API server does not serve %s (CRD %s): install cert-manager, "+
					"or remove spec.adminTLS.issuerRef to use the operator's admin CA; no server is started or rolled, nor its admin API called, until then",
				render.IssuerDescription(ref), render.CertificateGVK.GroupVersion().WithKind("Certificate"), render.CertificateCRDName)}, nil
		}
		return nil, render.AdminTLSState{}, err
	}
	s := &corev1.Secret{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: render.AdminTLSSecretName(c)}, s)
	problem := ""
	switch {
	case apierrors.IsNotFound(err):
		problem = fmt.Sprintf("no Secret %s yet", render.AdminTLSSecretName(c))
	case err != nil:
		return nil, render.AdminTLSState{}, err
	default:
		problem = render.AdminTLSSecretProblem(c, s.Data, r.Now())
	}
	if problem != "" {
		return nil, render.AdminTLSState{Reason: render.ReasonWaitingForCertificate, Message: fmt.Sprintf(
			"waiting for cert-manager to issue Certificate %s from %s: %s; no server is started or rolled, nor its admin API called, until it does",
			cert.GetName(), render.IssuerDescription(ref), problem)}, nil
	}
	return s.Data[render.SecretKeyCA], render.AdminTLSState{Ready: true, Reason: render.ReasonCertificateIssued, Message: fmt.Sprintf(
		"Secret %s holds the certificate cert-manager issued (Certificate %s from %s); admin clients verify it against the Secret's ca.crt",
		render.AdminTLSSecretName(c), cert.GetName(), render.IssuerDescription(ref))}, nil
}

// deleteAdminCertificate removes the cluster's cert-manager Certificate, if
// any (none, or no cert-manager installed, is success).
func (r *Reconciler) deleteAdminCertificate(ctx context.Context, c *chimerav1.ChimeraCluster) error {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(render.CertificateGVK)
	u.SetNamespace(c.Namespace)
	u.SetName(render.AdminCertificateName(c))
	err := r.Client.Delete(ctx, u)
	if err == nil || apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil
	}
	return fmt.Errorf("delete Certificate %s: %w", u.GetName(), err)
}

// publishCA keeps the cluster's key (render.CABundleKey) in the admin CA
// ConfigMap the CSI controller mounts: the Secret's ca.crt while cert-manager
// issues the certificate (caPEM), absent otherwise (the operator's own CA,
// ca.crt, covers the cluster then). A JSON merge patch of the one key, so
// concurrent writers of other keys are not overwritten.
func (r *Reconciler) publishCA(ctx context.Context, c *chimerav1.ChimeraCluster, caPEM []byte) error {
	if r.CABundle.Name == "" {
		return nil
	}
	var want *string
	if render.IssuerRef(c) != nil && c.DeletionTimestamp == nil && len(caPEM) > 0 {
		v := string(caPEM)
		want = &v
	}
	cm := &corev1.ConfigMap{}
	if err := r.APIReader.Get(ctx, r.CABundle, cm); err != nil {
		if apierrors.IsNotFound(err) && want == nil {
			return nil
		}
		return fmt.Errorf("admin CA bundle ConfigMap %s: %w", r.CABundle, err)
	}
	key := render.CABundleKey(c)
	have, ok := cm.Data[key]
	if (want == nil && !ok) || (want != nil && ok && have == *want) {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"data": map[string]*string{key: want}})
	if err != nil {
		return err
	}
	if err := r.Client.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("publish %s in the admin CA bundle ConfigMap %s: %w", key, r.CABundle, err)
	}
	return nil
}

// applyChildren applies every child and returns the export client rules it
// rendered (the MDS's config carries them; pushToMDS sends them live).
// The revision the pods should run comes with them.
func (r *Reconciler) applyChildren(ctx context.Context, c *chimerav1.ChimeraCluster) ([]render.AccessRule, string, error) {
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes); err != nil {
		return nil, "", fmt.Errorf("list nodes for the export client rules: %w", err)
	}
	nodeAddrs := render.NodeAddresses(nodes.Items)
	access, err := render.ExportAccess(c, render.NodeClients(nodes.Items))
	if err != nil {
		return nil, "", fmt.Errorf("export client rules: %w", err)
	}
	ch, err := render.Build(c, access)
	if err != nil {
		return nil, "", err
	}
	for _, o := range ch.Objects() {
		if err := r.apply(ctx, c, o); err != nil {
			return nil, "", err
		}
	}
	if err := r.applyNetworkPolicy(ctx, c, nodeAddrs); err != nil {
		return nil, "", err
	}
	// A mode switch leaves the other DS workload behind: remove it.
	var stale client.Object = &appsv1.DaemonSet{}
	if ch.DSDaemonSet != nil {
		stale = &appsv1.StatefulSet{}
	}
	stale.SetNamespace(c.Namespace)
	stale.SetName(render.DSName(c))
	if err := r.Client.Delete(ctx, stale); err != nil && !apierrors.IsNotFound(err) {
		return nil, "", fmt.Errorf("delete DS workload of the previous mode: %w", err)
	}
	return access, ch.Revision, nil
}

// applyNetworkPolicy renders the servers' policy from the current nodes, or
// removes one left from a run with policies enabled when they are not.
func (r *Reconciler) applyNetworkPolicy(ctx context.Context, c *chimerav1.ChimeraCluster, nodeAddrs []string) error {
	if !r.NetworkPolicy.Enabled {
		np := &networkingv1.NetworkPolicy{}
		key := types.NamespacedName{Namespace: c.Namespace, Name: render.NetworkPolicyName(c)}
		if err := r.Client.Get(ctx, key, np); apierrors.IsNotFound(err) {
			return nil // the usual case: nothing to remove, no API call
		}
		if err := r.Client.Delete(ctx, np); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete network policy (policies disabled): %w", err)
		}
		return nil
	}
	np, err := render.NetworkPolicy(c, r.NetworkPolicy, nodeAddrs)
	if err != nil {
		return err
	}
	return r.apply(ctx, c, np)
}

// apply server-side-applies one child owned by c.
func (r *Reconciler) apply(ctx context.Context, c *chimerav1.ChimeraCluster, o client.Object) error {
	gvk, err := r.Client.GroupVersionKindFor(o)
	if err != nil {
		return err
	}
	o.GetObjectKind().SetGroupVersionKind(gvk)
	if err := controllerutil.SetControllerReference(c, o, r.Scheme); err != nil {
		return err
	}
	//nolint:staticcheck // client.Apply with a typed object is the documented SSA path in v0.22.
	if err := r.Client.Patch(ctx, o, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply %s %s: %w", gvk.Kind, o.GetName(), err)
	}
	return nil
}

func (r *Reconciler) observe(ctx context.Context, c *chimerav1.ChimeraCluster, obs *render.Observed) error {
	mds := &corev1.Pod{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: render.MDSName(c) + "-0"}, mds)
	switch {
	case err == nil:
		obs.MDSReady = render.PodReady(mds)
	case !apierrors.IsNotFound(err):
		return err
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(c.Namespace), client.MatchingLabels(render.SelectorLabels(c, render.ComponentDS))); err != nil {
		return err
	}
	obs.DSPods = pods.Items
	obs.DSDesired = render.DesiredDataServers(c)
	if obs.DSDesired < 0 {
		ds := &appsv1.DaemonSet{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: render.DSName(c)}, ds); err == nil {
			obs.DSDesired = ds.Status.DesiredNumberScheduled
		} else {
			obs.DSDesired = 0
		}
	}
	return nil
}

// pushToMDS sends the DS list and the export client rules to a running
// MDS. Both PUTs are idempotent and sent on every reconcile (events and the
// resync), so an MDS that restarted learns them again. Failures are reported
// in status (Degraded) and retried on the next resync, not returned: the rest
// of the reconcile is still right.
// draining names the DS the rollout drains ("" for none).
func (r *Reconciler) pushToMDS(ctx context.Context, c *chimerav1.ChimeraCluster, auth adminAuth, access []render.AccessRule, draining string, obs *render.Observed) {
	mds := &corev1.Pod{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: render.MDSName(c) + "-0"}, mds); err != nil {
		return // no MDS yet: nothing to push to
	}
	if mds.Status.Phase != corev1.PodRunning || mds.Status.PodIP == "" || mds.DeletionTimestamp != nil {
		return
	}
	st, _ := render.DataServerStatuses(c, obs.DSPods)
	list := render.DSList(c, st, draining)
	url := r.AdminURL(c, mds)
	server := AdminServer{URL: url, Name: render.MDSAdminServerName(c), Token: auth.Token, CAPEM: auth.CAPEM}
	if err := r.Admin.PutDataServers(ctx, server, list); err != nil {
		obs.PushErr = err
	} else {
		obs.DSListInSync = true
	}
	if err := r.Admin.PutAccess(ctx, server, render.MountName, access); err != nil {
		obs.AccessErr = err
		return
	}
	r.tellAccessChange(c, access)
}

// tellAccessChange records an ExportClientsUpdated event when the rules
// pushed differ from the last ones pushed for c.
func (r *Reconciler) tellAccessChange(c *chimerav1.ChimeraCluster, access []render.AccessRule) {
	doc, err := json.Marshal(access)
	if err != nil {
		return
	}
	key := c.Namespace + "/" + c.Name
	if prev, ok := r.accessPushed.Swap(key, string(doc)); ok && prev.(string) == string(doc) {
		return
	}
	clients := 0
	for _, rule := range access {
		clients += len(rule.Clients)
	}
	r.Recorder.Eventf(c, corev1.EventTypeNormal, "ExportClientsUpdated",
		"export %s admits %d clients in %d rules (%d from spec.access; the rest: nodes' addresses and pod ranges, spec.network.podNetworkCIDRs)",
		render.ExportPath, clients, len(access), len(c.Spec.Access))
}

func (r *Reconciler) writeStatus(ctx context.Context, c *chimerav1.ChimeraCluster, obs render.Observed) error {
	before := c.Status.Phase
	tlsBefore := ""
	if a := meta.FindStatusCondition(c.Status.Conditions, chimerav1.ConditionAdminTLSReady); a != nil {
		tlsBefore = a.Reason
	}
	st := render.Status(c, obs, metav1.Now())
	// Optimistic lock: a reconcile that read a stale cluster (the cache
	// behind our own last write) must not merge its view of status.rollout
	// into a newer one; it gets a conflict and runs again.
	patch := client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
	c.Status = st
	if err := r.Client.Status().Patch(ctx, c, patch); err != nil {
		return err
	}
	if before != st.Phase {
		kind := corev1.EventTypeNormal
		if st.Phase == chimerav1.PhaseDegraded {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(c, kind, "Phase"+string(st.Phase), "phase %s → %s", phaseOr(before), st.Phase)
	}
	// The cert-manager path's transitions (the operator's own issuing has
	// its own events).
	switch tls := obs.AdminTLS; {
	case tls.Reason == tlsBefore || tls.Reason == "" || tls.Reason == render.ReasonSelfManagedCA:
	case tls.Reason == render.ReasonCertManagerNotInstalled:
		r.Recorder.Event(c, corev1.EventTypeWarning, tls.Reason, tls.Message)
	default:
		r.Recorder.Event(c, corev1.EventTypeNormal, tls.Reason, tls.Message)
	}
	return nil
}

func phaseOr(p chimerav1.Phase) string {
	if p == "" {
		return "(none)"
	}
	return string(p)
}

// reconcileDelete tears down in order: data servers first (they hold layouts
// the MDS hands out), then the MDS, then everything else; the finalizer goes
// when no server pod is left.
func (r *Reconciler) reconcileDelete(ctx context.Context, c *chimerav1.ChimeraCluster) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(c, Finalizer) {
		return ctrl.Result{}, nil
	}
	r.accessPushed.Delete(c.Namespace + "/" + c.Name)
	if err := r.publishCA(ctx, c, nil); err != nil {
		return ctrl.Result{}, err
	}
	// Before its Secret: cert-manager would write the Secret again.
	if err := r.deleteAdminCertificate(ctx, c); err != nil {
		return ctrl.Result{}, err
	}
	if c.Status.Phase != chimerav1.PhaseDeleting {
		patch := client.MergeFrom(c.DeepCopy())
		c.Status.Phase = chimerav1.PhaseDeleting
		if err := r.Client.Status().Patch(ctx, c, patch); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.Recorder.Event(c, corev1.EventTypeNormal, "Deleting", "tearing down data servers, then the metadata server")
	}
	meta := func(o client.Object, name string) client.Object {
		o.SetNamespace(c.Namespace)
		o.SetName(name)
		return o
	}
	stages := [][]client.Object{
		{meta(&appsv1.StatefulSet{}, render.DSName(c)), meta(&appsv1.DaemonSet{}, render.DSName(c))},
		{meta(&appsv1.StatefulSet{}, render.MDSName(c))},
		{
			meta(&corev1.Service{}, render.DSName(c)), meta(&corev1.Service{}, render.MDSName(c)),
			meta(&policyv1.PodDisruptionBudget{}, render.DSName(c)), meta(&policyv1.PodDisruptionBudget{}, render.MDSName(c)),
			meta(&corev1.ConfigMap{}, render.ConfigMapName(c)), meta(&corev1.Secret{}, render.AdminSecretName(c)), meta(&corev1.Secret{}, render.AdminTLSSecretName(c)),
			meta(&networkingv1.NetworkPolicy{}, render.NetworkPolicyName(c)),
		},
	}
	components := []string{render.ComponentDS, render.ComponentMDS, ""}
	for i, stage := range stages {
		for _, o := range stage {
			if err := r.Client.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
				return ctrl.Result{}, fmt.Errorf("delete %T %s: %w", o, o.GetName(), err)
			}
		}
		if components[i] == "" {
			break
		}
		left, err := r.podsLeft(ctx, c, components[i])
		if err != nil {
			return ctrl.Result{}, err
		}
		if left > 0 {
			return ctrl.Result{RequeueAfter: TeardownPollInterval}, nil
		}
	}
	controllerutil.RemoveFinalizer(c, Finalizer)
	if err := r.Client.Update(ctx, c); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) podsLeft(ctx context.Context, c *chimerav1.ChimeraCluster, component string) (int, error) {
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(c.Namespace), client.MatchingLabels(render.SelectorLabels(c, component))); err != nil {
		return 0, err
	}
	return len(pods.Items), nil
}

var _ = errors.New
