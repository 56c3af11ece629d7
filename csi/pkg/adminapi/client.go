// Package adminapi is the CSI controller's client for the chimerad admin API
// (DESIGN.md, "Admin API"): volumes are created, listed, expanded and deleted over
// HTTP/JSON with a bearer token. It knows nothing of CSI or gRPC; the driver maps
// its errors to gRPC codes.
package adminapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const (
	// responseBytesMax bounds what we read from the server: a hostile or broken
	// server must not make the controller allocate without limit.
	responseBytesMax = 8 << 20
	// errorMessageBytesMax bounds the server text we copy into a gRPC message.
	errorMessageBytesMax = 512
	// RequestTimeoutDefault is the per-request deadline when the caller's context
	// carries none; the admin API is a control path and answers in milliseconds.
	RequestTimeoutDefault = 30 * time.Second
)

// Volume is the admin API's view of one volume.
type Volume struct {
	ID            string `json:"id"`
	Name          string `json:"name,omitempty"`
	ExportPath    string `json:"exportPath"`
	CapacityBytes int64  `json:"capacityBytes"`
	UsedBytes     int64  `json:"usedBytes,omitempty"`
	// Access is the volume's own client rules (nil: its export's alone).
	Access []AccessRule `json:"access,omitempty"`
}

// AccessRule is one client rule, in the syntax of chimerad's export rules
// (dataplane/chimerad/CONFIG.md, exports.<name>.access). A volume's rules
// narrow its export's: they can take rights away, never add any.
type AccessRule struct {
	Clients []string `json:"clients"`
	// AccessType: rw, ro or none.
	AccessType string `json:"access_type"`
	// Squash: root_squash, all_squash or no_root_squash.
	Squash       string `json:"squash"`
	AnonymousUID uint32 `json:"anonymous_uid"`
	AnonymousGID uint32 `json:"anonymous_gid"`
}

// Error is a non-2xx answer from the admin API.
type Error struct {
	StatusCode int
	Message    string
	Op         string
}

func (e *Error) Error() string {
	return fmt.Sprintf("admin API %s: HTTP %d: %s", e.Op, e.StatusCode, e.Message)
}

// StatusOf returns the HTTP status of an admin API error, or 0 when err is not
// an answer from the server (connection refused, timeout, bad JSON).
func StatusOf(err error) int {
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return apiErr.StatusCode
	}
	return 0
}

// Client talks to one chimerad admin endpoint.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// TLS says how an https endpoint's certificate is verified.
type TLS struct {
	// RootCAs: the CAs trusted (the operator's admin CA bundle); nil means
	// the system's roots.
	RootCAs *x509.CertPool
	// ServerName the certificate must carry; empty means the endpoint's
	// host.
	ServerName string
}

// New validates endpoint (http or https URL with a host, no path beyond "/")
// and returns a client that authenticates with token. An https endpoint's
// certificate is verified as t says (nil: system roots, endpoint host).
func New(endpoint, token string, t *TLS) (*Client, error) {
	u, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: RequestTimeoutDefault}
	if u.Scheme == "https" && t != nil {
		hc.Transport = &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: t.RootCAs, ServerName: t.ServerName, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: RequestTimeoutDefault,
			// A client lives for one CSI call: keep no idle connections.
			DisableKeepAlives: true,
		}
	}
	return &Client{base: u, token: token, http: hc}, nil
}

// LoadCABundle reads a PEM CA bundle (the operator's admin CA, mounted from
// its ConfigMap) into a pool; the error names the file and the problem.
func LoadCABundle(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("admin CA bundle: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("admin CA bundle %s: no PEM certificate in it", path)
	}
	return pool, nil
}

// ServerCAFileSuffix: beside the operator's CA bundle (its admin CA
// ConfigMap, mounted as a directory), the operator publishes the CA of each
// cluster whose admin certificate cert-manager issues, as the file
// "<server name>.ca.crt" (operator/render.CABundleKey).
const ServerCAFileSuffix = ".ca.crt"

