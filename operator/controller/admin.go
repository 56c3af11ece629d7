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
// pod IP, which no certificate names), and the bearer token.
type AdminServer struct {
	URL   string
	Name  string
	Token string
}

// AdminClient speaks the MDS admin API (DESIGN.md: bearer-token HTTP/JSON)
// over HTTPS, trusting only RootCAs (the operator's admin CA).
type AdminClient struct {
	RootCAs *x509.CertPool
	// transports by server name: one connection pool per MDS.
	mu         sync.Mutex
	transports map[string]*http.Transport
}

// NewAdminClient returns a client that verifies servers against roots.
func NewAdminClient(roots *x509.CertPool) *AdminClient {
	return &AdminClient{RootCAs: roots, transports: map[string]*http.Transport{}}
}

func (a *AdminClient) client(serverName string) *http.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.transports == nil {
		a.transports = map[string]*http.Transport{}
	}
	t, ok := a.transports[serverName]
	if !ok {
		t = &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: a.RootCAs, ServerName: serverName, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: AdminCallTimeout,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     ResyncInterval * 2,
		}
		a.transports[serverName] = t
	}
	return &http.Client{Transport: t, Timeout: AdminCallTimeout}
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
	resp, err := a.client(s.Name).Do(req)
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
