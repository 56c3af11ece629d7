package driver

// Proves that every sample StorageClass shipped in config/samples is one the
// driver accepts: it names this driver, its parameters pass the same parser
// CreateVolume uses, and its mountOptions pass the node's option checks (for
// the kernel client, or none for a mountMode sidecar class). A
// sample that drifts from the driver fails here, not in a user's cluster.

import (
	"os"
	"path/filepath"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/yaml"
)

func TestSampleStorageClasses(t *testing.T) {
	files, err := filepath.Glob("../../../config/samples/storageclass*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no sample StorageClasses found (%v)", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var sc storagev1.StorageClass
		if err := yaml.UnmarshalStrict(b, &sc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if sc.Provisioner != DriverName {
			t.Errorf("%s: provisioner %q, want %q", f, sc.Provisioner, DriverName)
		}
		p, err := parseParameters(sc.Parameters, "")
		if err != nil {
			t.Errorf("%s: parameters rejected: %v", f, err)
			continue
		}
		spec, err := parseVolumeContext(p.volumeContext("/memfs/volumes/v1"))
		if err != nil {
			t.Errorf("%s: volume context rejected: %v", f, err)
			continue
		}
		if spec.sidecar {
			if err := checkSidecarCapability(sc.MountOptions); err != nil {
				t.Errorf("%s: mountOptions rejected: %v", f, err)
			}
		} else if _, err := buildMountOptions(spec, sc.MountOptions, false); err != nil {
			t.Errorf("%s: mountOptions rejected: %v", f, err)
		}
		if sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
			t.Errorf("%s: allowVolumeExpansion should be true (the driver expands online)", f)
		}
		t.Logf("%s: %s ok (%s, transport %s, port %d)", f, sc.Name, p.adminEndpoint, p.transport, p.port)
	}
}