// CABundleFor is the CA bundle a server named serverName is verified
// against: that server's own file beside caFile (ServerCAFileSuffix) when
// there is one, so a cluster's issuer is trusted for its own name only;
// else caFile (the operator's admin CA).
func CABundleFor(caFile, serverName string) string {
	if serverName == "" || strings.ContainsAny(serverName, `/\`) || strings.HasPrefix(serverName, ".") {
		return caFile
	}
	p := filepath.Join(filepath.Dir(caFile), serverName+ServerCAFileSuffix)
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return p
	}
	return caFile
}

// ParseEndpoint checks an admin endpoint URL and names what is wrong with it.
func ParseEndpoint(endpoint string) (*url.URL, error) {
	if endpoint == "" {
		return nil, errors.New("admin endpoint is empty")
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("admin endpoint %q is not a URL: %v", endpoint, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("admin endpoint %q: scheme must be http or https, got %q", endpoint, u.Scheme)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("admin endpoint %q has no host", endpoint)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("admin endpoint %q must be scheme://host:port only (no path, query or credentials)", endpoint)
	}
	u.Path = ""
	return u, nil
}

// CreateVolume is idempotent by name on the server: the same name, capacity
// and rules returns the existing volume; the same name with another capacity
// or other rules is HTTP 409. access nil sends none (the export's rules
// alone apply).
func (c *Client) CreateVolume(ctx context.Context, name string, capacityBytes int64, access []AccessRule) (*Volume, error) {
	body := map[string]any{"name": name, "capacityBytes": capacityBytes}
	if access != nil {
		body["access"] = access
	}
	var v Volume
	if err := c.do(ctx, "create volume", http.MethodPost, "/api/v1/volumes", body, &v); err != nil {
		return nil, err
	}
	return &v, checkVolume(&v, "create volume")
}

// GetVolume returns one volume; a missing one is an *Error with 404.
func (c *Client) GetVolume(ctx context.Context, id string) (*Volume, error) {
	var v Volume
	if err := c.do(ctx, "get volume", http.MethodGet, "/api/v1/volumes/"+url.PathEscape(id), nil, &v); err != nil {
		return nil, err
	}
	return &v, checkVolume(&v, "get volume")
}

// ListVolumes returns every volume. The server may answer a bare JSON array or
// an object {"volumes": [...]}; both are accepted.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var raw json.RawMessage
	if err := c.do(ctx, "list volumes", http.MethodGet, "/api/v1/volumes", nil, &raw); err != nil {
		return nil, err
	}
	var vols []Volume
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		if err := json.Unmarshal(trimmed, &vols); err != nil {
			return nil, fmt.Errorf("admin API list volumes: bad JSON: %v", err)
		}
	} else {
		var wrapped struct {
			Volumes []Volume `json:"volumes"`
		}
		if err := json.Unmarshal(trimmed, &wrapped); err != nil {
			return nil, fmt.Errorf("admin API list volumes: bad JSON: %v", err)
		}
		vols = wrapped.Volumes
	}
	for i := range vols {
		if err := checkVolume(&vols[i], "list volumes"); err != nil {
			return nil, err
		}
	}
	return vols, nil
}

// DeleteVolume removes a volume; the server answers success for one already gone.
func (c *Client) DeleteVolume(ctx context.Context, id string) error {
	return c.do(ctx, "delete volume", http.MethodDelete, "/api/v1/volumes/"+url.PathEscape(id), nil, nil)
}

// ExpandVolume sets a volume's capacity (the server refuses to shrink below use).
func (c *Client) ExpandVolume(ctx context.Context, id string, capacityBytes int64) (*Volume, error) {
	body := map[string]any{"capacityBytes": capacityBytes}
	var v Volume
	if err := c.do(ctx, "expand volume", http.MethodPatch, "/api/v1/volumes/"+url.PathEscape(id), body, &v); err != nil {
		return nil, err
	}
	return &v, checkVolume(&v, "expand volume")
}

// Cluster returns the server's cluster document (GET /api/v1/cluster) as
// generic JSON: the driver reads only the few fields it needs.
func (c *Client) Cluster(ctx context.Context) (map[string]any, error) {
	var doc map[string]any
	if err := c.do(ctx, "get cluster", http.MethodGet, "/api/v1/cluster", nil, &doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// checkVolume refuses answers the driver could not use safely.
func checkVolume(v *Volume, op string) error {
	if v.ID == "" {
		return fmt.Errorf("admin API %s: answer has no volume id", op)
	}
	if v.CapacityBytes < 0 {
		return fmt.Errorf("admin API %s: volume %q has negative capacityBytes %d", op, v.ID, v.CapacityBytes)
	}
	return nil
}

func (c *Client) do(ctx context.Context, op, method, path string, in, out any) error {
	var reqBody io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("admin API %s: encode request: %v", op, err)
		}
		reqBody = bytes.NewReader(b)
	}
	u := *c.base
	u.Path = path
	req, err := http.NewRequestWithContext(ctx, method, u.String(), reqBody)
	if err != nil {
		return fmt.Errorf("admin API %s: %v", op, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin API %s: %v", op, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, responseBytesMax+1))
	if err != nil {
		return fmt.Errorf("admin API %s: read answer: %v", op, err)
	}
	if len(body) > responseBytesMax {
		return fmt.Errorf("admin API %s: answer larger than %d bytes", op, responseBytesMax)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &Error{StatusCode: resp.StatusCode, Message: errorMessage(body, resp.Status), Op: op}
	}
	if out == nil || len(bytes.TrimSpace(body)) == 0 {
		if out != nil {
			return fmt.Errorf("admin API %s: empty answer", op)
		}
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("admin API %s: bad JSON answer: %v", op, err)
	}
	return nil
}

// errorMessage extracts the server's explanation: {"error": "..."} or
// {"message": "..."} or plain text, truncated so a hostile server cannot flood logs.
func errorMessage(body []byte, status string) string {
	var doc map[string]any
	msg := ""
	if json.Unmarshal(body, &doc) == nil {
		for _, key := range []string{"error", "message"} {
			if s, ok := doc[key].(string); ok && s != "" {
				msg = s
				break
			}
		}
	}
	if msg == "" {
		msg = strings.TrimSpace(string(body))
	}
	if msg == "" {
		msg = status
	}
	if len(msg) > errorMessageBytesMax {
		msg = msg[:errorMessageBytesMax] + "..."
	}
	return strings.ToValidUTF8(msg, "?")
}
