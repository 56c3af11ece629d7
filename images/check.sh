#!/usr/bin/env bash
# What this proves: every image `images/build.sh all` made is usable as shipped.
# For each of the six images it checks that the image is in buildah's store,
# that its OCI archive in $CACHE/images is a valid OCI layout (oci-layout, an
# index.json naming the image, every manifest/config/layer blob present with the
# digest it claims), that the image's own ENTRYPOINT runs inside the image
# (--version or --help; chimerad also checks configs and serves on loopback,
# and the dataplane image runs chimera-fuse --help),
# the users (operator non-root), that runtime images carry
# no compiler, the CSI image's mount.nfs, mount and /etc/protocols, that the pause binary really
# sleeps until SIGTERM and then exits 0, and that sizes stay under named limits.
# Any failure names the image and exits non-zero; the last line is a summary.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
OUT=${IMAGES_OUT:-$CACHE/images}
export CONTAINERS_CONF="$OUT/containers.conf"
[ -r "$CONTAINERS_CONF" ] || { echo "test-images: $CONTAINERS_CONF missing: run images/build.sh first" >&2; exit 1; }

# Size limits (the image's filesystem, du of the mounted image, MB). Measured sizes
# are printed; these catch a compiler or a build tree slipping into an image.
declare -A SIZE_MB_MAX=([operator]=160 [csi]=200 [dataplane]=130 [pause]=5 [fio]=220 [fio-engine]=140)
declare -A IMAGE=(
  [operator]=localhost/chimera-operator:dev [csi]=localhost/chimera-csi:dev [dataplane]=localhost/chimerad:dev
  [pause]=localhost/pause:3.10 [fio]=localhost/chimera-fio:dev [fio-engine]=localhost/chimera-fio-engine:dev
)
declare -A ARCHIVE=(
  [operator]=chimera-operator.tar [csi]=chimera-csi.tar [dataplane]=chimerad.tar
  [pause]=pause.tar [fio]=chimera-fio.tar [fio-engine]=chimera-fio-engine.tar
)
ORDER=(operator csi dataplane pause fio fio-engine)
# The pause binary must still be running after this long, then exit 0 on SIGTERM.
PAUSE_ALIVE_S=2
PAUSE_EXIT_S_MAX=5

failures=()
summary=()
current=""
fail() { echo "test-images: FAIL ${IMAGE[$current]}: $*" >&2; failures+=("${IMAGE[$current]}: $*"); }
ok() { echo "test-images: ok   ${IMAGE[$current]}: $*"; }

CTR=""
cleanup() { [ -z "$CTR" ] || buildah rm "$CTR" >/dev/null 2>&1 || true; CTR=""; }
trap cleanup EXIT

# Runs a command inside a fresh container of the current image (as the image's user).
in_image() { timeout 60 buildah run --network none "$CTR" -- "$@"; }

# An extracted OCI archive: oci-layout, index.json naming $2, and manifest,
# config and every layer present with the size and digest the descriptors claim.
validate_oci_layout() {
  python3 - "$1" "$2" <<'EOF'
import hashlib, json, os, sys
d, img = sys.argv[1], sys.argv[2]
def blob(desc):
    algo, hexd = desc["digest"].split(":", 1)
    p = os.path.join(d, "blobs", algo, hexd)
    data = open(p, "rb").read()
    assert hashlib.new(algo, data).hexdigest() == hexd, f"blob {desc['digest']} content does not match its digest"
    assert len(data) == desc["size"], f"blob {desc['digest']} size {len(data)} != {desc['size']}"
    return data
layout = json.load(open(os.path.join(d, "oci-layout")))
assert layout.get("imageLayoutVersion") == "1.0.0", f"oci-layout: {layout}"
index = json.load(open(os.path.join(d, "index.json")))
names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index["manifests"]]
assert img in names, f"index.json names {names}, not {img}"
m = index["manifests"][names.index(img)]
manifest = json.loads(blob(m))
blob(manifest["config"])
assert manifest["layers"], "manifest has no layers"
for layer in manifest["layers"]:
    blob(layer)
print(f"{len(manifest['layers'])} layer(s), every blob matches its digest")
EOF
}

