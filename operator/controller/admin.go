package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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

// AdminClient speaks the MDS admin API (DESIGN.md: bearer-token HTTP/JSON).
type AdminClient struct {
	HTTP *http.Client
}

// NewAdminClient returns a client with the call timeout applied.
func NewAdminClient() *AdminClient {
	return &AdminClient{HTTP: &http.Client{Timeout: AdminCallTimeout}}
}

// PutDataServers replaces the MDS's data-server list. The call is idempotent:
// the MDS bumps its generation only when the list changes.
func (a *AdminClient) PutDataServers(ctx context.Context, baseURL, token string, list []render.DSListEntry) error {
	return a.put(ctx, baseURL, adminDataServersPath, token, map[string]any{"dataServers": list})
}

// PutAccess replaces the export client rules of one mount of the MDS; they
// apply to the next NFS call, handles obtained before included. Idempotent.
func (a *AdminClient) PutAccess(ctx context.Context, baseURL, token, mount string, rules []render.AccessRule) error {
	if rules == nil {
		rules = []render.AccessRule{} // null would mean "open to all"
	}
	return a.put(ctx, baseURL, adminAccessPath+mount, token, map[string]any{"access": rules})
}

func (a *AdminClient) put(ctx context.Context, baseURL, path, token string, doc any) error {
	body, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, AdminCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, baseURL+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("admin API %s: %w", baseURL, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("PUT %s%s: %w", baseURL, path, err)
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(io.LimitReader(resp.Body, AdminResponseBytesMax))
	if resp.StatusCode != http.StatusOK {
		if len(reply) > adminErrorBodyBytesMax {
			reply = reply[:adminErrorBodyBytesMax]
		}
		return fmt.Errorf("PUT %s%s: HTTP %d: %s", baseURL, path, resp.StatusCode, bytes.TrimSpace(reply))
	}
	return nil
}
