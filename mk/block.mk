# dataplane/block: the block layer (devices, buffer pools, io_uring O_DIRECT,
# the memory, recording and fault-injecting test devices). Excluded from
# test-dataplane so a block failure is named as such; its tests do real
# O_DIRECT I/O on files in the cargo target directory.

BLOCK_TEST_LOG = $(CACHE)/last-block-test.log

BUILD_TARGETS += build-block
TEST_TARGETS += test-block

.PHONY: build-block test-block
build-block: setup-rust ## build the block crate (block devices, buffer pools)
	cd $(DATAPLANE) && nice -n 10 $(CARGO) build --release --locked -p block

test-block: setup-rust ## block layer tests: O_DIRECT I/O, pools, test devices, crash images
	@mkdir -p $(CACHE)
	@set +e; cd $(DATAPLANE) && nice -n 10 $(CARGO) test --release --locked -p block > $(BLOCK_TEST_LOG) 2>&1; rc=$$?; set -e; \
	  grep -E '^(test result|running|error|failures|---- )|panicked' $(BLOCK_TEST_LOG) || true; \
	  passed=$$( { grep -oE '^test result: ok\. [0-9]+ passed' $(BLOCK_TEST_LOG) || true; } | awk '{s += $$4} END {print s + 0}'); \
	  echo "test-block: $$passed tests passed, cargo exit $$rc (full log: $(BLOCK_TEST_LOG))"; \
	  [ $$rc -eq 0 ] || { echo "test-block: FAILED"; exit 1; }; \
	  [ $$passed -gt 0 ] || { echo "test-block: no tests ran"; exit 1; }
