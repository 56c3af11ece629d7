package render

import (
	"strconv"
	"strings"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Backend nvme: what chimerad cannot know from a static config is completed
// inside the pod, at start, by StartScript (the ConfigMap's start.sh, run by
// /bin/sh from the chimerad image as the container's command):
//
//   - a DS bound to a device plugin gets its devices' PCI addresses from the
//     plugin in the environment variable PCIDEVICE_<RESOURCE>; chimerad does
//     not read the environment, so the script writes them into the config in
//     place of DevicesPlaceholder, as vfio devices;
//   - the MDS keeps its namespace in a diskfs image file on its metadata
//     volume (spec.metadataServer.storage), and a DS with
//     storage.nvme.volumeClaim its data on its own volume; the script creates the file the
//     first time (fallocate, else a sparse truncate) and asks chimerad to
//     format it (initialize) while its first MiB is still all zeros, i.e. no
//     format ever reached it — a crash between creating and formatting is
//     then retried, and a formatted image is never formatted again.
//
// The completed config is written to RunDir (an emptyDir: the root file
// system stays read-only), then the script execs chimerad on it. memfs pods
// run chimerad directly on the ConfigMap's file, as before.
const (
	// ConfigKeyStart is the ConfigMap key of StartScript.
	ConfigKeyStart = "start.sh"
	// DevicesPlaceholder stands for the devices array in a DS config whose
	// devices come from a device plugin.
	DevicesPlaceholder = "@PCIDEVICES@"
	// RunDir holds the completed config inside the pod.
	RunDir = "/run/chimera"
	// MetadataDir is where the MDS's metadata volume is mounted, and
	// MetadataImagePath the diskfs image file on it.
	MetadataDir       = "/var/lib/chimera/metadata"
	MetadataImagePath = MetadataDir + "/diskfs.img"
	// MetadataClaimName is the MDS StatefulSet's volume claim template; the
	// claim of pod <cluster>-mds-0 is metadata-<cluster>-mds-0.
	MetadataClaimName = "metadata"
	// DataDir is where a DS's own volume (storage.nvme.volumeClaim) is
	// mounted, and DataImagePath the diskfs image file on it; its claim
	// template is DataClaimName (claim data-<cluster>-ds-<n>).
	DataDir       = "/var/lib/chimera/data"
	DataImagePath = DataDir + "/diskfs.img"
	DataClaimName = "data"
	// MetadataImagePercent of the claim's size goes to the image; the rest
	// is left to the volume's file system (its journal, inode tables and
	// reserved blocks).
	MetadataImagePercent = 90

	// Environment of the start script.
	EnvPCIDeviceVar = "CHIMERA_PCIDEVICE_ENV"
	EnvImageFile    = "CHIMERA_IMAGE_FILE"
	EnvImageBytes   = "CHIMERA_IMAGE_BYTES"
)

// StartScript completes the config ($1, the ConfigMap's file) into $2 and
// execs chimerad on it. POSIX sh and coreutils/util-linux only (the chimerad
// image is debian-slim). Every failure names what is wrong and exits 1
// before chimerad starts, so the pod's log and restart count tell the story.
const StartScript = `#!/bin/sh
# Completes chimerad's config for this pod and starts chimerad (ChimeraCluster
# storage.backend nvme; written by the chimera operator, operator/render/start.go).
set -euf
in=$1
out=$2
tmp=$out.tmp
cp "$in" "$tmp"
if [ -n "${CHIMERA_PCIDEVICE_ENV:-}" ]; then
  list=$(printenv "$CHIMERA_PCIDEVICE_ENV" || true)
  if [ -z "$list" ]; then
    echo "chimera-start: $CHIMERA_PCIDEVICE_ENV is unset or empty: the device plugin gave this container no devices" >&2
    exit 1
  fi
  devs=""
  IFS=,
  for a in $list; do
    case "$a" in
      ""|*[!0-9a-fA-F:.]*) echo "chimera-start: $CHIMERA_PCIDEVICE_ENV: \"$a\" is not a PCI address" >&2; exit 1 ;;
    esac
    devs="$devs${devs:+, }{\"type\": \"vfio\", \"path\": \"$a\"}"
  done
  unset IFS
  sed "s|\"@PCIDEVICES@\"|[$devs]|" "$tmp" > "$tmp.2"
  mv "$tmp.2" "$tmp"
fi
if grep -q '"@PCIDEVICES@"' "$tmp"; then
  echo "chimera-start: the config's devices come from a device plugin but CHIMERA_PCIDEVICE_ENV is not set" >&2
  exit 1
fi
if [ -n "${CHIMERA_IMAGE_FILE:-}" ]; then
  img=$CHIMERA_IMAGE_FILE
  if [ ! -e "$img" ]; then
    bytes=${CHIMERA_IMAGE_BYTES:?CHIMERA_IMAGE_BYTES must be set with CHIMERA_IMAGE_FILE}
    fallocate -l "$bytes" "$img.new" 2>/dev/null || truncate -s "$bytes" "$img.new"
    mv "$img.new" "$img"
    echo "chimera-start: created the image $img ($bytes bytes)" >&2
  fi
  if [ ! -f "$img" ] || ! head -c 1048576 "$img" > /dev/null; then
    echo "chimera-start: $img is not a readable regular file" >&2
    exit 1
  fi
  # Formatting destroys: only an image whose first MiB reads back all zeros.
  if [ "$(head -c 1048576 "$img" | tr -d '\000' | head -c 1 | wc -c)" -eq 0 ]; then
    echo "chimera-start: $img was never formatted: chimerad formats it (initialize)" >&2
    sed 's|"initialize": false|"initialize": true|' "$tmp" > "$tmp.2"
    mv "$tmp.2" "$tmp"
  fi
fi
mv "$tmp" "$out"
exec chimerad --config "$out"
`

// PCIDeviceEnv is the variable the SR-IOV network device plugin sets for a
// resource: PCIDEVICE_ and the resource name upper-cased, with `.`, `/` and
// `-` as `_` (chimera.io/nvme → PCIDEVICE_CHIMERA_IO_NVME).
func PCIDeviceEnv(resourceName string) string {
	r := strings.NewReplacer(".", "_", "/", "_", "-", "_")
	return "PCIDEVICE_" + strings.ToUpper(r.Replace(resourceName))
}

// MetadataImageBytes is the image file's size for a claim of size q:
// MetadataImagePercent of it, rounded down to whole MiB.
func MetadataImageBytes(q resource.Quantity) int64 {
	const mib = 1 << 20
	return q.Value() / mib * MetadataImagePercent / 100 * mib
}

// usesStartScript: backend nvme pods start through StartScript.
func usesStartScript(c *chimerav1.ChimeraCluster) bool {
	return c.Spec.Storage.Backend == chimerav1.BackendNVMe
}

// startEnv is the start script's environment for one component.
func startEnv(c *chimerav1.ChimeraCluster, component string) []corev1.EnvVar {
	if component == ComponentMDS {
		env := []corev1.EnvVar{{Name: EnvImageFile, Value: MetadataImagePath}}
		if st := c.Spec.MetadataServer.Storage; st != nil {
			env = append(env, corev1.EnvVar{Name: EnvImageBytes, Value: strconv.FormatInt(MetadataImageBytes(st.Size), 10)})
		}
		return env
	}
	if n := c.Spec.Storage.NVMe; n != nil && n.ResourceName != "" {
		return []corev1.EnvVar{{Name: EnvPCIDeviceVar, Value: PCIDeviceEnv(n.ResourceName)}}
	}
	if v := dataVolumeClaim(c); v != nil {
		return []corev1.EnvVar{{Name: EnvImageFile, Value: DataImagePath}, {Name: EnvImageBytes, Value: strconv.FormatInt(MetadataImageBytes(v.Size), 10)}}
	}
	return nil
}

// dataVolumeClaim is storage.nvme.volumeClaim of a backend-nvme cluster, or nil.
func dataVolumeClaim(c *chimerav1.ChimeraCluster) *chimerav1.DataVolumeClaimSpec {
	if c.Spec.Storage.Backend != chimerav1.BackendNVMe || c.Spec.Storage.NVMe == nil {
		return nil
	}
	return c.Spec.Storage.NVMe.VolumeClaim
}
