package controller_test

// Proves the cert-manager path against a real apiserver, in one sequence
// because it installs a CRD the rest of the suite does without:
//  1. cert-manager absent: a cluster naming an issuer gets AdminTLSReady=False
//     and Degraded with reason CertManagerNotInstalled and a message naming
//     cert-manager's CRD; no server is started; the operator keeps running.
//  2. The Certificate kind appears (a test stand-in for cert-manager's CRD,
//     operator/testdata): the operator creates the Certificate, owned by the
//     cluster, for the MDS names into the Secret the MDS mounts, from the
//     issuer named, and waits (WaitingForCertificate, naming both); still no
//     server.
//  3. The test plays cert-manager: it signs a server certificate with its own
//     CA (crypto/x509, unknown to the operator) and writes the Secret as
//     cert-manager does. The operator proceeds: AdminTLSReady=True, the MDS
//     StatefulSet appears, the Secret's ca.crt is published for the CSI
//     controller under the cluster's key of the admin CA ConfigMap, and the
//     operator's own admin calls reach an MDS serving that certificate (so it
//     verified it against the Secret's ca.crt, not its own CA).
//  4. The issuer is removed: the Certificate is deleted, the operator's own
//     CA issues the Secret again, and the published CA is withdrawn.
//  5. Deleting a cluster that names an issuer removes its Certificate and
//     its published CA.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	"github.com/chimera-k8s/chimera/operator/render"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