# The validator itself must reject what it exists to catch: a blob whose content
# no longer matches its digest, and an archive naming another image.
check_validator_rejects_bad_archives() {
  local archive=$1 img=$2 dir layer accepted=0
  dir=$(mktemp -d)
  tar -C "$dir" -xf "$archive"
  if validate_oci_layout "$dir" "localhost/not-this-image:dev" >/dev/null 2>&1; then
    fail "OCI validator accepted $archive under a name it does not carry"; accepted=1
  fi
  layer=$(find "$dir/blobs" -type f -size +1k | head -1)
  printf 'x' >> "$layer"
  if validate_oci_layout "$dir" "$img" >/dev/null 2>&1; then
    fail "OCI validator accepted a corrupted blob in $archive"; accepted=1
  fi
  [ "$accepted" -eq 1 ] || ok "OCI validator rejects a wrong name and a corrupted blob"
  rm -rf "$dir"
}

# index.json -> manifest -> config + layers, each blob present with its digest.
check_archive() {
  local archive=$1 img=$2 dir
  [ -s "$archive" ] || { fail "archive $archive missing"; return; }
  dir=$(mktemp -d)
  if ! tar -C "$dir" -xf "$archive"; then fail "$archive is not a tar"; rm -rf "$dir"; return; fi
  local msg
  msg=$(validate_oci_layout "$dir" "$img" 2>&1) && ok "archive $(basename "$archive") is an OCI layout naming it: $msg" \
    || fail "$archive is not a valid OCI layout for $img: $(tail -1 <<<"$msg")"
  rm -rf "$dir"
}

