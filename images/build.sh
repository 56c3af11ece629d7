#!/usr/bin/env bash
# Build our images with buildah — no registry, no Docker engine — and export each
# as an OCI archive into $CACHE/images/ (what the real-node e2e imports into the
# guest's containerd). See images/README.md for the names and the why of each step.
#
#   images/build.sh bases     local base images (Debian from debootstrap, Go and Rust builders)
#   images/build.sh test      localhost/pause:3.10, localhost/chimera-fio:dev (images/test/Dockerfile),
#                             localhost/chimera-fio-engine:dev (images/fio-engine/Dockerfile; needs
#                             FIO_BIN and FIO_ENGINE_SO, see stage_fio_engine)
#   images/build.sh product   localhost/chimera-operator:dev, localhost/chimera-csi:dev, localhost/chimerad:dev
#   images/build.sh all       all of the above, in that order
#   images/build.sh operator|csi|dataplane|pause|fio|fio-engine   one image (and the bases it needs)
#
# Idempotent: a base is rebuilt only when missing or when its inputs (mirror, host
# toolchain versions, recipe version) change; component images use buildah's layer
# cache plus RUN cache mounts (cargo registry/target, Go module/build caches), so a
# warm run rebuilds only what changed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CACHE:-$HOME/.cache/chimera-test}
OUT=${IMAGES_OUT:-$CACHE/images}
mkdir -p "$OUT"

# Image names are a contract with the chart values used by e2e/kube: change them
# only together with that suite.
DEBIAN_IMG=localhost/debian:bookworm-slim
GO_IMG=localhost/chimera-go-builder:dev
RUST_IMG=localhost/chimera-rust-builder:dev
declare -A PRODUCT=(
  [operator]=localhost/chimera-operator:dev
  [csi]=localhost/chimera-csi:dev
  [dataplane]=localhost/chimerad:dev
)
PRODUCT_ORDER=(operator csi dataplane)
declare -A TEST=(
  [pause]=localhost/pause:3.10
  [fio]=localhost/chimera-fio:dev
  [fio-engine]=localhost/chimera-fio-engine:dev
)
TEST_ORDER=(pause fio fio-engine)
# Archive file name per target (next to each other in $OUT).
declare -A ARCHIVE=(
  [operator]=chimera-operator.tar [csi]=chimera-csi.tar [dataplane]=chimerad.tar
  [pause]=pause.tar [fio]=chimera-fio.tar [fio-engine]=chimera-fio-engine.tar
)

# Bump when a base recipe below changes, so cached bases are rebuilt.
BASE_RECIPE=3
SUITE=bookworm
# Packages the Rust builder adds: cc is the linker rustc calls; no crate of the
# workspace builds C code or needs pkg-config (io-uring ships its bindings).
RUST_APT_PKGS="gcc libc6-dev ca-certificates"
GO_APT_PKGS="ca-certificates"
# HTTPS from inside a build (cargo, the Go proxy) needs the host's CA bundle on
# these machines; it is mounted read-only, never copied into an image.
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
LABEL_KEY=io.chimera.inputs
PROGRESS_S=30

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

require_tools() {
  local missing=()
  for t in buildah debootstrap runc; do command -v "$t" >/dev/null || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] || die "missing tools: ${missing[*]} (run: make setup-images)"
  [ -r "$CA_BUNDLE" ] || die "CA bundle $CA_BUNDLE not readable (set CA_BUNDLE)"
}

# buildah's defaults do not work here: the build network has no DNS, and crun
# fails on this cgroup setup. A private containers.conf fixes both for our runs only.
write_containers_conf() {
  CONTAINERS_CONF="$OUT/containers.conf"
  cat > "$CONTAINERS_CONF.tmp" <<'EOF'
[containers]
netns = "host"

[engine]
runtime = "runc"
EOF
  mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"
  export CONTAINERS_CONF
}

