package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// The rollout's admin API calls. They live apart from admin.go (the PUTs
// every reconcile sends) and only add methods to AdminClient.

const (
	adminClusterPath = "/api/v1/cluster"
	// adminClusterBytesMax bounds GET /api/v1/cluster's answer: ~300 bytes
	// per data server, 256 of them at most, plus the rest.
	adminClusterBytesMax = 1 << 20
)

// MDSDataServer is one data server as the MDS reports it in
// GET /api/v1/cluster (pnfs.dataServers).
type MDSDataServer struct {
	Name     string `json:"name"`
	Ready    bool   `json:"ready"`
	Draining bool   `json:"draining"`
	Healthy  bool   `json:"healthy"`
	// LayoutsHeld counts the layout states clients hold that name the DS;
	// nil from a chimerad that predates the field (an MDS not yet rolled).
	LayoutsHeld *uint64 `json:"layoutsHeld"`
	// StaleCopies counts mirror copies on the DS that missed writes and are
	// not resynced yet; nil from a chimerad that predates resync.
	StaleCopies *uint64 `json:"staleCopies"`
}

// GraceRemaining reads how long the MDS's NFSv4 grace period still runs
// (nil: a chimerad that predates the field, or no NFSv4 state).
func (a *AdminClient) GraceRemaining(ctx context.Context, s AdminServer) (*time.Duration, error) {
	var doc struct {
		GraceRemainingMs *uint64 `json:"graceRemainingMs"`
	}
	if err := a.getJSON(ctx, s, adminClusterPath, &doc); err != nil {
		return nil, err
	}
	if doc.GraceRemainingMs == nil {
		return nil, nil
	}
	d := time.Duration(*doc.GraceRemainingMs) * time.Millisecond
	return &d, nil
}

// DataServerStates reads the MDS's view of every listed data server.
func (a *AdminClient) DataServerStates(ctx context.Context, s AdminServer) (map[string]MDSDataServer, error) {
	baseURL := s.URL
	var doc struct {
		PNFS *struct {
			DataServers []MDSDataServer `json:"dataServers"`
		} `json:"pnfs"`
	}
	if err := a.getJSON(ctx, s, adminClusterPath, &doc); err != nil {
		return nil, err
	}
	if doc.PNFS == nil {
		return nil, fmt.Errorf("GET %s%s: no pnfs section (is the MDS's pNFS enabled?)", baseURL, adminClusterPath)
	}
	out := make(map[string]MDSDataServer, len(doc.PNFS.DataServers))
	for _, d := range doc.PNFS.DataServers {
		out[d.Name] = d
	}
	return out, nil
}

func (a *AdminClient) getJSON(ctx context.Context, s AdminServer, path string, into any) error {
	baseURL, token := s.URL, s.Token
	if !strings.HasPrefix(baseURL, "https://") {
		// The bearer token never crosses the network in clear.
		return fmt.Errorf("admin API %s: not https; the operator speaks only TLS to the MDS", baseURL)
	}
	ctx, cancel := context.WithTimeout(ctx, AdminCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+path, nil)
	if err != nil {
		return fmt.Errorf("admin API %s: %w", baseURL, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	hc, err := a.client(s)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s%s (certificate checked for %s): %w", baseURL, path, s.Name, err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, adminClusterBytesMax+1))
	if err != nil {
		return fmt.Errorf("GET %s%s: read answer: %w", baseURL, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		if len(reply) > adminErrorBodyBytesMax {
			reply = reply[:adminErrorBodyBytesMax]
		}
		return fmt.Errorf("GET %s%s: HTTP %d: %s", baseURL, path, resp.StatusCode, bytes.TrimSpace(reply))
	}
	if len(reply) > adminClusterBytesMax {
		return fmt.Errorf("GET %s%s: answer larger than %d bytes", baseURL, path, adminClusterBytesMax)
	}
	if err := json.Unmarshal(reply, into); err != nil {
		return fmt.Errorf("GET %s%s: answer is not the expected JSON: %w", baseURL, path, err)
	}
	return nil
}
