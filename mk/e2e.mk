# The real end-to-end (e2e/kube): a real kubelet node inside the QEMU guest,
# the control plane on this host. Kubernetes binaries come from
# hack/build-k8s.sh, our images from `make images` (mk/images.mk); the node's
# root disk and images disk are cached under $(CACHE)/kube/.
#   e2e             one boot, two tests: TestNodeSmoke (preloaded-image pods,
#                   logs/exec) then TestRealNode (helm install -> CSI
#                   registration through the kubelet -> ChimeraCluster -> PVC
#                   -> fio Job -> engine fio Job -> RWX reader -> teardown,
#                   then the rolling upgrade of a durable cluster under a fio
#                   verify Job, timed). In TEST_TARGETS.
#   e2e-rollout     the same with the rolling upgrade repeated ROLLOUTS times
#                   (default 3) in the one boot: its reliability
#   test-kube-node  the smoke tests alone, with the chart's CSI registration
#                   on its own (TestNodeSmokeChart; quicker, for harness work)

KUBE_E2E_SPACE := $(subst ,, )
KUBE_E2E := e2e/kube
KUBE_CACHE := $(CACHE)/kube
KUBE_SIDECAR_BIN := $(KUBE_CACHE)/chimera-e2e-sidecar
KUBE_SIDECARS_TAR := $(KUBE_CACHE)/sidecars.tar
KUBE_E2E_TEST := $(KUBE_CACHE)/kube-e2e.test
# Whole run (boot, flow, teardown) on a loaded 2-core host under TCG; the
# test binary's own budget sits below it.
KUBE_E2E_TIMEOUT_S ?= 2100
KUBE_E2E_IMAGES = $(IMAGES_OUT)/pause.tar $(IMAGES_OUT)/chimera-fio.tar $(IMAGES_OUT)/chimera-fio-engine.tar $(IMAGES_OUT)/chimera-operator.tar \
  $(IMAGES_OUT)/chimera-csi.tar $(IMAGES_OUT)/chimerad.tar $(KUBE_SIDECARS_TAR)

# test-docs: the README's deploy path (its `sh deploy:<step>` blocks, which
# TestRealNode runs) checked without a cluster: blocks present, files and
# Dockerfile targets named exist, samples parse, images match the defaults.
TEST_TARGETS += test-docs e2e

# $(1): the tests to run (space-separated, in one boot), $(2): the log's
# name. Prints the steps, the timelines and go test's verdict; fails unless
# every named test PASSed (a skip is a failure).
define kube_e2e_run
	@for f in $(KUBE_E2E_IMAGES); do [ -s $$f ] || { echo "$(2): image archive $$f missing (make images)"; exit 1; }; done
	@set +e; cd $(KUBE_E2E) && IMAGES="$(KUBE_E2E_IMAGES)" GUEST_MEM_MB=3072 PV_DISK_MB=$$((1024 + 3072 * $(or $(CHIMERA_E2E_ROLLOUT),0))) \
	  HELM=$(CACHE)/bin/helm KUBECTL=$(K8S_ASSETS)/kubectl CHIMERA_REPO=$(CURDIR) NODE_SHARE=$(KUBE_CACHE)/run/share \
	  CHIMERA_KUBE_E2E=1 CHIMERA_E2E_ROLLOUT=$(CHIMERA_E2E_ROLLOUT) timeout -k 20 $(KUBE_E2E_TIMEOUT_S) ./run.sh $(KUBE_E2E_TEST) -test.v -test.count=1 \
	  -test.run '^($(subst $(KUBE_E2E_SPACE),|,$(strip $(1))))$$' -test.timeout $$(($(KUBE_E2E_TIMEOUT_S) / 60 - 3))m > $(CACHE)/last-$(2).log 2>&1; rc=$$?; set -e; \
	  log=$(CACHE)/last-$(2).log; \
	  grep -E '^kube-e2e:|STEP |FLEXFILES-CHECK|^ +[0-9.]+s +\+|timeline|^(    )?--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)$$|^panic:' $$log; \
	  for t in $(1); do grep -q -- "^--- PASS: $$t " $$log || { echo "$(2): $$t did not pass (rc $$rc; full log: $$log, cluster logs: $(KUBE_CACHE)/run)"; exit 1; }; done; \
	  [ $$rc -eq 0 ] || { echo "$(2): FAILED (rc $$rc; full log: $$log)"; exit 1; }; \
	  echo "$(2): PASS (full log: $$log)"