func TestAdminCertificateFromCertManager(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "certmgr")
	key := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }
	certificate := func(name string) (*unstructured.Unstructured, error) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(render.CertificateGVK)
		return u, k8s.Get(ctx, key(name), u)
	}
	adminTLS := func(c *chimerav1.ChimeraCluster, reason string, words ...string) func() error {
		return func() error {
			cur := get(t, c)
			a := meta.FindStatusCondition(cur.Status.Conditions, chimerav1.ConditionAdminTLSReady)
			if a == nil || a.Reason != reason {
				return fmt.Errorf("AdminTLSReady %+v, want reason %s", a, reason)
			}
			for _, w := range words {
				if !strings.Contains(a.Message, w) {
					return fmt.Errorf("AdminTLSReady message %q lacks %q", a.Message, w)
				}
			}
			return nil
		}
	}
	noServers := func(c *chimerav1.ChimeraCluster) {
		t.Helper()
		if err := k8s.Get(ctx, key(render.MDSName(c)), &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the MDS StatefulSet must wait for the certificate: %v", err)
		}
	}
	bundle := func() map[string]string {
		cm := &corev1.ConfigMap{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: adminClientNS, Name: suiteCABundle}, cm); err != nil {
			t.Fatal(err)
		}
		return cm.Data
	}

	// 1. No cert-manager.
	crdName := render.CertificateCRDName
	if err := k8s.Get(ctx, types.NamespacedName{Name: crdName}, crdObject()); !apierrors.IsNotFound(err) {
		t.Fatalf("the suite must start without %s for this test to mean anything: %v", crdName, err)
	}
	c := validCluster(ns, "cm")
	c.Spec.AdminTLS.IssuerRef = &chimerav1.IssuerReference{Name: "ca-issuer"}
	if err := k8s.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	eventually(t, "CertManagerNotInstalled", adminTLS(c, "CertManagerNotInstalled", "cert-manager", crdName, "Issuer ca-issuer"))
	cur := get(t, c)
	if d := meta.FindStatusCondition(cur.Status.Conditions, chimerav1.ConditionDegraded); d == nil || d.Status != metav1.ConditionTrue || d.Reason != "CertManagerNotInstalled" {
		t.Errorf("Degraded %+v", d)
	}
	noServers(c)
	event(t, ns, "cm", corev1.EventTypeWarning, "CertManagerNotInstalled")

	// 2. The kind appears; the operator needs no restart (a touch of the
	// cluster saves waiting for the 30 s resync).
	installCRD(t, filepath.Join("..", "testdata", "certificate-crd-standin.yaml"))
	touch(t, c)
	var cert *unstructured.Unstructured
	eventually(t, "the Certificate", func() error {
		var err error
		cert, err = certificate("cm-admin-tls")
		return err
	})
	if refs := cert.GetOwnerReferences(); len(refs) != 1 || refs[0].Name != "cm" || refs[0].Kind != "ChimeraCluster" || refs[0].Controller == nil || !*refs[0].Controller {
		t.Errorf("the Certificate must be controlled by its cluster: %+v", refs)
	}
	spec, _, _ := unstructured.NestedMap(cert.Object, "spec")
	if spec["secretName"] != "cm-admin-tls" {
		t.Errorf("secretName %v, want the Secret the MDS mounts", spec["secretName"])
	}
	dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	if strings.Join(dns, ",") != strings.Join(render.AdminTLSNames(c), ",") {
		t.Errorf("dnsNames %v, want %v", dns, render.AdminTLSNames(c))
	}
	ref, _, _ := unstructured.NestedStringMap(cert.Object, "spec", "issuerRef")
	if ref["name"] != "ca-issuer" || ref["kind"] != "Issuer" || ref["group"] != "cert-manager.io" {
		t.Errorf("issuerRef %v", ref)
	}
	eventually(t, "WaitingForCertificate", adminTLS(c, "WaitingForCertificate", "Certificate cm-admin-tls", "Issuer ca-issuer", "no Secret cm-admin-tls"))
	noServers(c)

	// 3. cert-manager's part: the Secret, labelled from the Certificate's
	// secretTemplate, with a pair from a CA the operator never saw. First a
	// Secret without ca.crt (what an ACME issuer writes): still waiting.
	caPEM, certPEM, keyPEM := issuerPair(t, render.AdminTLSNames(c))
	labels, _, _ := unstructured.NestedStringMap(cert.Object, "spec", "secretTemplate", "labels")
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cm-admin-tls", Labels: labels,
			Annotations: map[string]string{"cert-manager.io/certificate-name": "cm-admin-tls"}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
	}
	if err := k8s.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	eventually(t, "waiting for ca.crt", adminTLS(c, "WaitingForCertificate", "has no [ca.crt]"))
	noServers(c)
	sec.Data[render.SecretKeyCA] = caPEM
	if err := k8s.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	eventually(t, "CertificateIssued", adminTLS(c, "CertificateIssued", "Certificate cm-admin-tls"))
	event(t, ns, "cm", corev1.EventTypeNormal, "WaitingForCertificate")
	event(t, ns, "cm", corev1.EventTypeNormal, "CertificateIssued")
	eventually(t, "the MDS StatefulSet", func() error { return k8s.Get(ctx, key("cm-mds"), &appsv1.StatefulSet{}) })
	eventually(t, "the CA published for the CSI controller", func() error {
		if got := bundle()[render.CABundleKey(c)]; got != string(caPEM) {
			return fmt.Errorf("bundle key %s is %q", render.CABundleKey(c), got)
		}
		return nil
	})
	if bundle()["ca.crt"] != string(suiteCA.CertPEM) {
		t.Error("the operator's own CA must stay the bundle's ca.crt")
	}
	got := getSecret(t, ns, "cm-admin-tls")
	if string(got.Data[corev1.TLSCertKey]) != string(certPEM) {
		t.Fatal("the operator must not rewrite the Secret cert-manager fills")
	}
	// The admin calls: an MDS serving cert-manager's pair.
	var reached atomic.Int32
	token := getSecret(t, ns, "cm-admin-token")
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+string(token.Data[render.SecretKeyToken]) {
			reached.Add(1)
		}
		_, _ = w.Write([]byte(`{}`))
	})}
	adminURL.url.Store(serveTLSPair(t, srv, pair))
	makePod(t, c, "cm-mds-0", render.ComponentMDS, "10.0.9.10", "", true)
	eventually(t, "an admin call verified against the Secret's ca.crt", func() error {
		if reached.Load() == 0 {
			cur := get(t, c)
			return fmt.Errorf("no admin call reached the MDS; conditions %+v", cur.Status.Conditions)
		}
		return nil
	})

	// 4. Back to the operator's CA.
	eventually(t, "issuerRef removed", func() error { // retried on conflicts with the reconciler
		cur := get(t, c)
		cur.Spec.AdminTLS.IssuerRef = nil
		return k8s.Update(ctx, cur)
	})
	eventually(t, "SelfManagedCA", adminTLS(c, "SelfManagedCA"))
	eventually(t, "the Certificate deleted", func() error {
		if _, err := certificate("cm-admin-tls"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Certificate still there: %v", err)
		}
		return nil
	})
	got = getSecret(t, ns, "cm-admin-tls")
	if string(got.Data[render.SecretKeyCA]) != string(suiteCA.CertPEM) || !suiteCA.ServerValid(got.Data[corev1.TLSCertKey], got.Data[corev1.TLSPrivateKeyKey], render.AdminTLSNames(c), time.Now()) {
		t.Error("the operator's CA must issue the Secret again")
	}
	eventually(t, "the published CA withdrawn", func() error {
		if v, ok := bundle()[render.CABundleKey(c)]; ok {
			return fmt.Errorf("bundle still has %s: %q", render.CABundleKey(c), v)
		}
		return nil
	})

	// Done with cm: its pod and itself (no kubelet, no garbage collector).
	if err := k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cm-mds-0"}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}

	// 5. Deletion of a cluster naming an issuer.
	d := validCluster(ns, "cm2")
	d.Spec.AdminTLS.IssuerRef = &chimerav1.IssuerReference{Name: "corp", Kind: "ClusterIssuer"}
	if err := k8s.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	eventually(t, "cm2's Certificate", func() error { _, err := certificate("cm2-admin-tls"); return err })
	eventually(t, "cm2 waiting", adminTLS(d, "WaitingForCertificate", "ClusterIssuer corp"))
	if err := k8s.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	eventually(t, "cm2 gone with its Certificate", func() error {
		if err := k8s.Get(ctx, key("cm2"), &chimerav1.ChimeraCluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still there: %v", err)
		}
		if _, err := certificate("cm2-admin-tls"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Certificate still there: %v", err)
		}
		return nil
	})
}

