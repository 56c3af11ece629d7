package render

// Proves the cert-manager path as rendered: a cluster naming no issuer gets
// no Certificate; one naming an issuer gets a cert-manager.io/v1 Certificate
// for exactly the names the operator's own certificate carries, into the
// Secret the MDS mounts (labelled so the operator's cache sees it), from the
// issuer named (defaults filled in), with a lifetime and renewal margin as
// the operator's; the Secret is waited for until it holds a pair for every
// name that verifies against its own ca.crt (each way it can fall short is
// named); and the AdminTLSReady condition, Progressing and Degraded say so.

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/pki"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestAdminCertificate(t *testing.T) {
	c := smallCluster()
	if AdminCertificate(c) != nil || IssuerRef(c) != nil {
		t.Fatal("a cluster naming no issuer must get no Certificate")
	}
	c.Spec.AdminTLS.IssuerRef = &chimerav1.IssuerReference{Name: "ca-issuer"}
	u := AdminCertificate(c)
	if u.GroupVersionKind() != CertificateGVK || CertificateGVK.String() != "cert-manager.io/v1, Kind=Certificate" {
		t.Fatalf("kind %v", u.GroupVersionKind())
	}
	if u.GetName() != "small-admin-tls" || u.GetNamespace() != "storage" || u.GetLabels()[LabelCluster] != "small" {
		t.Errorf("meta: %s/%s %v", u.GetNamespace(), u.GetName(), u.GetLabels())
	}
	// Through JSON, as the API server gets it (and DeepCopy panics on
	// values that are not JSON's).
	raw, err := json.Marshal(u.DeepCopy().Object)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Spec struct {
			SecretName     string `json:"secretName"`
			CommonName     string `json:"commonName"`
			DNSNames       []string
			IPAddresses    []string `json:"ipAddresses"`
			Duration       string
			RenewBefore    string
			Usages         []string
			SecretTemplate struct{ Labels map[string]string }
			PrivateKey     struct{ Algorithm, RotationPolicy string }
			IssuerRef      struct{ Name, Kind, Group string }
		}
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	s := doc.Spec
	if s.SecretName != AdminTLSSecretName(c) {
		t.Errorf("secretName %q, want the Secret the MDS mounts (%s)", s.SecretName, AdminTLSSecretName(c))
	}
	if strings.Join(s.DNSNames, ",") != strings.Join(AdminTLSNames(c), ",") || len(s.IPAddresses) != 0 {
		t.Errorf("dnsNames %v ipAddresses %v, want the operator certificate's names %v", s.DNSNames, s.IPAddresses, AdminTLSNames(c))
	}
	if s.CommonName != "" {
		t.Errorf("commonName %q: a name may exceed the 64 bytes a CN holds", s.CommonName)
	}
	if d, err := time.ParseDuration(s.Duration); err != nil || d != pki.ServerValidity {
		t.Errorf("duration %q", s.Duration)
	}
	if d, err := time.ParseDuration(s.RenewBefore); err != nil || d != pki.ServerRenewBefore {
		t.Errorf("renewBefore %q", s.RenewBefore)
	}
	if !strings.Contains(strings.Join(s.Usages, ","), "server auth") {
		t.Errorf("usages %v lack server auth", s.Usages)
	}
	if s.IssuerRef.Name != "ca-issuer" || s.IssuerRef.Kind != "Issuer" || s.IssuerRef.Group != "cert-manager.io" {
		t.Errorf("issuerRef %+v, want the defaults filled in", s.IssuerRef)
	}
	if l := s.SecretTemplate.Labels; l[LabelManagedBy] != ManagedBy || l[LabelCluster] != "small" {
		t.Errorf("secretTemplate labels %v: the operator's cache and watch select them", l)
	}
	if s.PrivateKey.Algorithm != "ECDSA" || s.PrivateKey.RotationPolicy != "Always" {
		t.Errorf("privateKey %+v", s.PrivateKey)
	}
	c.Spec.AdminTLS.IssuerRef = &chimerav1.IssuerReference{Name: "corp", Kind: "ClusterIssuer", Group: "cert-manager.io"}
	ref, _, _ := unstructured.NestedMap(AdminCertificate(c).Object, "spec", "issuerRef")
	if ref["kind"] != "ClusterIssuer" || ref["name"] != "corp" {
		t.Errorf("issuerRef %v", ref)
	}
	if CABundleKey(c) != "small-mds.storage.svc.ca.crt" {
		t.Errorf("CA bundle key %q must be the checked server name + .ca.crt (the CSI driver's lookup)", CABundleKey(c))
	}
}

