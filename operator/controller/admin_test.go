package controller_test

// Proves the operator's admin client speaks only verified TLS: a server
// whose certificate comes from another CA (httptest's own) or names another
// host is refused before any request reaches it; plain http is refused
// outright; a server with a certificate from the operator's CA for the
// expected name is served, with the bearer token. Runs without envtest.

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chimera-k8s/chimera/operator/controller"
	"github.com/chimera-k8s/chimera/operator/pki"
	"github.com/chimera-k8s/chimera/operator/render"
)

const adminTestName = "c-mds.ns.svc"

func TestAdminClientRefusesAnUntrustedServer(t *testing.T) {
	ca, err := pki.NewCA(pki.CACommonName, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`{}`))
	})
	a := controller.NewAdminClient(ca.Pool())

	// httptest's server: a certificate from a CA the operator does not trust.
	other := httptest.NewTLSServer(h)
	defer other.Close()
	err = a.PutDataServers(t.Context(), controller.AdminServer{URL: other.URL, Name: "example.com", Token: "tok"}, nil)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a server from another CA must be refused for its certificate, got %v", err)
	}

	// Our CA, but issued for other names than the one checked.
	ours := httptest.NewUnstartedServer(h)
	certPEM, keyPEM, err := ca.IssueServer([]string{adminTestName}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ours.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	ours.StartTLS()
	defer ours.Close()
	err = a.PutAccess(t.Context(), controller.AdminServer{URL: ours.URL, Name: "other-mds.ns.svc", Token: "tok"}, render.MountName, nil)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a certificate for another name must be refused, got %v", err)
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d requests reached an untrusted server", n)
	}

	// Plain http never carries the token.
	plain := httptest.NewServer(h)
	defer plain.Close()
	err = a.PutDataServers(t.Context(), controller.AdminServer{URL: plain.URL, Name: adminTestName, Token: "tok"}, nil)
	if err == nil || !strings.Contains(err.Error(), "not https") {
		t.Fatalf("plain http must be refused, got %v", err)
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d requests reached the plain server", n)
	}

	// The right CA and name: served; a wrong token is the server's 401.
	if err := a.PutDataServers(t.Context(), controller.AdminServer{URL: ours.URL, Name: adminTestName, Token: "tok"}, nil); err != nil {
		t.Fatalf("trusted server: %v", err)
	}
	err = a.PutDataServers(t.Context(), controller.AdminServer{URL: ours.URL, Name: adminTestName, Token: "wrong"}, nil)
	if err == nil || !strings.Contains(err.Error(), "HTTP 401") {
		t.Fatalf("wrong token: want HTTP 401, got %v", err)
	}
}

// Proves the per-server CA of a cluster whose certificate cert-manager
// issues: its server is verified against that CA (AdminServer.CAPEM) and
// not the client's own; without it, or with another CA, it is refused; the
// connection pool follows a change of CA.
func TestAdminClientTrustsTheClustersOwnCA(t *testing.T) {
	operatorCA, err := pki.NewCA(pki.CACommonName, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	issuer, _ := pki.NewCA("cert-manager issuer", time.Now())
	other, _ := pki.NewCA("another issuer", time.Now())
	certPEM, keyPEM, err := issuer.IssueServer([]string{adminTestName}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached.Add(1)
		_, _ = w.Write([]byte(`{}`))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	defer srv.Close()
	a := controller.NewAdminClient(operatorCA.Pool())
	s := controller.AdminServer{URL: srv.URL, Name: adminTestName, Token: "tok"}
	if err := a.PutDataServers(t.Context(), s, nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the cluster's CA the operator's own must refuse it, got %v", err)
	}
	s.CAPEM = issuer.CertPEM
	if err := a.PutDataServers(t.Context(), s, nil); err != nil {
		t.Fatalf("verified against the cluster's CA: %v", err)
	}
	s.CAPEM = other.CertPEM
	if err := a.PutDataServers(t.Context(), s, nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a changed CA must be used (not the pooled connection), got %v", err)
	}
	s.CAPEM = []byte("junk")
	if err := a.PutDataServers(t.Context(), s, nil); err == nil || !strings.Contains(err.Error(), "CA for "+adminTestName) {
		t.Fatalf("an unreadable CA must be named, got %v", err)
	}
	if n := reached.Load(); n != 1 {
		t.Fatalf("%d requests reached the server, want the 1 verified one", n)
	}
}
