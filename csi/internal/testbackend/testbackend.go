// Package testbackend gives driver tests an admin API to talk to: the real
// chimerad when $CHIMERAD names its binary (what `make test-csi` does), else the
// in-process fake that follows the same contract. Tests print which one ran.
package testbackend

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chimera-k8s/chimera/csi/internal/fakeadmin"
	"github.com/chimera-k8s/chimera/internal/testutil"
)

const (
	// readyTimeout bounds chimerad's start-up; it starts in milliseconds.
	readyTimeout = 20 * time.Second
	// memfsCapacity bounds the real server's memory in tests.
	memfsCapacity = "256M"
	// Token is the admin token every backend accepts.
	Token = "sanity-token-0123456789"
)

// Backend is a running admin API.
type Backend struct {
	URL   string
	Token string
	// Real is true for chimerad, false for the fake.
	Real bool
	// NFSPort is chimerad's NFS port (0 for the fake, which serves no NFS).
	NFSPort int
	Fake    *fakeadmin.Server
}

// Start starts the backend and registers its shutdown with t.Cleanup.
func Start(t testing.TB) *Backend {
	t.Helper()
	if url := os.Getenv("CHIMERA_ADMIN_URL"); url != "" {
		// An already running chimerad (the guest reaches the host's as 10.0.2.2).
		token := os.Getenv("CHIMERA_ADMIN_TOKEN")
		if token == "" {
			t.Fatal("CHIMERA_ADMIN_URL is set but CHIMERA_ADMIN_TOKEN is empty")
		}
		t.Logf("admin API backend: external chimerad at %s", url)
		return &Backend{URL: url, Token: token, Real: true}
	}
	bin := chimeradBinary(t)
	if bin == "" {
		f, err := fakeadmin.Start(Token)
		if err != nil {
			t.Fatalf("start fake admin API: %v", err)
		}
		t.Cleanup(f.Close)
		t.Logf("admin API backend: in-process fake at %s (set CHIMERAD=<path> to use the real chimerad)", f.URL)
		return &Backend{URL: f.URL, Token: Token, Fake: f}
	}
	return startChimerad(t, bin)
}

// chimeradBinary is $CHIMERAD, or "" when it is unset and the real chimerad
// is not required ($CHIMERA_CSI_REQUIRE_CHIMERAD fails the test instead).
func chimeradBinary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("CHIMERAD")
	if bin == "" && os.Getenv("CHIMERA_CSI_REQUIRE_CHIMERAD") != "" {
		t.Fatalf("CHIMERA_CSI_REQUIRE_CHIMERAD is set but CHIMERAD names no binary")
	}
	return bin
}

// portsTimeout bounds how long chimerad may take to log its listeners.
const portsTimeout = 20 * time.Second

// startChimerad starts one chimerad whose NFS and admin listeners bind port 0
// and reads the ports back from its log (testutil.ChimeradPorts): no port is
// guessed, so no other process can take one first. It returns the backend
// once /healthz answers; an exit or a silent process fails the test.
func startChimerad(t testing.TB, bin string) *Backend {
	t.Helper()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("CHIMERAD=%s: %v", bin, err)
	}
	dir := t.TempDir()
	cfg := map[string]any{
		"common": map[string]any{"log_level": "info"},
		"server": map[string]any{
			"role": "both", "bind": "127.0.0.1", "cores": 1,
			"nfs_port": 0, "mount_port": 0, "portmap_port": 0, "grace_time_s": 0,
		},
		"mounts":  map[string]any{"memfs": map[string]any{"module": "memfs", "path": "/", "capacity_bytes": memfsCapacity}},
		"exports": map[string]any{"/memfs": map[string]any{"path": "/memfs"}},
		"admin":   map[string]any{"bind": "127.0.0.1", "port": 0, "token": Token, "tls": false},
		"metrics": map[string]any{"enabled": false},
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	cfgPath := filepath.Join(dir, "chimerad.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "chimerad.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	// done is closed once the process is reaped; waitErr is valid after
	// that. Both the readiness loop and the cleanup may look at it, so it is
	// a closed channel, not a value only one reader can take.
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			cmd.Process.Signal(os.Interrupt)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				cmd.Process.Kill()
				<-done
			}
		}
		logFile.Close()
	})
	ports, err := testutil.ChimeradPorts(logPath, []string{"nfs", "admin"}, done, portsTimeout)
	if err != nil {
		t.Fatalf("%v; log:\n%s", err, tail(logPath))
	}
	nfsPort := ports["nfs"]
	url := fmt.Sprintf("http://127.0.0.1:%d", ports["admin"])
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-done:
			t.Fatalf("chimerad exited (%v) before its admin API answered; log:\n%s", waitErr, tail(logPath))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("chimerad admin API at %s not healthy after %v; log:\n%s", url, readyTimeout, tail(logPath))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("admin API backend: real chimerad %s at %s (NFS port %d)", bin, url, nfsPort)
	return &Backend{URL: url, Token: Token, Real: true, NFSPort: nfsPort}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(bytes.TrimSpace(b))
}

// Describe names the backend for test logs.
func (b *Backend) Describe() string {
	if b.Real {
		return "chimerad " + strings.TrimPrefix(b.URL, "http://")
	}
	return "fake " + strings.TrimPrefix(b.URL, "http://")
}
