# Benchmarks: chimerad side by side with NFS-Ganesha (bench/README.md).
#
#   make bench          full matrix, 3 rounds, chimerad vs Ganesha MEM and VFS (~25 min)
#   make bench-quick    one round, 5 cells, chimerad vs Ganesha MEM (< 5 min)
#   make bench-peers    the harness against Ganesha alone (MEM vs VFS), no chimerad
#   make bench-profile  instructions per NFSv3 call, chimerad under callgrind (stable figure)
#   make bench-diskfs   chimerad on diskfs vs Ganesha VFS on ext4 (loop device), 2 rounds (< 5 min)
#   BENCH_ARGS='--rounds 5 --cells 4k-randread-qd1-j1' make bench   extra harness flags

# Debian's python3 (the one python3-matplotlib installs into), not a user's pyenv.
BENCH_PYTHON ?= /usr/bin/python3
RPCBENCH := $(CARGO_TARGET_DIR)/release/rpcbench
BENCH_ARGS ?=
# Results of the CI smoke run (outside the repo; replaced on every run).
BENCH_SMOKE_DIR := $(CACHE)/bench-smoke
BENCH_FIO = $$(e2e/peers/fio-libnfs.sh)
BENCH_RUN = $(BENCH_PYTHON) bench/bench.py --fio "$(BENCH_FIO)" --rpcbench $(RPCBENCH) --engine $(FIO_ENGINE)
# The durable-backend suite (bench/diskfs_bench.py): backing files under
# $(CACHE)/bench (this machine's disk; diskfs needs O_DIRECT, tmpfs has none).
BENCH_DISKFS_ARGS ?=
BENCH_DISKFS_RUN = $(BENCH_PYTHON) bench/diskfs_bench.py --fio "$(BENCH_FIO)" \
	--filesync-engine "$$(bench/fio-nfs-filesync.sh)" --chimerad $(CHIMERAD) --dir $(CACHE)/bench

SETUP_TARGETS += setup-bench
BUILD_TARGETS += build-rpcbench
# test-bench-smoke: `make bench-quick` against chimerad and Ganesha MEM, then
# check_results.py; asserts the harness worked, never performance.
TEST_TARGETS += test-bench-unit test-peers test-bench-smoke

.PHONY: setup-bench build-rpcbench bench bench-engine bench-quick bench-diskfs bench-peers bench-profile test-bench-unit test-peers test-bench-smoke
setup-bench: ## fio with the libnfs engine (and its FILE_SYNC variant), NFS-Ganesha, rpcbind, matplotlib (idempotent)
	@scripts/apt-ensure.sh python3 python3-matplotlib nfs-ganesha nfs-ganesha-mem nfs-ganesha-vfs rpcbind libnfs-utils libnfs-dev iproute2 util-linux e2fsprogs strace
	@e2e/peers/fio-libnfs.sh >/dev/null
	@bench/fio-nfs-filesync.sh >/dev/null

build-rpcbench: setup-rust ## build the transport microbenchmark (release)
	cd $(DATAPLANE) && nice -n 10 $(CARGO) build --release --locked -p rpcbench

# The full run ends with the diskfs suite (3 rounds, ~6 min); it runs even when
# the memfs matrix reported errors, and make fails if either did.
bench: setup-bench build-dataplane build-rpcbench build-fio-engine ## full side-by-side benchmark: chimerad vs Ganesha MEM and VFS, our fio engine vs libnfs, then the diskfs suite
	rc=0; $(BENCH_RUN) --chimerad $(CHIMERAD) --servers chimerad,ganesha-mem,ganesha-vfs $(BENCH_ARGS) || rc=1; \
	$(BENCH_RUN) --chimerad $(CHIMERAD) --servers $(BENCH_ENGINE_SERVERS) --cells $(BENCH_ENGINE_CELLS) $(BENCH_ARGS) || rc=1; \
	$(BENCH_DISKFS_RUN) $(BENCH_DISKFS_ARGS) || rc=1; exit $$rc

# Our fio engine (dataplane/fio) against fio's libnfs engine on the same
# server in the same run, and chimerad vs Ganesha MEM both driven by it.
BENCH_ENGINE_SERVERS := chimerad+engine,chimerad,ganesha-mem+engine,ganesha-mem
BENCH_ENGINE_CELLS := 4k-randread-qd1-j1,4k-randread-qd32-j1,4k-randwrite-qd1-j1,4k-randwrite-qd32-j1,1m-write-qd1-j1,1m-read-qd1-j1
bench-engine: setup-bench build-dataplane build-rpcbench build-fio-engine ## our fio engine vs fio's libnfs engine, same servers, same run (~8 min)
	$(BENCH_RUN) --chimerad $(CHIMERAD) --servers $(BENCH_ENGINE_SERVERS) --cells $(BENCH_ENGINE_CELLS) $(BENCH_ARGS)

bench-diskfs: setup-bench build-dataplane ## chimerad on diskfs vs Ganesha VFS on ext4 over a loop device, 2 rounds (< 5 min)
	$(BENCH_DISKFS_RUN) --quick --rounds 2 $(BENCH_DISKFS_ARGS)

bench-quick: setup-bench build-dataplane build-rpcbench build-fio-engine ## one-round benchmark, fewer cells (< 5 min)
	$(BENCH_RUN) --chimerad $(CHIMERAD) --servers chimerad,ganesha-mem --quick $(BENCH_ARGS)

bench-peers: setup-bench build-rpcbench build-fio-engine ## the harness against Ganesha alone (MEM vs VFS), no chimerad
	$(BENCH_RUN) --servers ganesha-mem,ganesha-vfs --quick $(BENCH_ARGS)

# PROFILE_ARGS='--phases read4k:5000:16' picks the calls; results in bench/results/profile-<UTC time>/.
PROFILE_ARGS ?=
bench-profile: setup-bench build-dataplane ## instructions per NFSv3 call (GETATTR, 4 KiB READ/WRITE, 1 MiB READ) under callgrind
	@scripts/apt-ensure.sh valgrind
	$(BENCH_PYTHON) bench/opsprofile.py --chimerad $(CHIMERAD) $(PROFILE_ARGS)

test-bench-unit: ## unit tests of the harness (no servers, seconds)
	@scripts/apt-ensure.sh python3 python3-matplotlib
	@mkdir -p $(CACHE)
	$(BENCH_PYTHON) -m unittest discover -s bench -p 'test_*.py' -v 2>&1 | tee $(CACHE)/last-bench-unit.log
	@grep -qE '^Ran [1-9][0-9]* tests?' $(CACHE)/last-bench-unit.log || { echo "test-bench-unit: no tests ran"; exit 1; }

test-peers: setup-bench ## fio+libnfs and the confined Ganesha peer work (start/stop, verify, bad config)
	e2e/peers/test-peers.sh

test-bench-smoke: setup-bench build-dataplane build-rpcbench build-fio-engine ## make bench-quick (with our fio engine as a third client), then assert the harness worked (no thresholds)
	rm -rf $(BENCH_SMOKE_DIR)
	$(BENCH_RUN) --chimerad $(CHIMERAD) --servers chimerad,ganesha-mem,chimerad+engine --quick --results $(BENCH_SMOKE_DIR)
	$(BENCH_PYTHON) bench/check_results.py $(BENCH_SMOKE_DIR) --servers chimerad,ganesha-mem,chimerad+engine --transport --chart
