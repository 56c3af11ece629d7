package adminapi

// Proves the client verifies https admin servers: a server whose
// certificate comes from a CA the client was not given, or carries another
// name than the one checked, is refused before any request reaches it; the
// CA bundle file is read with errors naming it; a server from the given CA
// under the expected name is served.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestHTTPSVerifiesTheServer(t *testing.T) {
	var reached atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = w.Write([]byte(`{"volumes":[]}`))
	})
	// httptest's built-in certificate plays a server from another CA.
	untrusted := httptest.NewTLSServer(h)
	defer untrusted.Close()
	// The trusted server: a certificate from our own CA for example.com.
	caPEM, pair := testCA(t, "example.com")
	trusted := httptest.NewUnstartedServer(h)
	trusted.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	trusted.StartTLS()
	defer trusted.Close()
	dir := t.TempDir()
	bundle := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(bundle, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	pool, err := LoadCABundle(bundle)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(untrusted.URL, "tok", &TLS{RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListVolumes(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a server from another CA must be refused for its certificate, got %v", err)
	}
	c, _ = New(trusted.URL, "tok", &TLS{RootCAs: pool, ServerName: "chimera-mds.other.svc"})
	if _, err := c.ListVolumes(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a certificate without the checked name must be refused, got %v", err)
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d requests reached a server that failed verification", n)
	}
	// Dialled by address, checked by name (as for a proxied endpoint).
	c, _ = New(trusted.URL, "tok", &TLS{RootCAs: pool, ServerName: "example.com"})
	if _, err := c.ListVolumes(context.Background()); err != nil {
		t.Fatalf("trusted server: %v", err)
	}

	// Bundle files: missing and without a certificate, each named.
	if _, err := LoadCABundle(filepath.Join(dir, "missing.crt")); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Fatalf("missing bundle: %v", err)
	}
	junk := filepath.Join(dir, "junk.crt")
	_ = os.WriteFile(junk, []byte("not PEM"), 0o600)
	if _, err := LoadCABundle(junk); err == nil || !strings.Contains(err.Error(), "junk.crt") || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("junk bundle: %v", err)
	}
}

// testCA makes a CA and a server certificate it signs for name; returns the
// CA as PEM and the server's key pair.
func testCA(t *testing.T, name string) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
