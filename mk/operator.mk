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
	CGO_ENABLED=0 nice -n 10 $(GO) build -trimpath -o $(OPERATOR_BIN) ./operator/cmd/chimera-operator

# The rendered chimerad config is checked by the real chimerad (--check-config),
# and the envtest suite pushes the DS list to a real chimerad's admin API.
test-operator: setup-operator build-dataplane ## unit tests, generated-file staleness, envtest on a real apiserver + chimerad
	@mkdir -p $(CACHE)
	@set +e; CONTROLLER_GEN=$(CONTROLLER_GEN) KUBEBUILDER_ASSETS=$(K8S_ASSETS) CHIMERA_REQUIRE_ENVTEST=1 \
	  CHIMERAD=$(CHIMERAD) CHIMERA_REQUIRE_CHIMERAD=1 \
	  nice -n 10 $(GO) test -count=1 -timeout $(OPERATOR_TEST_TIMEOUT) -v ./api/... ./operator/... > $(CACHE)/last-operator-test.log 2>&1; rc=$$?; set -e; \
	  log=$(CACHE)/last-operator-test.log; \
	  grep -E '^(    )?--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)|^panic:' $$log; \
	  passed=$$(grep -c -- '^--- PASS' $$log || true); failed=$$(grep -c -- '--- FAIL' $$log || true); \
	  echo "test-operator: $$passed top-level tests passed, $$failed failed (full log: $$log)"; \
	  if [ $$rc -ne 0 ] || [ $$failed -ne 0 ]; then echo "test-operator: FAILED"; exit 1; fi; \
	  for t in TestGeneratedFilesUpToDate TestRenderedConfigPassesChimerad TestInvalidSpecsAreRejectedNamingTheField TestStorageAddressesReachTheMDSAndConditionsProgress; do \
	    grep -q -- "^--- PASS: $$t " $$log || { echo "test-operator: $$t did not run (skipped?)"; exit 1; }; done

test-chart: ## helm lint + kubeconform (strict, offline schemas, our CRD) over the chart and config/
	hack/tools.sh helm kubeconform
	hack/test-chart.sh
