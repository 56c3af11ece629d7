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
	body, err := json.Marshal(map[string]any{"dataServers": list})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, AdminCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, baseURL+adminDataServersPath, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("admin API %s: %w", baseURL, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("PUT %s%s: %w", baseURL, adminDataServersPath, err)
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(io.LimitReader(resp.Body, AdminResponseBytesMax))
	if resp.StatusCode != http.StatusOK {
		if len(reply) > adminErrorBodyBytesMax {
			reply = reply[:adminErrorBodyBytesMax]
		}
		return fmt.Errorf("PUT %s%s: HTTP %d: %s", baseURL, adminDataServersPath, resp.StatusCode, bytes.TrimSpace(reply))
	}
	return nil
}
