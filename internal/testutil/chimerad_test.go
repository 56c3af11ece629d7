package testutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Proves ChimeradPorts reads the ports of the services asked from chimerad's
// log lines (other lines, other services and a v6 address included), waits
// for lines still to come, and fails — naming what is missing — when the
// process exits first, when the time is up, or when an address has no port.
func TestChimeradPorts(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "chimerad.log")
	lines := `not json
{"level":"info","msg":"listening","service":"nfs","addr":"127.0.0.1:40001","cores":1}
{"level":"info","msg":"listening","service":"portmap","addr":"127.0.0.1:40002"}
{"level":"info","msg":"config","service":"admin","addr":"127.0.0.1:1"}
`
	if err := os.WriteFile(log, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	running := make(chan struct{})
	go func() {
		time.Sleep(200 * time.Millisecond)
		f, _ := os.OpenFile(log, os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString(`{"level":"info","msg":"listening","service":"admin","addr":"[::1]:40003"}` + "\n")
		f.Close()
	}()
	got, err := ChimeradPorts(log, []string{"nfs", "admin"}, running, 5*time.Second)
	if err != nil || got["nfs"] != 40001 || got["admin"] != 40003 || len(got) != 2 {
		t.Fatalf("got %v, %v; want nfs 40001, admin 40003", got, err)
	}

	exited := make(chan struct{})
	close(exited)
	if _, err := ChimeradPorts(log, []string{"nfs", "metrics"}, exited, 5*time.Second); err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "metrics") {
		t.Errorf("exited process: err %v, want one naming the exit and metrics", err)
	}
	start := time.Now()
	if _, err := ChimeradPorts(log, []string{"metrics"}, running, 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "within") {
		t.Errorf("timeout: err %v", err)
	} else if time.Since(start) > 3*time.Second {
		t.Errorf("timeout of 300ms took %v", time.Since(start))
	}
	bad := filepath.Join(dir, "bad.log")
	os.WriteFile(bad, []byte(`{"msg":"listening","service":"nfs","addr":"127.0.0.1"}`+"\n"), 0o600)
	if _, err := ChimeradPorts(bad, []string{"nfs"}, exited, time.Second); err == nil {
		t.Error("an address without a port was accepted")
	}
}
