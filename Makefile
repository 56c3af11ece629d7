# Chimera — the entry point for everything. `make help` lists the targets.
#
# Each area contributes a fragment under mk/ that appends to the lists below;
# this file only wires them together.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# Slow artefacts (tools, Kubernetes binaries, fio, the guest image) live here,
# outside the repository, and are reused across clean clones.
CACHE ?= $(HOME)/.cache/chimera-test
export CACHE
CARGO ?= cargo
CARGO_TARGET_DIR ?= $(CURDIR)/dataplane/target
export CARGO_TARGET_DIR
GO ?= go

SETUP_TARGETS :=
BUILD_TARGETS :=
TEST_TARGETS :=

include $(sort $(wildcard mk/*.mk))

.PHONY: help setup build test run fuzz
help: ## list targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

setup: $(SETUP_TARGETS) ## install everything the build and tests need (idempotent)

build: $(BUILD_TARGETS) ## build every component

# The suites build the dataplane without cross-crate (thin) LTO and without
# debug info: each of the workspace's ~40 test binaries links the whole
# dependency tree, and LTO plus debug info made those links most of the
# suite's time (a cold workspace test build: ~18 min → ~7 on 2 cores).
# Optimisation stays at the release level. `make bench`, `make run` and the
# images keep the release profile as dataplane/Cargo.toml sets it.
test test-% e2e e2e-%: export CARGO_PROFILE_RELEASE_LTO := false
test test-% e2e e2e-%: export CARGO_PROFILE_RELEASE_DEBUG := 0

# One suite after the other, stopping at the first that fails (named); the
# time each took is printed at the end, so growth shows up in CI logs.
test: ## run every test suite (what CI runs)
	@t0=$$(date +%s); times=""; \
	for t in $(TEST_TARGETS); do \
	  s=$$(date +%s); \
	  $(MAKE) --no-print-directory $$t || { echo "make test: suite $$t FAILED after $$(( $$(date +%s) - s )) s (passed before it:$$times)"; exit 1; }; \
	  times="$$times $$t=$$(( $$(date +%s) - s ))s"; \
	done; \
	echo "make test: suite times:$$times"; \
	echo "make test: all suites passed in $$(( $$(date +%s) - t0 )) s: $(TEST_TARGETS)"
