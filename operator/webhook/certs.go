package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Self-managed serving certificates, used when cert-manager is not installed.
// The CA and the serving certificate live in one Secret (the single source of
// truth across operator replicas); the CA goes into the webhook
// configuration's caBundle; tls.crt/tls.key are written to the webhook
// server's certificate directory before it starts.
const (
	CAValidity      = 10 * 365 * 24 * time.Hour
	ServingValidity = 365 * 24 * time.Hour
	// RenewBefore: a serving certificate closer than this to expiry is replaced.
	RenewBefore = 30 * 24 * time.Hour

	keyCACert = "ca.crt"
	keyCAKey  = "ca.key"
	keyCert   = "tls.crt"
	keyKey    = "tls.key"
)

// CertOptions says where the certificate material goes.
type CertOptions struct {
	Namespace   string // of the operator, its Service and the Secret
	SecretName  string
	ServiceName string // the webhook Service; the certificate's DNS names
	WebhookName string // ValidatingWebhookConfiguration whose caBundle is set
	// MutatingWebhookName is the MutatingWebhookConfiguration (the
	// chimera-fuse sidecar injector) whose caBundle is set too; empty: none.
	MutatingWebhookName string
	CertDir             string
	// ExtraSANs are further names (DNS names or IP addresses) the serving
	// certificate must carry, for a webhook reached by URL rather than through
	// its Service (an operator run outside the cluster, as in the fake-cluster
	// e2e where the apiserver calls https://127.0.0.1:<port>).
	ExtraSANs []string
	Now       func() time.Time
}

// EnsureCerts makes sure a valid CA and serving certificate exist in the
// Secret, writes the serving pair to CertDir and patches the caBundle.
func EnsureCerts(ctx context.Context, c client.Client, o CertOptions) error {
	if o.Now == nil {
		o.Now = time.Now
	}
	sec := &corev1.Secret{}
	err := c.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName}, sec)
	switch {
	case apierrors.IsNotFound(err):
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.SecretName}, Type: corev1.SecretTypeOpaque}
		// Owned by the webhook configuration (cluster-scoped owners of
		// namespaced objects are allowed): uninstalling the chart removes the
		// configuration and the garbage collector removes this Secret, which
		// helm never knew about.
		if err := ownByWebhookConfig(ctx, c, o.WebhookName, sec); err != nil {
			return err
		}
		if err := fill(sec, o); err != nil {
			return err
		}
		if err := c.Create(ctx, sec); err != nil {
			if !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create webhook cert secret: %w", err)
			}
			// Another replica won the race: use its certificates.
			if err := c.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName}, sec); err != nil {
				return err
			}
		}
	case err != nil:
		return fmt.Errorf("get webhook cert secret: %w", err)
	default:
		if !valid(sec, o) {
			if err := fill(sec, o); err != nil {
				return err
			}
			if err := c.Update(ctx, sec); err != nil {
				return fmt.Errorf("renew webhook cert secret: %w", err)
			}
		}
	}
	if err := os.MkdirAll(o.CertDir, 0o700); err != nil {
		return err
	}
	for _, k := range []string{keyCert, keyKey} {
		if err := os.WriteFile(filepath.Join(o.CertDir, k), sec.Data[k], 0o600); err != nil {
			return err
		}
	}
	if err := patchCABundle(ctx, c, o.WebhookName, sec.Data[keyCACert]); err != nil {
		return err
	}
	return patchMutatingCABundle(ctx, c, o.MutatingWebhookName, sec.Data[keyCACert])
}

func ownByWebhookConfig(ctx context.Context, c client.Client, name string, sec *corev1.Secret) error {
	if name == "" {
		return nil
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, types.NamespacedName{Name: name}, vwc); err != nil {
		return fmt.Errorf("get ValidatingWebhookConfiguration %s: %w", name, err)
	}
	sec.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration", Name: vwc.Name, UID: vwc.UID,
	}}
	return nil
}

