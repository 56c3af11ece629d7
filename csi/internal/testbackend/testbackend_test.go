package testbackend

// Proves that a chimerad which exits before its admin API answers (another
// process took one of its ports between the probe and the bind) is retried on
// fresh ports, and that the exited attempt's cleanup does not wait forever on
// a process that is already gone (it once did: the test binary hung until go
// test's 10-minute alarm).

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEarlyExitIsRetriedOnFreshPorts(t *testing.T) {
	chimerad := chimeradBinary(t)
	if chimerad == "" {
		t.Skip("needs $CHIMERAD (make test-csi sets it)")
	}
	dir := t.TempDir()
	count := filepath.Join(dir, "attempts")
	// The wrapper fails its first start the way chimerad does when its port
	// is taken, then runs the real binary.
	wrapper := filepath.Join(dir, "chimerad-flaky")
	script := "#!/bin/sh\n" +
		"echo x >> '" + count + "'\n" +
		"if [ \"$(wc -l < '" + count + "')\" -lt 2 ]; then echo 'chimerad: admin.port: address already in use' >&2; exit 1; fi\n" +
		"exec '" + chimerad + "' \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b := startChimerad(t, wrapper)
	if !b.Real || b.NFSPort == 0 {
		t.Fatalf("backend after retry: %+v", b)
	}
	got, err := os.ReadFile(count)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(got), "x"); n != 2 {
		t.Fatalf("chimerad was started %d times, want 2 (one early exit, one retry)", n)
	}
}
