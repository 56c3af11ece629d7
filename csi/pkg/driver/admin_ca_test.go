package driver

// Proves which CA the controller verifies an admin server against when the
// operator's CA ConfigMap is mounted (--admin-ca-file .../ca.crt): a cluster
// whose certificate cert-manager issues is verified against its own file
// "<server name>.ca.crt" beside it (published by the operator), and only for
// that name; without that file its server is refused (the operator's CA did
// not sign it); a server of another cluster signed by the same issuer is
// refused too, whatever files exist for other names.

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
	"testing"
	"time"

	"github.com/chimera-k8s/chimera/csi/pkg/adminapi"
)

func TestAdminCAPerClusterFile(t *testing.T) {
	operatorCA, _ := testIssuer(t, "operator CA", "unused.example")
	issuerCA, pair := testIssuer(t, "cert-manager CA", "c-mds.ns.svc", "d-mds.ns.svc")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"volumes":[]}`))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	defer srv.Close()

	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, operatorCA, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Mode: ModeController, AdminEndpoint: srv.URL, AdminCAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	s := &controllerServer{d: d}
	list := func(serverName string) error {
		d.cfg.AdminTLSServerName = serverName
		c, err := s.client(srv.URL, map[string]string{SecretKeyToken: "tok"})
		if err != nil {
			return err
		}
		_, err = c.ListVolumes(context.Background())
		return err
	}
	if err := list("c-mds.ns.svc"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("before the cluster's CA file exists, only the operator's CA is trusted: got %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "c-mds.ns.svc.ca.crt"), issuerCA, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := list("c-mds.ns.svc"); err != nil {
		t.Fatalf("the cluster's own CA file must verify its server: %v", err)
	}
	// The same issuer's certificate presented for another cluster's name:
	// that name has no file, so the operator's CA decides, and refuses.
	if err := list("d-mds.ns.svc"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a CA published for one cluster must not be trusted for another: got %v", err)
	}
	// Names that could leave the directory, or pick a hidden file, fall
	// back to the main bundle even where such a file exists.
	_ = os.MkdirAll(filepath.Join(dir, "a"), 0o700)
	for _, n := range []string{"../ca", "a/b", ".hidden"} {
		if err := os.WriteFile(filepath.Join(dir, n+".ca.crt"), issuerCA, 0o600); err != nil {
			t.Fatal(err)
		}
		if got := adminapi.CABundleFor(caFile, n); got != caFile {
			t.Errorf("server name %q picked %s", n, got)
		}
	}
}

// testIssuer makes a CA and a server certificate it signs for names.
func testIssuer(t *testing.T, cn string, names ...string) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