check_image() {
  current=$1
  local img=${IMAGE[$1]} archive="$OUT/${ARCHIVE[$1]}" entry user size_mb mnt out
  if ! buildah inspect --type image "$img" >/dev/null 2>&1; then fail "not in buildah's store"; return; fi
  check_archive "$archive" "$img"
  entry=$(buildah inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{.}} {{end}}' "$img")
  entry=${entry%% *}
  user=$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$img")
  CTR=$(buildah from --pull-never "$img") || { fail "buildah from failed"; return; }
  case $1 in
    dataplane)
      [ "$entry" = /usr/local/bin/chimerad ] || fail "entrypoint is '$entry', want /usr/local/bin/chimerad"
      out=$(in_image "$entry" --version 2>&1) && [[ $out == chimerad\ * ]] && ok "entrypoint runs: $out" \
        || fail "'$entry --version' failed: $out"
      out=$(in_image sh -c 'for l in libibverbs.so.1 librdmacm.so.1 libibverbs/libmlx5-rdmav34.so libibverbs/librxe-rdmav34.so; do [ -e /usr/lib/x86_64-linux-gnu/$l ] || echo "missing $l"; done' 2>&1)
      [ -z "$out" ] && ok "rdma-core user space present (libibverbs, librdmacm, mlx5 and rxe providers) for server.rdma" \
        || fail "rdma-core user space: $out"
      out=$(in_image /usr/local/bin/chimera-fuse --help 2>&1) && [[ $out == usage:\ chimera-fuse* ]] \
        && ok "chimera-fuse (the CSI mountMode sidecar container) runs: --help" || fail "'chimera-fuse --help' failed: $(head -3 <<<"$out")"
      check_chimerad_config
      check_chimerad_serves
      ;;
    operator|csi)
      out=$(in_image "$entry" --help 2>&1) && ok "entrypoint $entry --help exits 0 ($(grep -c -- '^ *-' <<<"$out") flags listed)" \
        || fail "'$entry --help' failed: $(tail -3 <<<"$out")"
      ;;
    pause)
      [ "$entry" = /pause ] || fail "entrypoint is '$entry', want /pause"
      out=$(in_image /pause --version 2>&1) && ok "entrypoint runs: $out" || fail "'/pause --version' failed: $out"
      check_pause_sleeps
      check_validator_rejects_bad_archives "$archive" "$img"
      ;;
    fio)
      out=$(in_image fio --version 2>&1) && [[ $out == fio-* ]] && ok "fio runs: $out" || fail "'fio --version' failed: $out"
      ;;
    fio-engine)
      out=$(in_image fio --version 2>&1) && [[ $out == fio-3.33* ]] && ok "fio runs: $out" || fail "'fio --version' failed or not 3.33: $out"
      # fio loads the engine (dlopen, its ioengine symbol, FIO_IOOPS_VERSION)
      # and lists its options: the .so fits this fio and its libraries.
      out=$(in_image fio --enghelp=/usr/lib/chimera/chimera-fio.so 2>&1) \
        && grep -q chimera_server <<<"$out" && grep -q chimera_pnfs <<<"$out" \
        && ok "fio loads chimera-fio.so: $(grep -c '^chimera_' <<<"$out") engine options" \
        || fail "fio does not load /usr/lib/chimera/chimera-fio.so: $(tail -3 <<<"$out")"
      out=$(in_image fio --enghelp=nfs 2>&1) && grep -q nfs_url <<<"$out" && ok "fio has the libnfs engine (nfs_url)" \
        || fail "no libnfs engine in this fio: $(tail -2 <<<"$out")"
      ;;
  esac
  case $1 in
    operator)
      # Non-root both as configured and as actually run.
      case ${user%%:*} in ""|0|root) fail "image user is '${user:-unset}', want non-root" ;; esac
      out=$(in_image id -u 2>&1) && [ "$out" = 65532 ] && ok "runs as uid $out" || fail "runs as uid '$out', want 65532"
      ;;
    csi)
      out=$(in_image sh -c 'command -v mount.nfs && mount.nfs -V && mount --version' 2>&1) \
        && ok "has $(head -1 <<<"$out"): $(sed -n 2p <<<"$out"); $(sed -n 3p <<<"$out")" \
        || fail "mount.nfs / mount missing or broken: $out"
      # mount.nfs looks up proto=tcp in /etc/protocols (netbase); without it the
      # mount fails "Failed to find 'tcp' protocol" (found by the real-node e2e).
      out=$(in_image getent protocols tcp 2>&1) && ok "resolves protocol tcp: $(echo $out)" \
        || fail "no 'tcp' in /etc/protocols (netbase missing): mount.nfs -o proto=tcp would fail"
      ;;
  esac
  case $1 in
    operator|csi|dataplane|fio|fio-engine)
      # Runtime images carry no toolchain.
      out=$(in_image sh -c 'for t in cc gcc go cargo rustc; do command -v $t; done; exit 0' 2>&1)
      [ -z "$out" ] && ok "no compiler inside" || fail "compiler inside the runtime image: $out"
      ;;
  esac
  # Size of the image's filesystem as a container sees it.
  mnt=$(buildah mount "$CTR") && size_mb=$(du -sm "$mnt" | cut -f1) && buildah umount "$CTR" >/dev/null \
    || { fail "could not measure the size"; size_mb=0; }
  cleanup
  if [ "$size_mb" -le "${SIZE_MB_MAX[$1]}" ]; then
    ok "size $size_mb MB (limit ${SIZE_MB_MAX[$1]}), archive $(awk -v b="$(stat -c %s "$archive" 2>/dev/null || echo 0)" 'BEGIN{printf "%.1f", b/1e6}') MB"
  else
    fail "size $size_mb MB exceeds the limit of ${SIZE_MB_MAX[$1]} MB"
  fi
  summary+=("$img ${size_mb}MB")
}

# chimerad's config gate works inside the image: a valid config passes, a key
# of no known format is refused with an error naming it.
CHIMERAD_TEST_CONFIG='{"server": {"role": "both", "bind": "127.0.0.1", "threads": 1,
   "nfs_port": 12049, "mount_port": 12048, "portmap_port": 12111},
 "mounts": {"memfs": {"module": "memfs", "path": "/", "capacity_bytes": "64M"}},
 "exports": {"/memfs": {"path": "/memfs"}},
 "admin": {"bind": "127.0.0.1", "port": 18080, "token": "image-test", "tls": false},
 "metrics": {"bind": "127.0.0.1", "port": 19000}}'
CHIMERAD_TEST_PORTS="12049 12048 12111 18080 19000"
CHIMERAD_LISTEN_S_MAX=20

