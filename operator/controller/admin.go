package controller

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/chimera-k8s/chimera/operator/pki"
	"github.com/chimera-k8s/chimera/operator/render"
)

// Limits of one admin API call: the MDS answers in microseconds when healthy,
// and a reconcile must never hang on a wedged MDS.
const (
	AdminCallTimeout       = 10 * time.Second
	AdminResponseBytesMax  = 64 << 10
	adminDataServersPath   = "/api/v1/dataservers"
	adminAccessPath        = "/api/v1/access/"
	adminErrorBodyBytesMax = 512
)

// AdminServer is one MDS admin endpoint: where to dial, the name its
// certificate must carry (render.MDSAdminServerName: the operator dials the
// pod IP, which no certificate names), the bearer token, and the CA bundle
// (PEM) its certificate must chain to: the ca.crt of the cluster's
// cert-manager-issued Secret; empty: the client's RootCAs (the operator's
// admin CA).
type AdminServer struct {
	URL   string
	Name  string
	Token string
	CAPEM []byte
}

// AdminClient speaks the MDS admin API (DESIGN.md: bearer-token HTTP/JSON)
// over HTTPS, trusting only RootCAs (the operator's admin CA) or the CA
// each AdminServer names.
type AdminClient struct {
	RootCAs *x509.CertPool
	// transports by server name: one connection pool per MDS, replaced
	// when the CA it trusts changes.
	mu         sync.Mutex
	transports map[string]adminTransport
}

type adminTransport struct {
	caPEM string // "" for RootCAs
	t     *http.Transport
}

// NewAdminClient returns a client that verifies servers against roots.
func NewAdminClient(roots *x509.CertPool) *AdminClient {
	return &AdminClient{RootCAs: roots, transports: map[string]adminTransport{}}
}

func (a *AdminClient) client(s AdminServer) (*http.Client, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.transports == nil {
		a.transports = map[string]adminTransport{}
	}
	cur, ok := a.transports[s.Name]
	if !ok || cur.caPEM != string(s.CAPEM) {
		roots := a.RootCAs
		if len(s.CAPEM) > 0 {
			var err error
			if roots, err = pki.PoolFromPEM(s.CAPEM); err != nil {
				return nil, fmt.Errorf("admin API %s: CA for %s: %w", s.URL, s.Name, err)
			}
		}
		if ok {
			cur.t.CloseIdleConnections() // verified against the CA no longer trusted
		}
		cur = adminTransport{caPEM: string(s.CAPEM), t: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: roots, ServerName: s.Name, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: AdminCallTimeout,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     ResyncInterval * 2,
		}}
		a.transports[s.Name] = cur
	}
	return &http.Client{Transport: cur.t, Timeout: AdminCallTimeout}, nil
}

// PutDataServers replaces the MDS's data-server list. The call is idempotent:
// the MDS bumps its generation only when the list changes.
func (a *AdminClient) PutDataServers(ctx context.Context, s AdminServer, list []render.DSListEntry) error {
	return a.put(ctx, s, adminDataServersPath, map[string]any{"dataServers": list})
}

// PutAccess replaces the export client rules of one mount of the MDS; they
// apply to the next NFS call, handles obtained before included. Idempotent.
func (a *AdminClient) PutAccess(ctx context.Context, s AdminServer, mount string, rules []render.AccessRule) error {
	if rules == nil {
		rules = []render.AccessRule{} // null would mean "open to all"
	}
	return a.put(ctx, s, adminAccessPath+mount, map[string]any{"access": rules})
}

func (a *AdminClient) put(ctx context.Context, s AdminServer, path string, doc any) error {
	if !strings.HasPrefix(s.URL, "https://") {
		// The bearer token never crosses the network in clear.
		return fmt.Errorf("admin API %s: not https; the operator speaks only TLS to the MDS", s.URL)
	}
	body, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, AdminCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, s.URL+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("admin API %s: %w", s.URL, err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	req.Header.Set("Content-Type", "application/json")
	hc, err := a.client(s)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("PUT %s%s (certificate checked for %s): %w", s.URL, path, s.Name, err)
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(io.LimitReader(resp.Body, AdminResponseBytesMax))
	if resp.StatusCode != http.StatusOK {
		if len(reply) > adminErrorBodyBytesMax {
			reply = reply[:adminErrorBodyBytesMax]
		}
		return fmt.Errorf("PUT %s%s: HTTP %d: %s", s.URL, path, resp.StatusCode, bytes.TrimSpace(reply))
	}
	return nil
}
