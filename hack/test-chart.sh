#!/usr/bin/env bash
# Validates the Helm chart and every manifest under config/ offline:
#   1. charts/chimera/crds and files/ are in sync with config/ (make generate),
#   2. helm lint --strict,
#   3. kubeconform -strict over the rendered chart (default values, with
#      cert-manager, with non-default networkPolicy values) and every YAML
#      file in config/, against Kubernetes 1.34 schemas and our CRD (hack/kubeconform-schemas.py prepares them),
#   4. every kustomization under config/ renders (kubectl kustomize, the
#      Kubernetes-version kubectl built by hack/build-k8s.sh) and the result
#      passes kubeconform too,
#   5. the check can fail: a manifest with an unknown field must be rejected.
# Prints kubeconform's summary lines; exits non-zero on any failure.
set -euo pipefail

CACHE="${CACHE:-$HOME/.cache/chimera-test}"
HELM="${HELM:-$CACHE/bin/helm}"
KUBECONFORM="${KUBECONFORM:-$CACHE/bin/kubeconform}"
KUBECTL="${KUBECTL:-$CACHE/k8s/v1.34.4/kubectl}"
K8S_SCHEMA_VERSION=1.34.0
WHEEL_VERSION=1.37.0
SCHEMAS="$CACHE/kubeconform-schemas"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

fail() { echo "test-chart: FAILED: $*" >&2; exit 1; }

# 1. generated copies in sync
diff -r config/crd/bases charts/chimera/crds >/dev/null || fail "charts/chimera/crds differs from config/crd/bases: run make generate"
sed -n '/^rules:/,$p' config/rbac/role.yaml | tail -n +2 | diff - charts/chimera/files/operator-clusterrole-rules.yaml >/dev/null \
  || fail "charts/chimera/files/operator-clusterrole-rules.yaml differs from config/rbac/role.yaml: run make generate"
echo "test-chart: generated copies in sync"

# 2. lint
"$HELM" lint --strict charts/chimera
echo "test-chart: helm lint passed"

# 3. schemas (cached, idempotent)
wheel="$CACHE/pypi/kubernetes_validate-$WHEEL_VERSION-py3-none-any.whl"
if [ ! -f "$wheel" ]; then
  mkdir -p "$CACHE/pypi"
  python3 -m pip download --quiet --no-deps --dest "$CACHE/pypi" "kubernetes-validate==$WHEEL_VERSION"