# The Debian mirror the host's apt uses (deb822 .sources or one-line lists).
host_mirror() {
  local m
  m=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -E '/debian/?$' | head -1 || true)
  [ -n "$m" ] || m=$(grep -hsE '^deb +(\[[^]]*\] +)?https?://' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
       | sed -E 's/^deb +(\[[^]]*\] +)?//' | awk '{print $1}' | grep -E '/debian/?$' | head -1 || true)
  [ -n "$m" ] || die "no Debian mirror found in /etc/apt/sources.list{,.d} (set DEBIAN_MIRROR)"
  echo "${m%/}"
}

image_label() { # image -> the inputs label, empty when the image is missing
  buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$LABEL_KEY\"}}" "$1" 2>/dev/null || true
}

hash_of() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }

# ---- bases -----------------------------------------------------------------

# localhost/debian:bookworm-slim: debootstrap minbase, trimmed like the slim image
# (no docs/man/locales, no apt lists), rootfs tar cached in $OUT.
build_debian() {
  local mirror inputs rootfs tarball
  mirror=${DEBIAN_MIRROR:-$(host_mirror)}
  inputs=$(hash_of "recipe=$BASE_RECIPE" "suite=$SUITE" "mirror=$mirror")
  tarball="$OUT/debian-$SUITE-rootfs-$inputs.tar"
  if [ "$(image_label "$DEBIAN_IMG")" = "$inputs" ]; then
    log "$DEBIAN_IMG up to date ($inputs)"; return
  fi
  if [ ! -s "$tarball" ]; then
    log "debootstrap --variant=minbase $SUITE from $mirror (once; cached as $(basename "$tarball"))"
    rootfs=$(mktemp -d "$OUT/rootfs.XXXXXX")
    nice -n 10 debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" > "$OUT/debootstrap.log" 2>&1 \
      || { tail -20 "$OUT/debootstrap.log" >&2; rm -rf "$rootfs"; die "debootstrap failed (log: $OUT/debootstrap.log)"; }
    # Later apt installs in images stay small too: no docs (copyright files kept), no man pages, no locales.
    cat > "$rootfs/etc/dpkg/dpkg.cfg.d/01-chimera-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    cat > "$rootfs/etc/apt/apt.conf.d/01-chimera-slim" <<'EOF'
APT::Install-Recommends "false";
APT::Keep-Downloaded-Packages "false";
Acquire::Languages "none";
EOF
    cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
EOF
    find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete 2>/dev/null || true
    rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/lib/apt/lists/* \
           "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/* \
           "$rootfs"/tmp/* "$rootfs"/var/tmp/*
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
    find "$OUT" -maxdepth 1 -name "debian-$SUITE-rootfs-*.tar" ! -name "$(basename "$tarball")" -delete
  fi
  log "importing $DEBIAN_IMG from $(basename "$tarball")"
  local ctr
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$tarball" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash --label "$LABEL_KEY=$inputs" "$ctr"
  buildah commit --quiet --rm "$ctr" "$DEBIAN_IMG" >/dev/null
  log "$DEBIAN_IMG built"
}

# A builder base: the Debian base + apt packages + a host toolchain copied in.
# $1 image, $2 inputs hash, $3 apt packages, then "host-path:image-path" pairs,
# then "--" and buildah config arguments.
build_builder() {
  local img=$1 inputs=$2 pkgs=$3; shift 3
  local ctr copies=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do copies+=("$1"); shift; done
  shift
  ctr=$(buildah from --pull-never "$DEBIAN_IMG")
  buildah run --network host "$ctr" -- sh -c \
    "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin" \
    || { buildah rm "$ctr" >/dev/null; die "apt-get install $pkgs failed in $img"; }
  local pair
  for pair in "${copies[@]}"; do
    buildah copy --quiet "$ctr" "${pair%%:*}" "${pair#*:}" >/dev/null
  done
  buildah config "$@" --label "$LABEL_KEY=$inputs" "$ctr"
  buildah commit --quiet --rm "$ctr" "$img" >/dev/null
}

build_go_builder() {
  local goroot inputs deb_id
  goroot=$(go env GOROOT) || die "go not found: the Go builder base copies the host's Go toolchain"
  deb_id=$(buildah inspect --type image --format '{{.FromImageID}}' "$DEBIAN_IMG")
  inputs=$(hash_of "recipe=$BASE_RECIPE" "base=$deb_id" "go=$(go version)" "goroot=$goroot" "pkgs=$GO_APT_PKGS")
  if [ "$(image_label "$GO_IMG")" = "$inputs" ]; then log "$GO_IMG up to date ($inputs)"; return; fi
  log "building $GO_IMG from $DEBIAN_IMG + $(go version | awk '{print $3}') (host GOROOT)"
  # GOPATH /go as in the official golang image, so the Dockerfile's cache mounts
  # (/go/pkg/mod, /root/.cache/go-build) are the same with either base.
  build_builder "$GO_IMG" "$inputs" "$GO_APT_PKGS" "$goroot:/usr/local/go" -- \
    --env GOPATH=/go --env GOTOOLCHAIN=local \
    --env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  log "$GO_IMG built"
}

build_rust_builder() {
  local sysroot inputs deb_id d
  sysroot=$(rustc --print sysroot) || die "rustc not found: the Rust builder base copies the host's Rust toolchain"
  for d in bin lib; do [ -d "$sysroot/$d" ] || die "no $sysroot/$d: unexpected Rust toolchain layout"; done
  [ -x "$sysroot/bin/cargo" ] || die "no cargo in $sysroot/bin"
  deb_id=$(buildah inspect --type image --format '{{.FromImageID}}' "$DEBIAN_IMG")
  inputs=$(hash_of "recipe=$BASE_RECIPE" "base=$deb_id" "rustc=$(rustc -vV)" "cargo=$("$sysroot/bin/cargo" -V)" "pkgs=$RUST_APT_PKGS")
  if [ "$(image_label "$RUST_IMG")" = "$inputs" ]; then log "$RUST_IMG up to date ($inputs)"; return; fi
  log "building $RUST_IMG from $DEBIAN_IMG + $(rustc --version) ($sysroot, without docs)"
  # The toolchain's bin/lib/libexec (rustc finds its sysroot next to its binary);
  # share/ (docs, ~800 MB) stays out. CARGO_HOME /usr/local/cargo as in the official
  # rust image, so the Dockerfile's registry cache mount is the same with either base.
  local copies=("$sysroot/bin:/usr/local/rust/bin" "$sysroot/lib:/usr/local/rust/lib")
  [ -d "$sysroot/libexec" ] && copies+=("$sysroot/libexec:/usr/local/rust/libexec")
  build_builder "$RUST_IMG" "$inputs" "$RUST_APT_PKGS" "${copies[@]}" -- \
    --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  log "$RUST_IMG built"
}

# ---- component images --------------------------------------------------------

BUD_ARGS=()
set_bud_args() {
  BUD_ARGS=(--layers --force-rm --pull-never
    -v "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro"
    --build-arg "GO_BASE=$GO_IMG" --build-arg "RUST_BASE=$RUST_IMG" --build-arg "RUNTIME_BASE=$DEBIAN_IMG")
}

# $1 target, $2 image, $3 Dockerfile, $4 context
bud_and_export() {
  local target=$1 img=$2 file=$3 ctx=$4 t0 archive
  archive="$OUT/${ARCHIVE[$target]}"
  t0=$(date +%s)
  log "building $img (--target $target, $(basename "$(dirname "$file")")/$(basename "$file"))"
  # Children of buildah (cargo, go, apt) inherit the nice level: the machine is shared.
  nice -n 10 buildah bud "${BUD_ARGS[@]}" -f "$file" --target "$target" -t "$img" "$ctx" \
    > "$OUT/build-$target.log" 2>&1 &
  local pid=$!
  # Progress without flooding: the last line of the build log every 30 s.
  local next_s=$(( t0 + PROGRESS_S ))
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2
    if [ "$(date +%s)" -ge "$next_s" ]; then
      next_s=$(( next_s + PROGRESS_S ))
      log "  $target ($(( $(date +%s) - t0 )) s): $(tail -n 1 "$OUT/build-$target.log" | cut -c1-120)"
    fi
  done
  if ! wait "$pid"; then
    tail -n 40 "$OUT/build-$target.log" >&2
    die "$img: buildah bud --target $target failed (log: $OUT/build-$target.log)"
  fi
  # Export only when the image changed since the last export (re-compressing
  # unchanged layers costs tens of seconds); the .id file records what is inside.
  local id
  id=$(buildah inspect --type image --format '{{.FromImageID}}' "$img")
  if [ -s "$archive" ] && [ "$(cat "$archive.id" 2>/dev/null)" = "$id" ]; then
    log "$img unchanged (${id:0:12}), $archive kept; $(( $(date +%s) - t0 )) s"
    return
  fi
  rm -f "$archive.tmp" "$archive.id"
  buildah push --quiet "$img" "oci-archive:$archive.tmp:$img" >/dev/null \
    || die "$img: export to $archive failed"
  mv "$archive.tmp" "$archive"
  echo "$id" > "$archive.id"
  log "$img built and exported to $archive in $(( $(date +%s) - t0 )) s"
}

# The fio-engine image's context: its Dockerfile plus the fio binary and the
# engine built on this host (FIO_BIN: e2e/peers/fio-libnfs.sh's fio;
# FIO_ENGINE_SO: `make build-fio-engine`'s chimera-fio.so, linked against
# that fio's headers). Copied, so buildah's layer cache sees their content.
stage_fio_engine() {
  local ctx="$OUT/ctx-fio-engine"
  [ -n "${FIO_BIN:-}" ] && [ -x "$FIO_BIN" ] ||
    die "fio-engine: FIO_BIN (${FIO_BIN:-unset}) is not an executable fio: run e2e/peers/fio-libnfs.sh, or build with make images"
  [ -n "${FIO_ENGINE_SO:-}" ] && [ -s "$FIO_ENGINE_SO" ] ||
    die "fio-engine: FIO_ENGINE_SO (${FIO_ENGINE_SO:-unset}) is missing: run make build-fio-engine, or build with make images"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp "$ROOT/images/fio-engine/Dockerfile" "$ctx/Dockerfile"
  cp "$FIO_BIN" "$ctx/fio"
  cp "$FIO_ENGINE_SO" "$ctx/chimera-fio.so"
  echo "$ctx"
}

build_test_image() {  # $1: pause | fio | fio-engine
  if [ "$1" = fio-engine ]; then
    local ctx
    ctx=$(stage_fio_engine)
    bud_and_export "$1" "${TEST[$1]}" "$ctx/Dockerfile" "$ctx"
  else
    bud_and_export "$1" "${TEST[$1]}" "$ROOT/images/test/Dockerfile" "$ROOT/images/test"
  fi
}

build_test_images() {
  local t
  for t in "${TEST_ORDER[@]}"; do build_test_image "$t"; done
}

build_product_images() {
  local t
  for t in "${PRODUCT_ORDER[@]}"; do
    bud_and_export "$t" "${PRODUCT[$t]}" "$ROOT/Dockerfile" "$ROOT"
  done
}

build_bases() { build_debian; build_go_builder; build_rust_builder; }

main() {
  [ $# -gt 0 ] || set -- all
  require_tools
  write_containers_conf
  set_bud_args
  local step
  for step in "$@"; do
    case $step in
      bases) build_bases ;;
      test) build_bases; build_test_images ;;
      product) build_bases; build_product_images ;;
      all) build_bases; build_test_images; build_product_images ;;
      operator|csi|dataplane) build_bases; bud_and_export "$step" "${PRODUCT[$step]}" "$ROOT/Dockerfile" "$ROOT" ;;
      pause|fio|fio-engine) build_bases; build_test_image "$step" ;;
      *) die "unknown step '$step' (bases | test | product | all | operator | csi | dataplane | pause | fio | fio-engine)" ;;
    esac
  done
}

main "$@"
