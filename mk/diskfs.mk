# dataplane/diskfs: the durable backend (intent log, checkpoints, fsck).
# Its own suite so a durability failure is named as such: semantics and
# restarts, bad devices and flipped bits, and the crash-state exploration
# (2,000+ crash images; `make crash` explores more and prints the count).
# The kill -9 rounds through the real binary run in test-chimerad.

DISKFS_TEST_LOG = $(CACHE)/last-diskfs-test.log
CRASH_SEEDS ?= 200

BUILD_TARGETS += build-diskfs
TEST_TARGETS += test-diskfs

.PHONY: build-diskfs test-diskfs crash
build-diskfs: setup-rust ## build diskfs and its tools (chimera-mkfs, chimera-fsck)
	cd $(DATAPLANE) && nice -n 10 $(CARGO) build --release --locked -p diskfs

test-diskfs: setup-rust ## diskfs: semantics, restarts, bad devices, 2,000+ explored crash states
	@mkdir -p $(CACHE)
	@set +e; cd $(DATAPLANE) && nice -n 10 $(CARGO) test --release --locked -p diskfs -- --nocapture > $(DISKFS_TEST_LOG) 2>&1; rc=$$?; set -e; \
	  grep -E '^(test result|running|error|failures|---- )|panicked|^crash states' $(DISKFS_TEST_LOG) || true; \
	  passed=$$( { grep -oE '^test result: ok\. [0-9]+ passed' $(DISKFS_TEST_LOG) || true; } | awk '{s += $$4} END {print s + 0}'); \
	  echo "test-diskfs: $$passed tests passed, cargo exit $$rc (full log: $(DISKFS_TEST_LOG))"; \
	  [ $$rc -eq 0 ] || { echo "test-diskfs: FAILED"; exit 1; }; \
	  [ $$passed -gt 0 ] || { echo "test-diskfs: no tests ran"; exit 1; }; \
	  grep -q '^crash states: ' $(DISKFS_TEST_LOG) || { echo "test-diskfs: the crash exploration did not report"; exit 1; }

crash: setup-rust ## explore more diskfs crash states (CRASH_SEEDS random images per flush point; prints the count)
	cd $(DATAPLANE) && DISKFS_CRASH_SEEDS=$(CRASH_SEEDS) nice -n 10 $(CARGO) test --release --locked -p diskfs --test crash -- --nocapture 2>&1 | grep -E '^crash states|^test result|panicked'
