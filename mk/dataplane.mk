# Rust dataplane: chimerad, protocol crates, backends.

DATAPLANE := dataplane
CHIMERAD := $(CARGO_TARGET_DIR)/release/chimerad

SETUP_TARGETS += setup-rust
BUILD_TARGETS += build-dataplane
TEST_TARGETS += test-dataplane

.PHONY: setup-rust build-dataplane test-dataplane
setup-rust: ## Rust toolchain and the system packages the dataplane needs
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust with rustup (https://rustup.rs)"; exit 1; }
	@scripts/apt-ensure.sh build-essential pkg-config

build-dataplane: setup-rust ## build chimerad (release)
	cd $(DATAPLANE) && $(CARGO) build --release --locked -p chimerad

test-dataplane: setup-rust ## Rust tests of the crates without their own target (vfs, nfs4, chimerad, block have theirs)
	cd $(DATAPLANE) && $(CARGO) test --release --locked --workspace --exclude vfs --exclude nfs4 --exclude chimerad --exclude block --exclude diskfs 2>&1 | tee $(CACHE)/last-cargo-test.log | grep -E '^(test result|running|error|failures|---- )' ; \
	  grep -q '^test result' $(CACHE)/last-cargo-test.log && ! grep -qE '^test result: FAILED|^error' $(CACHE)/last-cargo-test.log

# `make run`: a local chimerad on the embedded memory backend, in the foreground.
RUN_BIND ?= 127.0.0.1
RUN_NFS_PORT ?= 2049
RUN_MOUNT_PORT ?= 20048
RUN_CAPACITY ?= 1G
RUN_DIR := $(CACHE)/run
# BACKEND=diskfs: the durable backend over a sparse file in the cache
# directory (kept across runs: data survives a restart).
BACKEND ?= memfs
RUN_DISKFS_SIZE ?= 4G

ifeq ($(BACKEND),diskfs)
RUN_MOUNT := '  "mounts":  { "diskfs": { "module": "diskfs", "path": "/" } },' \
  '  "exports": { "/diskfs": { "path": "/diskfs" } },'
RUN_VFS := , "vfs": { "diskfs": { "config": { "initialize": true, "devices": [ { "type": "io_uring", "path": "$(RUN_DIR)/diskfs.img" } ] } } }
else ifeq ($(BACKEND),memfs)
RUN_MOUNT := '  "mounts":  { "memfs": { "module": "memfs", "capacity_bytes": "$(RUN_CAPACITY)" } },' \
  '  "exports": { "/memfs": { "path": "/memfs" } },'
RUN_VFS :=
else
$(if $(filter run,$(MAKECMDGOALS)),$(error BACKEND=$(BACKEND): expected memfs or diskfs))
endif

.PHONY: run
run: build-dataplane ## start a local chimerad (memfs; BACKEND=diskfs for the durable backend over a file) and print how to mount it
	@mkdir -p $(RUN_DIR)
	@[ -s $(RUN_DIR)/admin-token ] || head -c 24 /dev/urandom | base64 | tr -d '/+=' > $(RUN_DIR)/admin-token
	@if [ "$(BACKEND)" = diskfs ] && [ ! -e $(RUN_DIR)/diskfs.img ]; then truncate -s $(RUN_DISKFS_SIZE) $(RUN_DIR)/diskfs.img; fi
	@printf '%s\n' '{' \
	  '  "server":  { "bind": "$(RUN_BIND)", "nfs_port": $(RUN_NFS_PORT), "mount_port": $(RUN_MOUNT_PORT), "portmap_port": 0 $(RUN_VFS) },' \
	  $(RUN_MOUNT) \
	  '  "admin":   { "bind": "$(RUN_BIND)", "port": 8080, "token_file": "$(RUN_DIR)/admin-token", "tls": false },' \
	  '  "metrics": { "bind": "$(RUN_BIND)", "port": 9000 }' \
	  '}' > $(RUN_DIR)/chimerad.json
	@$(CHIMERAD) --check-config --config $(RUN_DIR)/chimerad.json >/dev/null
	@echo "chimerad ($(BACKEND)) on $(RUN_BIND); config $(RUN_DIR)/chimerad.json"
	@echo "  NFSv4.1: mount -t nfs -o vers=4.1,port=$(RUN_NFS_PORT) $(RUN_BIND):/$(BACKEND) /mnt"
	@echo "  NFSv3:   mount -t nfs -o vers=3,proto=tcp,port=$(RUN_NFS_PORT),mountport=$(RUN_MOUNT_PORT),mountproto=tcp,nolock $(RUN_BIND):/$(BACKEND) /mnt"
	@echo "  libnfs:  nfs-ls 'nfs://$(RUN_BIND)/$(BACKEND)/?nfsport=$(RUN_NFS_PORT)&mountport=$(RUN_MOUNT_PORT)&version=3'"
	@echo "  admin:   curl -H \"Authorization: Bearer \$$(cat $(RUN_DIR)/admin-token)\" http://$(RUN_BIND):8080/api/v1/volumes"
	@echo "  metrics: curl http://$(RUN_BIND):9000/metrics      (Ctrl-C stops the server)"
	@exec $(CHIMERAD) --config $(RUN_DIR)/chimerad.json