endef

.PHONY: e2e e2e-rollout e2e-setup e2e-node test-kube-node test-docs
test-docs: ## the README's "Deploy on Kubernetes" blocks: present, files exist, samples parse (no cluster)
	@mkdir -p $(CACHE)
	nice -n 10 $(GO) test -count=1 -v -run '^TestDeployDocs$$' ./$(KUBE_E2E) > $(CACHE)/last-docs-test.log 2>&1; rc=$$?; \
	  grep -E '^(--- |ok |FAIL|PASS$$)|_test.go:' $(CACHE)/last-docs-test.log; \
	  [ $$rc -eq 0 ] && grep -q '^--- PASS: TestDeployDocs' $(CACHE)/last-docs-test.log || { echo "test-docs: TestDeployDocs did not pass (or did not run): $(CACHE)/last-docs-test.log"; exit 1; }

e2e-setup: setup-operator ## the real-node e2e's tools: kubelet, kubectl, controller-manager, scheduler, helm, sidecar stand-ins
	hack/tools.sh helm
	nice -n 10 hack/build-k8s.sh kube-controller-manager kube-scheduler kubelet kubectl
	@mkdir -p $(KUBE_CACHE)
	CGO_ENABLED=0 nice -n 10 $(GO) build -trimpath -ldflags "-s -w" -o $(KUBE_SIDECAR_BIN) ./$(KUBE_E2E)/sidecars
	$(KUBE_E2E)/sidecar-images.sh $(KUBE_SIDECAR_BIN) $(KUBE_SIDECARS_TAR)
	nice -n 10 $(GO) test -c -o $(KUBE_E2E_TEST) ./$(KUBE_E2E)

e2e-node: e2e-setup ## boot the cluster (control plane + guest node) and keep it up until Ctrl-C
	IMAGES="$(wildcard $(KUBE_E2E_IMAGES))" $(KUBE_E2E)/run.sh -k

test-kube-node: e2e-setup images ## a real kubelet node in the QEMU guest: preloaded-image pods, logs, exec, CSI registration
	$(call kube_e2e_run,TestNodeSmoke TestNodeSmokeChart,test-kube-node)

# The rolling upgrade (rollout_e2e_test.go, ~4 minutes a run) is the
# flow's last step: CHIMERA_E2E_ROLLOUT is how many times it runs (each on
# fresh volumes: ~3 GiB of diskfs images a run on the guest's sparse PV disk,
# sized to fit). e2e runs it once; e2e-rollout ROLLOUTS=N, N times.
CHIMERA_E2E_ROLLOUT ?= 1
ROLLOUTS ?= 3
e2e-rollout: CHIMERA_E2E_ROLLOUT = $(ROLLOUTS)
e2e e2e-rollout: KUBE_E2E_TIMEOUT_S = $(shell echo $$((2100 + 300 * $(CHIMERA_E2E_ROLLOUT))))
e2e-rollout: test-docs e2e-setup images ## e2e with the rolling upgrade repeated ROLLOUTS times (default 3) in one boot
	$(call kube_e2e_run,TestNodeSmoke TestRealNode,e2e-rollout)

e2e: test-docs e2e-setup images ## real kubelet node in the QEMU guest: smoke, then helm install -> ChimeraCluster -> PVC -> fio Job -> teardown, then a rolling upgrade under fio, timed
	$(call kube_e2e_run,TestNodeSmoke TestRealNode,e2e)
