package testbackend

// Proves that the real chimerad backend binds port 0 and reads its ports back
// (its admin API and NFS listener answer on the ports it reported), and that a
// chimerad which exits before reporting them fails the test at once, with its
// log, instead of being waited for — and that the failed start's cleanup does
// not wait forever on a process that is already gone (it once did: the test
// binary hung until go test's 10-minute alarm).

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestChimeradPortsAreReadBack(t *testing.T) {
	chimerad := chimeradBinary(t)
	if chimerad == "" {
		t.Skip("needs $CHIMERAD (make test-csi sets it)")
	}
	b := startChimerad(t, chimerad)
	if !b.Real || b.NFSPort == 0 || strings.HasSuffix(b.URL, ":0") {
		t.Fatalf("backend %+v", b)
	}
	resp, err := http.Get(b.URL + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("admin API at the reported port: %v %v", resp, err)
	}
	resp.Body.Close()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", b.NFSPort), 5*time.Second)
	if err != nil {
		t.Fatalf("NFS listener at the reported port %d: %v", b.NFSPort, err)
	}
	c.Close()
}

// fatalRecorder stands in for the test's testing.TB so a failing start can
// be observed: Fatalf records and ends the goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg      string
	cleanups []func()
}

func (r *fatalRecorder) Helper()             {}
func (r *fatalRecorder) Logf(string, ...any) {}
func (r *fatalRecorder) Cleanup(f func())    { r.cleanups = append(r.cleanups, f) }
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestEarlyExitFailsAtOnceWithTheLog(t *testing.T) {
	dir := t.TempDir()
	// Exits the way chimerad does when it cannot start.
	wrapper := filepath.Join(dir, "chimerad-broken")
	script := "#!/bin/sh\necho 'chimerad: admin.port: address already in use' >&2\nexit 1\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &fatalRecorder{TB: t}
	start := time.Now()
	done := make(chan *Backend, 1)
	go func() {
		defer close(done)
		done <- startChimerad(r, wrapper)
	}()
	b, ok := <-done
	if ok && b != nil {
		t.Fatalf("a process that exited gave a backend: %+v", b)
	}
	if !strings.Contains(r.msg, "exited") || !strings.Contains(r.msg, "address already in use") {
		t.Fatalf("failure %q does not name the exit and carry the log", r.msg)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the failed start took %v (waited for a dead process?)", took)
	}
	cleaned := make(chan struct{})
	go func() {
		for i := len(r.cleanups) - 1; i >= 0; i-- {
			r.cleanups[i]()
		}
		close(cleaned)
	}()
	select {
	case <-cleaned:
	case <-time.After(10 * time.Second):
		t.Fatal("cleanup of the exited chimerad hangs")
	}
}
