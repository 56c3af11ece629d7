# The real end-to-end (e2e/kube): helm install -> ChimeraCluster -> PVC -> fio
# Job on a real kubelet node inside the QEMU guest, the control plane on this
# host. Kubernetes binaries come from hack/build-k8s.sh, our images from
# `make images` (mk/images.mk), the node's root disk and images disk are
# cached under $(CACHE)/kube/.

KUBE_E2E := e2e/kube
KUBE_CACHE := $(CACHE)/kube
KUBE_SIDECAR_BIN := $(KUBE_CACHE)/chimera-e2e-sidecar
KUBE_SIDECARS_TAR := $(KUBE_CACHE)/sidecars.tar
KUBE_E2E_TEST := $(KUBE_CACHE)/kube-e2e.test
# Whole run (boot, flow, teardown); the test's own budget is below it.
KUBE_E2E_TIMEOUT_S ?= 1500
KUBE_E2E_IMAGES = $(IMAGES_OUT)/pause.tar $(IMAGES_OUT)/chimera-fio.tar $(IMAGES_OUT)/chimera-operator.tar \
  $(IMAGES_OUT)/chimera-csi.tar $(IMAGES_OUT)/chimerad.tar $(KUBE_SIDECARS_TAR)

# Not in TEST_TARGETS yet: see e2e/kube/README.md ("Status").

.PHONY: e2e e2e-setup e2e-node
e2e-setup: setup-operator ## the real-node e2e's tools: kubelet, kubectl, controller-manager, scheduler, helm, sidecar stand-ins
	hack/tools.sh helm
	nice -n 10 hack/build-k8s.sh kube-controller-manager kube-scheduler kubelet kubectl
	@mkdir -p $(KUBE_CACHE)
	CGO_ENABLED=0 nice -n 10 $(GO) build -trimpath -ldflags "-s -w" -o $(KUBE_SIDECAR_BIN) ./$(KUBE_E2E)/sidecars
	$(KUBE_E2E)/sidecar-images.sh $(KUBE_SIDECAR_BIN) $(KUBE_SIDECARS_TAR)
	nice -n 10 $(GO) test -c -o $(KUBE_E2E_TEST) ./$(KUBE_E2E)

e2e-node: e2e-setup ## boot the cluster (control plane + guest node) and keep it up until Ctrl-C
	IMAGES="$(wildcard $(KUBE_E2E_IMAGES))" $(KUBE_E2E)/run.sh -k

e2e: e2e-setup images ## helm install -> ChimeraCluster -> PVC -> fio Job on a real kubelet in the QEMU guest, timed
	@for f in $(KUBE_E2E_IMAGES); do [ -s $$f ] || { echo "e2e: image archive $$f missing (make images)"; exit 1; }; done
	@set +e; cd $(KUBE_E2E) && IMAGES="$(KUBE_E2E_IMAGES)" GUEST_MEM_MB=3072 \
	  HELM=$(CACHE)/bin/helm KUBECTL=$(K8S_ASSETS)/kubectl CHIMERA_REPO=$(CURDIR) NODE_SHARE=$(KUBE_CACHE)/run/share \
	  CHIMERA_KUBE_E2E=1 timeout -k 20 $(KUBE_E2E_TIMEOUT_S) ./run.sh $(KUBE_E2E_TEST) -test.v -test.count=1 -test.timeout 22m \
	  > $(CACHE)/last-kube-e2e.log 2>&1; rc=$$?; set -e; \
	  log=$(CACHE)/last-kube-e2e.log; \
	  grep -E '^kube-e2e:|STEP |FLEXFILES-CHECK|^\s+[0-9.]+s  \+|timeline|^(    )?--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)$$|^panic:' $$log; \
	  grep -q -- '^--- PASS: TestRealNode ' $$log || { echo "e2e: FAILED (rc $$rc; full log: $$log, cluster logs: $(KUBE_CACHE)/run)"; exit 1; }; \
	  [ $$rc -eq 0 ] || { echo "e2e: FAILED (rc $$rc; full log: $$log)"; exit 1; }; \
	  echo "e2e: PASS (full log: $$log)"
