# syntax=docker/dockerfile:1
# One image per component: `--target operator`, `--target csi`, `--target dataplane`.
# Bases are build args so the same file builds unchanged with Docker and, in the
# tests, with buildah from locally made bases (no registry; images/README.md).
# Stage order matters: buildah 1.28 builds every stage before the target, so the
# Go targets come before the Rust stage and `--target operator` never runs cargo.
# The Rust base is a bookworm one: chimerad links glibc dynamically and must not
# need a newer glibc than the bookworm runtime base has.
ARG GO_BASE=golang:1.26-bookworm
ARG RUST_BASE=rust:1.95-bookworm
ARG RUNTIME_BASE=debian:bookworm-slim

# ---- Go: operator and CSI driver (one module at the root) ----
# Cache mounts keep the module and build caches across builds (BuildKit and
# buildah both support them); GOPATH is /go in the golang image and in ours.
FROM ${GO_BASE} AS go-build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY api/ api/
COPY operator/ operator/
COPY csi/ csi/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/chimera-operator ./operator/cmd/chimera-operator && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/chimera-csi ./csi/cmd/chimera-csi

# ---- operator: static binary, non-root ----
FROM ${RUNTIME_BASE} AS operator
COPY --from=go-build /out/chimera-operator /usr/local/bin/chimera-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/chimera-operator"]

# ---- csi: the node plugin mounts, so it carries mount.nfs (nfs-common) and
# mount (util-linux), and netbase (/etc/protocols: without it mount.nfs fails
# "Failed to find 'tcp' protocol", found by the real-node e2e); it runs as root
# (privileged in the node DaemonSet) ----
FROM ${RUNTIME_BASE} AS csi
RUN apt-get update && \
    apt-get install -y --no-install-recommends nfs-common mount util-linux netbase && \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY --from=go-build /out/chimera-csi /usr/local/bin/chimera-csi
ENTRYPOINT ["/usr/local/bin/chimera-csi"]

# ---- Rust: chimerad and chimera-fuse ----
# The target dir is a cache mount (not part of any layer), so the binary is
# copied out within the same RUN. CARGO_HOME is /usr/local/cargo in the rust
# image and in ours.
# Cargo judges our own crates fresh by mtime, and the cache outlives the
# sources it was built from: a checkout whose files are older than the cache's
# last build (another clone built since) would get that clone's binary. So
# every source file whose content differs from the last build's (sha256 list
# kept in the cache) is touched first; unchanged files keep the incremental
# build.
FROM ${RUST_BASE} AS rust-build
WORKDIR /src/dataplane
COPY dataplane/ ./
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/dataplane/target \
    find . -path ./target -prune -o -type f -print | sort | xargs sha256sum >/tmp/src.sums && \
    touch target/src.sums && \
    awk 'FILENAME == ARGV[1] { old[$2] = $1; next } old[$2] != $1 { print $2 }' target/src.sums /tmp/src.sums | xargs -r touch && \
    cargo build --release --locked -p chimerad -p chimera-fuse && \
    cp /tmp/src.sums target/src.sums && \
    cp target/release/chimerad /chimerad && cp target/release/chimera-fuse /chimera-fuse

# ---- dataplane: chimerad; capabilities come from the pod spec. Root: it binds
# the NFS and portmap ports (2049, 111) and locks memory. rdma-core's user
# space (libibverbs, librdmacm, the NICs' providers: mlx5, rxe, ...) is what
# chimerad dlopen()s for server.rdma; without it only TCP works. The image
# also carries chimera-fuse, the sidecar the operator injects for CSI
# mountMode: sidecar (command /usr/local/bin/chimera-fuse; it needs no
# privileges and no libfuse) ----
FROM ${RUNTIME_BASE} AS dataplane
RUN apt-get update && \
    apt-get install -y --no-install-recommends libibverbs1 librdmacm1 ibverbs-providers && \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY --from=rust-build /chimerad /usr/local/bin/chimerad
COPY --from=rust-build /chimera-fuse /usr/local/bin/chimera-fuse
ENTRYPOINT ["/usr/local/bin/chimerad"]
CMD ["--config", "/etc/chimera/chimerad.json"]