fi
python3 hack/kubeconform-schemas.py "$wheel" "$SCHEMAS" "$K8S_SCHEMA_VERSION" \
  config/crd/bases/*.yaml hack/schemas/*.yaml

"$HELM" template chimera charts/chimera --namespace chimera-system --include-crds > "$WORK/chart-default.yaml"
"$HELM" template chimera charts/chimera --namespace chimera-system --set webhook.certManager.enabled=true > "$WORK/chart-certmanager.yaml"
grep -q 'kind: Deployment' "$WORK/chart-default.yaml" || fail "rendered chart has no Deployment"

conform() {
  "$KUBECONFORM" -strict -summary -output text -kubernetes-version "$K8S_SCHEMA_VERSION" \
    -schema-location "$SCHEMAS/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -schema-location "$SCHEMAS/crds/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json" \
    "$@"
}
mapfile -t config_files < <(find config -name '*.yaml' ! -name kustomization.yaml | sort)
[ "${#config_files[@]}" -gt 5 ] || fail "found only ${#config_files[@]} files under config/"
conform "$WORK/chart-default.yaml" "${config_files[@]}"
# cert-manager kinds have no offline schema here: skipped, named.
conform -skip Certificate,Issuer "$WORK/chart-certmanager.yaml"
# The values the fake-cluster e2e installs with: StorageClass + webhook URL.
"$HELM" template chimera charts/chimera --namespace chimera-system --set webhook.url=https://127.0.0.1:9443 \
  --set 'csi.storageClasses[0].name=chimera' --set 'csi.storageClasses[0].clusterName=chimera' \
  --set 'csi.storageClasses[0].clusterNamespace=chimera' > "$WORK/chart-sc.yaml"
grep -q 'kind: StorageClass' "$WORK/chart-sc.yaml" || fail "rendered chart has no StorageClass with csi.storageClasses set"
conform "$WORK/chart-sc.yaml"
# Non-default NetworkPolicy values (selectors become JSON in the policy and the flags).
"$HELM" template chimera charts/chimera --namespace chimera-system --set 'networkPolicy.nfsClientCIDRs={100.64.0.0/16,fd00::/64}' \
  --set 'networkPolicy.metrics.namespaceSelector.matchLabels.kubernetes\.io/metadata\.name=monitoring' \
  --set 'networkPolicy.metrics.podSelector.matchLabels.app=prometheus' > "$WORK/chart-netpol.yaml"
grep -q -- '--network-policy-metrics-pods=' "$WORK/chart-netpol.yaml" || fail "networkPolicy.metrics values do not reach the operator"
conform "$WORK/chart-netpol.yaml"
# The device plugin's ConfigMap: NVMe (vfio-pci accelerators) and RoCE side by side, valid JSON.
"$HELM" template chimera charts/chimera --namespace chimera-system --set deviceplugin.config.enabled=true \
  --set 'deviceplugin.config.nvme.vendors={144d,8086}' > "$WORK/chart-deviceplugin.yaml"
conform "$WORK/chart-deviceplugin.yaml"
python3 - "$WORK/chart-deviceplugin.yaml" <<'PYCHECK' || fail "the device plugin's config.json is not what the chart promises"
import json, sys
docs = open(sys.argv[1]).read().split("\n---")
cm = [d for d in docs if "name: sriovdp-config" in d]
assert len(cm) == 1, "no sriovdp-config ConfigMap"
body = cm[0].split("config.json: |", 1)[1]
text = "\n".join(l[4:] for l in body.splitlines() if l.strip())
cfg = json.loads(text)
nvme, roce = cfg["resourceList"]
assert nvme["deviceType"] == "accelerator" and nvme["selectors"]["drivers"] == ["vfio-pci"], nvme
assert nvme["resourcePrefix"] + "/" + nvme["resourceName"] == "chimera.io/nvme", nvme
assert nvme["selectors"]["vendors"] == ["144d", "8086"], nvme
assert roce["selectors"]["isRdma"] is True and roce["resourceName"] == "roce_a", roce
PYCHECK
! grep -q sriovdp-config "$WORK/chart-default.yaml" || fail "the device plugin's ConfigMap renders by default"
echo "test-chart: kubeconform passed (chart default + cert-manager + StorageClass/webhook-URL + NetworkPolicy-values + device-plugin renders, ${#config_files[@]} files in config/)"

# 4. kustomizations render and validate
mapfile -t kdirs < <(find config -name kustomization.yaml -printf '%h\n' | sort)
[ "${#kdirs[@]}" -ge 5 ] || fail "found only ${#kdirs[@]} kustomizations under config/"
for d in "${kdirs[@]}"; do
  out="$WORK/kustomize-$(echo "$d" | tr / -).yaml"
  "$KUBECTL" kustomize "$d" > "$out" || fail "kubectl kustomize $d"
  grep -q '^kind:' "$out" || fail "kubectl kustomize $d rendered nothing"
done
conform "$WORK"/kustomize-*.yaml
grep -q '^kind: Deployment' "$WORK/kustomize-config-default.yaml" || fail "config/default renders no operator Deployment"
echo "test-chart: kustomize passed (${#kdirs[@]} kustomizations rendered and validated)"

# 5. the validation can fail
sed 's/^  storage:$/  storge:/' config/samples/storage_v1alpha1_chimeracluster_tcp_memfs.yaml > "$WORK/bad.yaml"
grep -q storge "$WORK/bad.yaml" || fail "could not build the negative sample"
if out=$(conform "$WORK/bad.yaml" 2>&1); then
  fail "kubeconform accepted a ChimeraCluster with an unknown field (spec.storge)"
fi
grep -q "additional properties 'storge' not allowed" <<<"$out" || fail "negative check failed for another reason: $out"
echo "test-chart: negative check passed (unknown field rejected)"
