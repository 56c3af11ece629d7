#!/usr/bin/env bash
# The chart's alert rules, checked the way Prometheus will read them:
#   1. promtool check rules on charts/chimera/files/prometheus-rules.yaml,
#   2. promtool test rules on rules-test.yaml (unit tests of every alert),
#   3. every alert has a test where it fires and one where it stays silent,
#   4. the PrometheusRule the chart renders carries exactly those groups,
#   5. the check can fail: a copy of the rules with the capacity threshold
#      moved from 85 % to 95 % must fail the unit tests,
#   6. every query of the Grafana dashboard parses as PromQL (promtool check
#      rules over recording rules made of them, Grafana's $__rate_interval
#      replaced by 5m), and a broken query is caught.
# Needs promtool (Debian package prometheus), helm ($HELM) and python3-yaml.
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE="${CACHE:-$HOME/.cache/chimera-test}"
HELM="${HELM:-$CACHE/bin/helm}"
PROMTOOL="${PROMTOOL:-promtool}"
RULES=charts/chimera/files/prometheus-rules.yaml
TESTS=e2e/monitoring/rules-test.yaml
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "test-monitoring: FAILED: $*" >&2; exit 1; }

"$PROMTOOL" check rules "$RULES"
"$PROMTOOL" test rules "$TESTS"

python3 - "$RULES" "$TESTS" <<'PY'
import sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
tests = yaml.safe_load(open(sys.argv[2]))
alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
fires, silent = set(), set()
for t in tests["tests"]:
    for a in t.get("alert_rule_test", []):
        (fires if a.get("exp_alerts") else silent).add(a["alertname"])
unknown = (fires | silent) - set(alerts)
assert not unknown, f"tests name alerts the rules do not have: {sorted(unknown)}"
missing = [a for a in alerts if a not in fires or a not in silent]
assert not missing, f"alerts without a firing and a silent unit test: {missing}"
print(f"test-monitoring: {len(alerts)} alerts, each with a firing and a silent unit test")
PY

"$HELM" template chimera charts/chimera --namespace chimera-system \
  --api-versions monitoring.coreos.com/v1/PrometheusRule > "$WORK/chart.yaml"
python3 - "$WORK/chart.yaml" "$RULES" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
prs = [d for d in docs if d.get("kind") == "PrometheusRule"]
assert len(prs) == 1, f"want one PrometheusRule, got {len(prs)}"
assert prs[0]["spec"] == yaml.safe_load(open(sys.argv[2])), "the rendered PrometheusRule differs from the rule file"
print("test-monitoring: the rendered PrometheusRule carries the rule file unchanged")
PY

# 5. negative: a wrong threshold must be caught by the unit tests.
mkdir -p "$WORK/e2e/monitoring" "$WORK/charts/chimera/files"
sed 's/> 0\.85$/> 0.95/' "$RULES" > "$WORK/$RULES"
cmp -s "$RULES" "$WORK/$RULES" && fail "could not build the negative rule file"
cp "$TESTS" "$WORK/$TESTS"
if "$PROMTOOL" test rules "$WORK/$TESTS" > "$WORK/negative.log" 2>&1; then
  fail "the unit tests pass with the capacity threshold at 95 %"
fi
grep -q 'ChimeraVolumeAlmostFull' "$WORK/negative.log" || fail "negative check failed for another reason: $(cat "$WORK/negative.log")"
echo "test-monitoring: negative check passed (a moved threshold fails the unit tests)"

# 6. the dashboard's queries are PromQL.
dash_rules() {  # $1: dashboard JSON, $2: output rule file
  python3 - "$1" "$2" <<'PY'
import json, re, sys, yaml
dash = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
for v in dash["templating"]["list"]:
    if v.get("type") == "query":
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", v["query"]["query"], re.S)
        exprs.append(m.group(1) if m else v["query"]["query"])
assert len(exprs) >= 30, f"only {len(exprs)} queries in the dashboard"
rules = [{"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "5m")} for i, e in enumerate(exprs)]
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
print(len(rules))
PY
}
n=$(dash_rules charts/chimera/files/grafana-dashboard.json "$WORK/dashboard-rules.yaml")
"$PROMTOOL" check rules "$WORK/dashboard-rules.yaml" > "$WORK/dash.log" 2>&1 || { cat "$WORK/dash.log"; fail "dashboard queries do not parse"; }
sed 's/sum by (program, op) (rate(chimera_rpc_ops_total/sum by (program, op) (rate(chimera_rpc_ops_total}/' \
  charts/chimera/files/grafana-dashboard.json > "$WORK/bad-dashboard.json"
dash_rules "$WORK/bad-dashboard.json" "$WORK/bad-dashboard-rules.yaml" >/dev/null
if "$PROMTOOL" check rules "$WORK/bad-dashboard-rules.yaml" > /dev/null 2>&1; then
  fail "promtool accepted a broken dashboard query"
fi
echo "test-monitoring: $n dashboard queries parse as PromQL (and a broken one is caught)"