func TestAdminTLSSecretProblem(t *testing.T) {
	c := smallCluster()
	now := time.Now()
	issuer, err := pki.NewCA("some issuer", now)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := pki.NewCA("another issuer", now)
	names := AdminTLSNames(c)
	certPEM, keyPEM, err := issuer.IssueServer(names, now)
	if err != nil {
		t.Fatal(err)
	}
	good := map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": issuer.CertPEM}
	if p := AdminTLSSecretProblem(c, good, now); p != "" {
		t.Fatalf("a pair for every name from the Secret's CA must be usable: %s", p)
	}
	short, shortKey, _ := issuer.IssueServer(names[:1], now)
	_, strayKey, _ := issuer.IssueServer(names, now)
	with := func(k string, v []byte) map[string][]byte {
		m := map[string][]byte{}
		for kk, vv := range good {
			m[kk] = vv
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name string
		data map[string][]byte
		at   time.Time
		want string
	}{
		{"empty", nil, now, "has no [tls.crt tls.key ca.crt]"},
		{"no ca.crt (an ACME issuer)", with("ca.crt", nil), now, "has no [ca.crt]"},
		{"ca.crt of another issuer", with("ca.crt", other.CertPEM), now, "does not verify"},
		{"ca.crt not PEM", with("ca.crt", []byte("junk")), now, "ca.crt"},
		{"a name missing", map[string][]byte{"tls.crt": short, "tls.key": shortKey, "ca.crt": issuer.CertPEM}, now, names[1]},
		{"key of another certificate", with("tls.key", strayKey), now, "tls.key is not the key"},
		{"expired", good, now.Add(pki.ServerValidity + time.Hour), "expired"},
	}
	for _, tc := range cases {
		if p := AdminTLSSecretProblem(c, tc.data, tc.at); !strings.Contains(p, tc.want) || !strings.Contains(p, "small-admin-tls") {
			t.Errorf("%s: problem %q, want it to name the Secret and %q", tc.name, p, tc.want)
		}
	}
}

func TestAdminTLSConditions(t *testing.T) {
	c := smallCluster()
	now := metav1.Now()
	cond := func(st chimerav1.ChimeraClusterStatus, typ string) *metav1.Condition {
		return meta.FindStatusCondition(st.Conditions, typ)
	}
	st := Status(c, Observed{AdminTLS: AdminTLSState{Reason: ReasonWaitingForCertificate, Message: "waiting for Certificate small-admin-tls"}}, now)
	if a := cond(st, chimerav1.ConditionAdminTLSReady); a == nil || a.Status != metav1.ConditionFalse || a.Reason != ReasonWaitingForCertificate || !strings.Contains(a.Message, "small-admin-tls") {
		t.Errorf("waiting: AdminTLSReady %+v", a)
	}
	if p := cond(st, chimerav1.ConditionProgressing); p.Status != metav1.ConditionTrue || p.Reason != ReasonWaitingForCertificate {
		t.Errorf("waiting: Progressing %+v", p)
	}
	if d := cond(st, chimerav1.ConditionDegraded); d.Status != metav1.ConditionFalse {
		t.Errorf("waiting for an issuer is no fault: Degraded %+v", d)
	}

	st = Status(c, Observed{AdminTLS: AdminTLSState{Reason: ReasonCertManagerNotInstalled, Message: "install cert-manager"}}, now)
	if d := cond(st, chimerav1.ConditionDegraded); d.Status != metav1.ConditionTrue || d.Reason != ReasonCertManagerNotInstalled || !strings.Contains(d.Message, "cert-manager") {
		t.Errorf("no cert-manager: Degraded %+v", d)
	}
	if p := cond(st, chimerav1.ConditionProgressing); p.Status != metav1.ConditionFalse || p.Reason != ReasonCertManagerNotInstalled {
		t.Errorf("no cert-manager: Progressing %+v (nothing moves until a human acts)", p)
	}
	if st.Phase != chimerav1.PhaseDegraded {
		t.Errorf("no cert-manager: phase %s", st.Phase)
	}

	c.Status = st
	st = Status(c, Observed{AdminTLS: AdminTLSState{Ready: true, Reason: ReasonCertificateIssued, Message: "issued"}}, now)
	if a := cond(st, chimerav1.ConditionAdminTLSReady); a.Status != metav1.ConditionTrue || a.Reason != ReasonCertificateIssued {
		t.Errorf("issued: AdminTLSReady %+v", a)
	}
	if d := cond(st, chimerav1.ConditionDegraded); d.Reason == ReasonCertManagerNotInstalled {
		t.Errorf("issued: Degraded still %+v", d)
	}
}
