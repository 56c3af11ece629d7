# CSI driver csi.chimera.io (csi/): build, unit tests, csi-sanity.

CSI_BIN := $(CURDIR)/bin/chimera-csi
CSI_VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# The admin API csi-sanity provisions through: `chimerad` (the real server,
# built by build-dataplane) or `fake` (the in-process contract fake).
CSI_ADMIN_BACKEND ?= chimerad
# Bounds one run of the CSI suites; they take seconds.
CSI_TEST_TIMEOUT ?= 10m

BUILD_TARGETS += build-csi
TEST_TARGETS += test-csi

# Recursive (=): CHIMERAD comes from mk/dataplane.mk, included after this file.
ifeq ($(CSI_ADMIN_BACKEND),chimerad)
CSI_TEST_DEPS := build-dataplane
CSI_TEST_ENV = CHIMERAD=$(CHIMERAD) CHIMERA_CSI_REQUIRE_CHIMERAD=1
else
CSI_TEST_DEPS :=
CSI_TEST_ENV :=
endif

.PHONY: build-csi test-csi
build-csi: ## build the CSI driver binary into bin/chimera-csi
	@command -v $(GO) >/dev/null || { echo "go not found: install Go 1.26"; exit 1; }
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(CSI_VERSION)" -o $(CSI_BIN) ./csi/cmd/chimera-csi

test-csi: build-csi $(CSI_TEST_DEPS) ## CSI unit tests, chart render checks, csi-sanity against chimerad (CSI_ADMIN_BACKEND=fake for the fake)
	@mkdir -p $(CACHE)
	hack/tools.sh helm
	@echo "test-csi: admin API backend: $(CSI_ADMIN_BACKEND)"
	@set +e; $(CSI_TEST_ENV) HELM=$(CACHE)/bin/helm CHIMERA_CSI_REQUIRE_HELM=1 nice -n 10 $(GO) test -count=1 -timeout $(CSI_TEST_TIMEOUT) -v ./csi/... > $(CACHE)/last-csi-test.log 2>&1; rc=$$?; set -e; \
	  grep -E '^(=== RUN|--- (PASS|FAIL|SKIP)|PASS|FAIL|ok |panic:)|admin API backend|skipping sanity|^Ran [0-9]+ of|(SUCCESS|FAIL)! --' $(CACHE)/last-csi-test.log | grep -v '^=== RUN' ; \
	  passed=$$(grep -c -- '^--- PASS' $(CACHE)/last-csi-test.log || true); \
	  failed=$$(grep -c -- '--- FAIL' $(CACHE)/last-csi-test.log || true); \
	  echo "test-csi: $$passed top-level tests passed, $$failed failed (full log: $(CACHE)/last-csi-test.log)"; \
	  if [ $$rc -ne 0 ] || [ $$failed -ne 0 ]; then echo "test-csi: FAILED"; exit 1; fi; \
	  if [ $$passed -eq 0 ]; then echo "test-csi: no tests ran"; exit 1; fi

# mountMode sidecar end to end on this host (root, /dev/fuse): the node
# plugin's real /dev/fuse mounts handed to the real chimera-fuse --sidecar-dir
# over chimerad (csi/pkg/driver/sidecar_fuse_test.go; seconds).
TEST_TARGETS += test-csi-sidecar
.PHONY: test-csi-sidecar
test-csi-sidecar: build-dataplane build-fuse ## the node plugin's sidecar mode with the real kernel FUSE and chimera-fuse (root, /dev/fuse)
	CHIMERAD=$(CHIMERAD) CHIMERA_FUSE=$(CHIMERA_FUSE) CHIMERA_REQUIRE_FUSE=1 nice -n 10 $(GO) test -count=1 -timeout 2m -v -run '^TestSidecarRealFuse$$' ./csi/pkg/driver/

# Real kernel NFS mounts: the node plugin in the QEMU guest (e2e/guest) against
# chimerad on the host; ~2-4 minutes once the guest image is cached.
TEST_TARGETS += test-csi-guest
.PHONY: test-csi-guest
test-csi-guest: build-csi build-dataplane ## the node plugin in the QEMU guest: kernel NFSv4.1 mounts of a volume on chimerad
	nice -n 10 csi/test/guest/run.sh $(CHIMERAD) $(CSI_BIN)
