# Go control plane: ChimeraCluster API (api/), the operator (operator/), the Helm
# chart (charts/chimera) and kustomize config (config/). Tools and Kubernetes
# binaries are built once into $(CACHE) by the hack/ scripts.

OPERATOR_BIN := bin/chimera-operator
CONTROLLER_GEN := $(CACHE)/bin/controller-gen
HELM := $(CACHE)/bin/helm
KUBECONFORM := $(CACHE)/bin/kubeconform
K8S_ASSETS := $(CACHE)/k8s/v1.34.4
# Bounds the whole Go test run: envtest starts a real apiserver per package.
OPERATOR_TEST_TIMEOUT ?= 15m

SETUP_TARGETS += setup-operator
BUILD_TARGETS += build-operator
TEST_TARGETS += test-operator

.PHONY: setup-operator generate build-operator test-operator test-chart setup-chart
setup-operator: ## controller-gen, kube-apiserver and etcd (built from the Go module proxy, cached)
	@command -v $(GO) >/dev/null || { echo "go not found: install Go 1.26"; exit 1; }
	hack/tools.sh controller-gen
	hack/build-k8s.sh etcd kube-apiserver

generate: ## regenerate deepcopy, the CRD and RBAC/webhook manifests from the Go markers
	hack/tools.sh controller-gen
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=chimera-operator webhook paths=./operator/... \
	  output:rbac:artifacts:config=config/rbac output:webhook:artifacts:config=config/webhook
	mkdir -p charts/chimera/crds charts/chimera/files && cp config/crd/bases/*.yaml charts/chimera/crds/
	sed -n '/^rules:/,$$p' config/rbac/role.yaml | tail -n +2 > charts/chimera/files/operator-clusterrole-rules.yaml

build-operator: ## build the operator binary into bin/
	CGO_ENABLED=0 nice -n 10 $(GO) build -o $(OPERATOR_BIN) ./operator/cmd/chimera-operator

test-operator: setup-operator ## unit tests, generated-file staleness check, envtest on a real apiserver
	@mkdir -p $(CACHE)
	CONTROLLER_GEN=$(CONTROLLER_GEN) KUBEBUILDER_ASSETS=$(K8S_ASSETS) CHIMERA_REQUIRE_ENVTEST=1 \
	  nice -n 10 $(GO) test -count=1 -timeout $(OPERATOR_TEST_TIMEOUT) -v ./api/... ./operator/... 2>&1 \
	  | tee $(CACHE)/last-operator-test.log | grep -E '^(--- |ok |FAIL|PASS|panic)' ; \
	  log=$(CACHE)/last-operator-test.log; \
	  pass=$$(grep -c -- '^--- PASS' $$log || true); fail=$$(grep -cE -- '^(--- FAIL|FAIL|panic)' $$log || true); \
	  echo "test-operator: $$pass passed, $$fail failed"; \
	  grep -q -- '--- PASS: TestGeneratedFilesUpToDate' $$log || { echo "test-operator: staleness test did not run"; exit 1; }; \
	  [ "$$pass" -gt 0 ] && [ "$$fail" -eq 0 ]