check_chimerad_config() {
  local out
  out=$(in_image sh -c 'printf "%s" "$1" > /tmp/ok.json && chimerad --check-config --config /tmp/ok.json' sh "$CHIMERAD_TEST_CONFIG" 2>&1) \
    && [ "$out" = OK ] && ok "--check-config accepts a valid config" || fail "--check-config rejected a valid config: $out"
  out=$(in_image sh -c 'printf "%s" "$1" | sed "s/\"metrics\"/\"no_such_section\": 1, \"metrics\"/" > /tmp/bad.json &&
        chimerad --check-config --config /tmp/bad.json' sh "$CHIMERAD_TEST_CONFIG" 2>&1) \
    && fail "--check-config accepted an unknown key: $out"
  [[ $out == *no_such_section* ]] && ok "--check-config refuses an unknown key, naming it" \
    || fail "--check-config did not name the unknown key: $out"
}

# chimerad serves inside the image: every listener comes up on loopback, and
# SIGTERM stops it with exit 0. The data path is io_uring, which the default
# seccomp profile of buildah/podman (and RuntimeDefault of recent container
# runtimes) refuses with ENOSYS, so this container runs unconfined, as a pod
# without a seccomp profile does (images/README.md).
check_chimerad_serves() {
  local ctr out want=""
  for p in $CHIMERAD_TEST_PORTS; do want+=" $(printf '%04X' "$p")"; done
  ctr=$(buildah from --pull-never --security-opt seccomp=unconfined "${IMAGE[dataplane]}") || { fail "buildah from failed"; return; }
  local rc=0
  out=$(timeout $(( CHIMERAD_LISTEN_S_MAX + 30 )) buildah run --network none "$ctr" -- sh -c '
    printf "%s" "$1" > /tmp/c.json; polls_max=$(($2 * 5)); shift 2
    chimerad --config /tmp/c.json 2>/tmp/log & pid=$!
    i=0; missing="$*"
    while [ -n "$missing" ] && [ $i -lt $polls_max ]; do
      kill -0 $pid 2>/dev/null || break
      sleep 0.2; i=$((i + 1)); missing=""
      for p in "$@"; do grep -q ":$p 00000000:0000 0A" /proc/net/tcp || missing="$missing $p"; done
    done
    [ -z "$missing" ] || { echo "ports (hex) not listening:$missing"; tail -5 /tmp/log; kill -9 $pid 2>/dev/null; exit 1; }
    kill -TERM $pid; wait $pid; rc=$?
    [ $rc -eq 0 ] || { echo "exit $rc after SIGTERM"; tail -5 /tmp/log; exit 1; }
    echo "listening on all $# ports, exit 0 on SIGTERM"' sh "$CHIMERAD_TEST_CONFIG" "$CHIMERAD_LISTEN_S_MAX" $want 2>&1) || rc=$?
  buildah rm "$ctr" >/dev/null 2>&1 || true
  [ $rc -eq 0 ] && ok "chimerad serves inside the image: $out" || fail "chimerad does not serve inside the image: $out"
}

# The sandbox image's one job: stay up until told to stop (SIGTERM from the
# runtime, SIGINT from a terminal), then stop cleanly.
check_pause_sleeps() {
  local mnt rc t0 elapsed_s sig
  mnt=$(buildah mount "$CTR") || { fail "buildah mount failed"; return; }
  for sig in TERM INT; do
    t0=$(date +%s)
    rc=0
    timeout --preserve-status -s "$sig" -k "$PAUSE_EXIT_S_MAX" "$PAUSE_ALIVE_S" "$mnt/pause" 2>/dev/null || rc=$?
    elapsed_s=$(( $(date +%s) - t0 ))
    if [ "$rc" -eq 0 ] && [ "$elapsed_s" -ge "$PAUSE_ALIVE_S" ] && [ "$elapsed_s" -lt $(( PAUSE_ALIVE_S + PAUSE_EXIT_S_MAX )) ]; then
      ok "pause slept ${PAUSE_ALIVE_S} s and exited 0 on SIG$sig"
    else
      fail "pause: exit status $rc after $elapsed_s s (want 0 after SIG$sig at ${PAUSE_ALIVE_S} s)"
    fi
  done
  buildah umount "$CTR" >/dev/null
}

for c in "${ORDER[@]}"; do check_image "$c"; done

if [ ${#failures[@]} -ne 0 ]; then
  echo "test-images: FAILED: ${#failures[@]} check(s) failed:" >&2
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "test-images: ${#ORDER[@]}/${#ORDER[@]} images passed: $(IFS=,; echo "${summary[*]}" | sed 's/,/, /g')"
