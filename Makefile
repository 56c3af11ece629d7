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

test: $(TEST_TARGETS) ## run every test suite (what CI runs)
	@echo "make test: all suites passed: $(TEST_TARGETS)"
