package v1alpha1_test

// Proves the committed generated files (deepcopy and the CRD) match what
// controller-gen produces from the current types: a type change without
// `make generate` fails here. controller-gen comes from $CONTROLLER_GEN, which
// `make test-operator` sets (and checks that this test ran, not skipped).

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestGeneratedFilesUpToDate(t *testing.T) {
	gen := os.Getenv("CONTROLLER_GEN")
	if gen == "" {
		t.Skip("CONTROLLER_GEN not set; `make test-operator` runs this test")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()

	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(gen, args...)
		cmd.Dir = root
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("controller-gen %v: %v\n%s", args, err, errb.String())
		}
		return out.Bytes()
	}

	deepcopy := run("object:headerFile=hack/boilerplate.go.txt", "paths=./api/...", "output:object:stdout")
	assertSame(t, filepath.Join(root, "api/v1alpha1/zz_generated.deepcopy.go"), deepcopy)

	run("crd", "paths=./api/...", "output:crd:artifacts:config="+tmp)
	want, err := os.ReadDir(tmp)
	if err != nil || len(want) == 0 {
		t.Fatalf("controller-gen wrote no CRDs into %s (err %v)", tmp, err)
	}
	for _, e := range want {
		fresh, err := os.ReadFile(filepath.Join(tmp, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		assertSame(t, filepath.Join(root, "config/crd/bases", e.Name()), fresh)
	}
}

func assertSame(t *testing.T, committedPath string, fresh []byte) {
	t.Helper()
	committed, err := os.ReadFile(committedPath)
	if err != nil {
		t.Fatalf("%s: %v (run `make generate`)", committedPath, err)
	}
	if !bytes.Equal(committed, fresh) {
		t.Errorf("%s is stale: run `make generate` and commit the result", committedPath)
	}
}
