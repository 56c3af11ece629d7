# Hostile-input fuzzing of the generated XDR decoders (dataplane/fuzz).
#
# cargo-fuzz wants a nightly compiler only for its sanitizers (-Zsanitizer
# and friends). With `-s none` it passes no -Z flag at all: libFuzzer's
# coverage instrumentation (-Cpasses=sancov-module, -Cllvm-args=...) is made
# of stable codegen options, so the stable toolchain builds it as is. The
# decoders are safe Rust, so AddressSanitizer would add little; panics,
# inconsistent round trips, over-large allocations (-rss_limit_mb also caps
# single mallocs) and slow inputs are what the fuzzer catches. `make fuzz` runs long; `test-fuzz` (part of
# `make test`) runs the harness tests, builds the target, writes the seed
# corpus and fuzzes for FUZZ_SMOKE_SECONDS.

FUZZ_DIR := dataplane/fuzz
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 45
# Per-input limits: a decoder that allocates or loops on hostile input fails.
FUZZ_RSS_LIMIT_MB ?= 2048
FUZZ_INPUT_TIMEOUT_S ?= 10
FUZZ_INPUT_LEN_MAX ?= 65536
CARGO_FUZZ_VERSION := 0.13.2
FUZZ_BIN := $(CACHE)/cargo-bin/bin
FUZZ_TARGET_DIR := $(CACHE)/fuzz-target
FUZZ_CORPUS := $(CACHE)/fuzz-corpus
FUZZ_ENV := PATH="$(FUZZ_BIN):$$PATH"
FUZZ_CARGO_ARGS := --fuzz-dir . -s none --target-dir $(FUZZ_TARGET_DIR)
FUZZ_LIBFUZZER_ARGS = -rss_limit_mb=$(FUZZ_RSS_LIMIT_MB) -timeout=$(FUZZ_INPUT_TIMEOUT_S) \
	-max_len=$(FUZZ_INPUT_LEN_MAX) -artifact_prefix=$(CACHE)/fuzz-artifacts/ -print_final_stats=1

SETUP_TARGETS += setup-fuzz
TEST_TARGETS += test-fuzz

.PHONY: setup-fuzz fuzz-build fuzz-seeds fuzz test-fuzz
setup-fuzz: setup-rust ## cargo-fuzz into $(CACHE)/cargo-bin (idempotent)
	@scripts/apt-ensure.sh build-essential
	@if [ "$$($(FUZZ_BIN)/cargo-fuzz --version 2>/dev/null)" != "cargo-fuzz $(CARGO_FUZZ_VERSION)" ]; then \
	  nice -n 10 $(CARGO) install --locked --root $(CACHE)/cargo-bin --version $(CARGO_FUZZ_VERSION) cargo-fuzz; fi

fuzz-build: setup-fuzz
	cd $(FUZZ_DIR) && $(FUZZ_ENV) nice -n 10 cargo fuzz build decode $(FUZZ_CARGO_ARGS)

# Deterministic seed corpus: valid encodings of every target.
fuzz-seeds: setup-fuzz
	cd $(FUZZ_DIR) && nice -n 10 $(CARGO) run --locked -q --bin seeds --target-dir $(FUZZ_TARGET_DIR) -- $(FUZZ_CORPUS)/seeds

fuzz: fuzz-build fuzz-seeds ## fuzz the XDR decoders for FUZZ_SECONDS (default 600), corpus kept in $(CACHE)
	@mkdir -p $(FUZZ_CORPUS)/main $(CACHE)/fuzz-artifacts
	cd $(FUZZ_DIR) && $(FUZZ_ENV) cargo fuzz run decode $(FUZZ_CARGO_ARGS) $(FUZZ_CORPUS)/main $(FUZZ_CORPUS)/seeds -- \
	  -max_total_time=$(FUZZ_SECONDS) $(FUZZ_LIBFUZZER_ARGS)

test-fuzz: fuzz-build ## fuzz harness tests + a bounded fuzz run from the seed corpus
	cd $(FUZZ_DIR) && nice -n 10 $(CARGO) test --locked --target-dir $(FUZZ_TARGET_DIR) 2>&1 | tee $(CACHE)/last-fuzz-test.log | grep -E '^(test result|running|error|failures|---- )'
	@grep -q '^test result: ok' $(CACHE)/last-fuzz-test.log && ! grep -qE '^test result: FAILED|^error' $(CACHE)/last-fuzz-test.log
	@$(MAKE) --no-print-directory fuzz-seeds
	@rm -rf $(FUZZ_CORPUS)/smoke && mkdir -p $(FUZZ_CORPUS)/smoke $(CACHE)/fuzz-artifacts
	cd $(FUZZ_DIR) && $(FUZZ_ENV) cargo fuzz run decode $(FUZZ_CARGO_ARGS) $(FUZZ_CORPUS)/smoke $(FUZZ_CORPUS)/seeds -- \
	  -seed=1 -max_total_time=$(FUZZ_SMOKE_SECONDS) $(FUZZ_LIBFUZZER_ARGS) > $(CACHE)/last-fuzz-run.log 2>&1 \
	  || { tail -40 $(CACHE)/last-fuzz-run.log; echo "test-fuzz: FAILED, reproducer in $(CACHE)/fuzz-artifacts"; exit 1; }
	@grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units)' $(CACHE)/last-fuzz-run.log
	@grep -qE '^Done [1-9][0-9]* runs' $(CACHE)/last-fuzz-run.log || { echo "test-fuzz: no fuzz runs happened"; exit 1; }
	@echo "test-fuzz: ok"