func patchCABundle(ctx context.Context, c client.Client, name string, ca []byte) error {
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	return patchWebhookCA(ctx, c, "ValidatingWebhookConfiguration", name, vwc, ca, func() []*admissionregistrationv1.WebhookClientConfig {
		cfgs := make([]*admissionregistrationv1.WebhookClientConfig, len(vwc.Webhooks))
		for i := range vwc.Webhooks {
			cfgs[i] = &vwc.Webhooks[i].ClientConfig
		}
		return cfgs
	})
}

func patchMutatingCABundle(ctx context.Context, c client.Client, name string, ca []byte) error {
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	return patchWebhookCA(ctx, c, "MutatingWebhookConfiguration", name, mwc, ca, func() []*admissionregistrationv1.WebhookClientConfig {
		cfgs := make([]*admissionregistrationv1.WebhookClientConfig, len(mwc.Webhooks))
		for i := range mwc.Webhooks {
			cfgs[i] = &mwc.Webhooks[i].ClientConfig
		}
		return cfgs
	})
}

// patchWebhookCA sets ca as the caBundle of every webhook of the named
// configuration (obj, of kind `kind`; configs lists its webhooks' client
// configs once it is read), patching only when one differs. No name: nothing
// to do.
func patchWebhookCA(ctx context.Context, c client.Client, kind, name string, obj client.Object, ca []byte,
	configs func() []*admissionregistrationv1.WebhookClientConfig) error {
	if name == "" {
		return nil
	}
	if err := c.Get(ctx, types.NamespacedName{Name: name}, obj); err != nil {
		return fmt.Errorf("get %s %s: %w", kind, name, err)
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	changed := false
	for _, cc := range configs() {
		if !bytes.Equal(cc.CABundle, ca) {
			cc.CABundle = ca
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return c.Patch(ctx, obj, patch)
}

// valid: the CA and serving pair parse, the serving certificate chains to the
// CA, names the service and is not about to expire.
func valid(sec *corev1.Secret, o CertOptions) bool {
	ca, err := parseCert(sec.Data[keyCACert])
	if err != nil {
		return false
	}
	leaf, err := parseCert(sec.Data[keyCert])
	if err != nil {
		return false
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: dnsNames(o)[1], Roots: pool, CurrentTime: o.Now().Add(RenewBefore)})
	if err != nil || len(sec.Data[keyKey]) == 0 {
		return false
	}
	// A SAN asked for since the certificate was issued means a new one.
	for _, san := range o.ExtraSANs {
		if leaf.VerifyHostname(san) != nil {
			return false
		}
	}
	return true
}

// splitSANs separates the extra names into IP addresses and DNS names.
func splitSANs(sans []string) (ips []net.IP, dns []string) {
	for _, s := range sans {
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		} else if s != "" {
			dns = append(dns, s)
		}
	}
	return ips, dns
}

func dnsNames(o CertOptions) []string {
	return []string{
		o.ServiceName,
		fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Namespace),
		fmt.Sprintf("%s.%s.svc.cluster.local", o.ServiceName, o.Namespace),
	}
}

// fill generates a fresh CA and serving certificate into sec.Data.
func fill(sec *corev1.Secret, o CertOptions) error {
	now := o.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "chimera-operator-webhook-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	extraIPs, extraDNS := splitSANs(o.ExtraSANs)
	tpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: dnsNames(o)[1]},
		DNSNames:     append(dnsNames(o), extraDNS...),
		IPAddresses:  extraIPs,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(ServingValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	caKeyDER, _ := x509.MarshalECPrivateKey(caKey)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	sec.Data = map[string][]byte{
		keyCACert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		keyCAKey:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: caKeyDER}),
		keyCert:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyKey:    pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	return nil
}

func parseCert(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil {
		return nil, fmt.Errorf("no PEM block")
	}
	return x509.ParseCertificate(b.Bytes)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}
