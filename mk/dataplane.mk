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

test-dataplane: setup-rust ## Rust unit, property and integration tests
	cd $(DATAPLANE) && $(CARGO) test --locked --workspace 2>&1 | tee $(CACHE)/last-cargo-test.log | grep -E '^(test result|running|error|failures|---- )' ; \
	  grep -q '^test result' $(CACHE)/last-cargo-test.log && ! grep -qE '^test result: FAILED|^error' $(CACHE)/last-cargo-test.log
