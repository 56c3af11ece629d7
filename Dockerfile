# syntax=docker/dockerfile:1
# One image per component: `--target operator`, `--target csi`, `--target dataplane`.
# Bases are build args so the same file builds unchanged with Docker and, in the
# tests, with buildah from locally made bases (no registry).
ARG GO_BASE=golang:1.26
ARG RUST_BASE=rust:1.95
ARG RUNTIME_BASE=debian:bookworm-slim

# ---- Go: operator and CSI driver (one module at the root) ----
FROM ${GO_BASE} AS go-build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY operator/ operator/
COPY csi/ csi/
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/chimera-operator ./operator/cmd/chimera-operator && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/chimera-csi ./csi/cmd/chimera-csi

# ---- Rust: chimerad ----
FROM ${RUST_BASE} AS rust-build
WORKDIR /src/dataplane
COPY dataplane/ ./
RUN cargo build --release --locked -p chimerad && cp target/release/chimerad /chimerad

# ---- operator: static binary, non-root ----
FROM ${RUNTIME_BASE} AS operator
COPY --from=go-build /out/chimera-operator /usr/local/bin/chimera-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/chimera-operator"]

# ---- csi: the node plugin mounts, so it carries mount.nfs; runs as root
# (privileged in the node DaemonSet) ----
FROM ${RUNTIME_BASE} AS csi
RUN apt-get update && apt-get install -y --no-install-recommends nfs-common util-linux && \
    rm -rf /var/lib/apt/lists/*
COPY --from=go-build /out/chimera-csi /usr/local/bin/chimera-csi
ENTRYPOINT ["/usr/local/bin/chimera-csi"]

# ---- dataplane: chimerad; capabilities come from the pod spec ----
FROM ${RUNTIME_BASE} AS dataplane
COPY --from=rust-build /chimerad /usr/local/bin/chimerad
ENTRYPOINT ["/usr/local/bin/chimerad"]
CMD ["--config", "/etc/chimera/chimerad.json"]
