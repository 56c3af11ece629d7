# Go control plane: ChimeraCluster API (api/), the operator (operator/), the Helm
# chart (charts/chimera) and kustomize config (config/). Tools and Kubernetes
# binaries are built once into $(CACHE) by the hack/ scripts.

OPERATOR_BIN := bin/chimera-operator
CONTROLLER_GEN := $(CACHE)/bin/controller-gen
K8S_ASSETS := $(CACHE)/k8s/v1.34.4
# Bounds the whole Go test run: envtest starts a real apiserver per package.
OPERATOR_TEST_TIMEOUT ?= 15m

SETUP_TARGETS += setup-operator
BUILD_TARGETS += build-operator
TEST_TARGETS += test-operator test-chart

.PHONY: setup-operator generate build-operator test-operator test-chart
setup-operator: ## controller-gen, helm, kubeconform, kube-apiserver and etcd (built from the Go module proxy, cached)
	@command -v $(GO) >/dev/null || { echo "go not found: install Go 1.26"; exit 1; }
	hack/tools.sh controller-gen helm kubeconform
	nice -n 10 hack/build-k8s.sh etcd kube-apiserver

generate: ## regenerate deepcopy, the CRD and RBAC/webhook manifests from the Go markers (and the chart's copies)
	hack/tools.sh controller-gen
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=chimera-operator webhook paths=./operator/... \
	  output:rbac:artifacts:config=config/rbac output:webhook:artifacts:config=config/webhook
	mkdir -p charts/chimera/crds charts/chimera/files && cp config/crd/bases/*.yaml charts/chimera/crds/
	sed -n '/^rules:/,$$p' config/rbac/role.yaml | tail -n +2 > charts/chimera/files/operator-clusterrole-rules.yaml

build-operator: ## build the operator binary into bin/
	CGO_ENABLED=0 nice -n 10 $(GO) build -o $(OPERATOR_BIN) ./operator/cmd/chimera-operator

# The rendered chimerad config is checked by the real chimerad (--check-config),
# and the envtest suite pushes the DS list to a real chimerad's admin API.
test-operator: setup-operator build-dataplane ## unit tests, generated-file staleness, envtest on a real apiserver + chimerad
	@mkdir -p $(CACHE)
	@set +e; CONTROLLER_GEN=$(CONTROLLER_GEN) KUBEBUILDER_ASSETS=$(K8S_ASSETS) CHIMERA_REQUIRE_ENVTEST=1 \
	  CHIMERAD=$(CHIMERAD) CHIMERA_REQUIRE_CHIMERAD=1 \
	  nice -n 10 $(GO) test -count=1 -timeout $(OPERATOR_TEST_TIMEOUT) -v ./api/... ./operator/... ./internal/... > $(CACHE)/last-operator-test.log 2>&1; rc=$$?; set -e; \
	  log=$(CACHE)/last-operator-test.log; \
	  grep -E '^(    )?--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)|^panic:' $$log; \
	  passed=$$(grep -c -- '^--- PASS' $$log || true); failed=$$(grep -c -- '--- FAIL' $$log || true); \
	  echo "test-operator: $$passed top-level tests passed, $$failed failed (full log: $$log)"; \
	  if [ $$rc -ne 0 ] || [ $$failed -ne 0 ]; then echo "test-operator: FAILED"; exit 1; fi; \
	  for t in TestGeneratedFilesUpToDate TestRenderedConfigPassesChimerad TestInvalidSpecsAreRejectedNamingTheField TestStorageAddressesReachTheMDSAndConditionsProgress \
	           TestExportClientsFollowNodes TestStartScript TestAccessInConfigButNotInHash \
	           TestRolloutImageChangeRollsDataServersOneAtATimeThenTheMDS TestRolloutStopsAtADataServerThatNeverBecomesReady \
	           TestRolloutOfAConfigChangeLeavesAMemfsMDSUntilOptedIn TestRolloutStopsWhenTheMDSRefusesTheDrain TestRevisionFollowsImageAndConfigOnly \
	           TestAdminCertificateFromCertManager TestAdminCertificate TestAdminTLSSecretProblem; do \
	    grep -q -- "^--- PASS: $$t " $$log || { echo "test-operator: $$t did not run (skipped?)"; exit 1; }; done

test-chart: ## helm lint + kubeconform (strict, offline schemas, our CRD) over the chart, config/ and its kustomize renders
	hack/tools.sh helm kubeconform
	nice -n 10 hack/build-k8s.sh kubectl
	hack/test-chart.sh

# Whole-cluster test on fake nodes: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler (e2e/fakecluster/controlplane.sh, apiserver on 127.0.0.1:16443,
# etcd 12379/12380), kwok nodes, helm, kubectl, the operator binary, chimera-csi
# and chimerad; ~1-2 min warm. controlplane.sh stop runs whatever happens, and
# kills every process the test left a pid file for in FAKECLUSTER_DIR.
KWOK_STAGES := $(CACHE)/kwok-v0.8.0-stages.yaml
FAKECLUSTER_DIR := $(CACHE)/fakecluster-run
FAKECLUSTER_TIMEOUT ?= 8m
TEST_TARGETS += e2e-fakecluster
.PHONY: e2e-fakecluster
e2e-fakecluster: setup-operator build-operator build-csi build-dataplane ## helm install + ChimeraCluster + PVC on kwok fake nodes with a real scheduler, GC and webhook
	hack/tools.sh kwok helm
	nice -n 10 hack/build-k8s.sh etcd kube-apiserver kube-controller-manager kube-scheduler kubectl
	hack/kwok-stages.sh $(KWOK_STAGES)
	@e2e/fakecluster/controlplane.sh stop $(FAKECLUSTER_DIR) >/dev/null; rm -rf $(FAKECLUSTER_DIR); mkdir -p $(FAKECLUSTER_DIR)
	@set +e; log=$(CACHE)/last-fakecluster.log; \
	  CHIMERA_K8S_BIN=$(K8S_ASSETS) KWOK=$(CACHE)/bin/kwok KWOK_STAGES=$(KWOK_STAGES) HELM=$(CACHE)/bin/helm \
	  KUBECTL=$(K8S_ASSETS)/kubectl CHIMERAD=$(CHIMERAD) CHIMERA_OPERATOR=$(CURDIR)/$(OPERATOR_BIN) CHIMERA_CSI=$(CSI_BIN) \
	  FAKECLUSTER_DIR=$(FAKECLUSTER_DIR) CHIMERA_REQUIRE_FAKECLUSTER=1 \
	  nice -n 10 $(GO) test -count=1 -timeout $(FAKECLUSTER_TIMEOUT) -v ./e2e/fakecluster/... > $$log 2>&1; rc=$$?; \
	  e2e/fakecluster/controlplane.sh stop $(FAKECLUSTER_DIR) >/dev/null; set -e; \
	  grep -E '^(    )?--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)|^panic:|webhook refused|Bound to|data-server list' $$log; \
	  grep -q -- '^--- PASS: TestFakeCluster ' $$log || { echo "e2e-fakecluster: FAILED (log: $$log, processes' logs: $(FAKECLUSTER_DIR))"; exit 1; }; \
	  [ $$rc -eq 0 ] && echo "e2e-fakecluster: passed"