// event waits for an event of reason on cluster name.
func event(t *testing.T, ns, name, kind, reason string) {
	t.Helper()
	eventually(t, "event "+reason, func() error {
		evs := &corev1.EventList{}
		if err := k8s.List(context.Background(), evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == name && e.Reason == reason && e.Type == kind {
				return nil
			}
		}
		return fmt.Errorf("no %s event %s on %s among %d", kind, reason, name, len(evs.Items))
	})
}

func getSecret(t *testing.T, ns, name string) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func crdObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("apiextensions.k8s.io/v1")
	u.SetKind("CustomResourceDefinition")
	return u
}

// installCRD creates the CRD in file and waits until it is served.
func installCRD(t *testing.T, file string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	u := crdObject()
	if err := yaml.Unmarshal(raw, &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	eventually(t, "CRD "+u.GetName()+" established", func() error {
		cur := crdObject()
		if err := k8s.Get(context.Background(), types.NamespacedName{Name: u.GetName()}, cur); err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("not established: %v", conds)
	})
}

// touch updates an annotation of c, which reconciles it now.
func touch(t *testing.T, c *chimerav1.ChimeraCluster) {
	t.Helper()
	eventually(t, "touch "+c.Name, func() error {
		cur := get(t, c)
		patch := client.MergeFrom(cur.DeepCopy())
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations["test.chimera.io/touched"] = time.Now().Format(time.RFC3339Nano)
		return k8s.Patch(context.Background(), cur, patch)
	})
}

// issuerPair plays a cert-manager CA issuer: a fresh CA and a server
// certificate it signs for names, as PEM (key PKCS#8).
func issuerPair(t *testing.T, names []string) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test issuer"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: names, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}
