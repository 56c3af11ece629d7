# dataplane/vfs: the backend trait, the memory backend (MemFs) and the
# namespace router. Its tests also run inside test-dataplane (the whole
# workspace); this target runs them alone, so a vfs failure is named as such,
# and includes the memory-bound test (its own test binary).

VFS_TEST_LOG = $(CACHE)/last-vfs-test.log

BUILD_TARGETS += build-vfs
TEST_TARGETS += test-vfs

.PHONY: build-vfs test-vfs
build-vfs: setup-rust ## build the vfs crate (memfs, router)
	cd $(DATAPLANE) && nice -n 10 $(CARGO) build --release --locked -p vfs

test-vfs: setup-rust ## vfs unit tests, router tests, memory-bound test
	@mkdir -p $(CACHE)
	@set +e; cd $(DATAPLANE) && nice -n 10 $(CARGO) test --release --locked -p vfs -- --nocapture > $(VFS_TEST_LOG) 2>&1; rc=$$?; set -e; \
	  grep -E '^(test result|running|error|failures|---- |written|after reuse|created)|panicked' $(VFS_TEST_LOG) || true; \
	  passed=$$( { grep -oE '^test result: ok\. [0-9]+ passed' $(VFS_TEST_LOG) || true; } | awk '{s += $$4} END {print s + 0}'); \
	  echo "test-vfs: $$passed tests passed, cargo exit $$rc (full log: $(VFS_TEST_LOG))"; \
	  [ $$rc -eq 0 ] || { echo "test-vfs: FAILED"; exit 1; }; \
	  [ $$passed -gt 0 ] || { echo "test-vfs: no tests ran"; exit 1; }
