# chimera-fuse: a FUSE file system over the userspace NFS client
# (dataplane/fuse/README.md).
#
#   make build-fuse   the chimera-fuse binary (no libfuse needed to build)
#   make test-fuse    on this host (root, /dev/fuse): a file workload through
#                     the mount, hostile cases, --fuse-fd, --sidecar-dir, and a diskfs
#                     chimerad restarted mid-write (< 1 min; bounded at 3 min)

CHIMERA_FUSE := $(CARGO_TARGET_DIR)/release/chimera-fuse

BUILD_TARGETS += build-fuse
TEST_TARGETS += test-fuse

.PHONY: build-fuse test-fuse
build-fuse: setup-rust ## build chimera-fuse (release)
	cd $(DATAPLANE) && nice -n 10 $(CARGO) build --release --locked -p chimera-fuse

test-fuse: build-dataplane build-fuse ## chimera-fuse over chimerad on this host: file workload, hostile cases, restart mid-write
	timeout 180 $(DATAPLANE)/fuse/test-fuse.sh $(CHIMERAD) $(CHIMERA_FUSE)
