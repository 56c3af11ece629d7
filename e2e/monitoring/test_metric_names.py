"""Every metric the chart's alert rules and Grafana dashboard use is one a
running chimerad exports.

Starts a data server and a pNFS MDS that lists it (both real chimerad
processes on 127.0.0.1, every port bound to 0 and read back from the
"listening" log lines), creates a volume through the admin API, scrapes both
/metrics, and checks each metric name found in
charts/chimera/files/prometheus-rules.yaml and files/grafana-dashboard.json
against the sample names of the two scrapes (`up` is Prometheus's own). The
name extraction is tested too, so a query it cannot read fails instead of
passing with nothing checked."""

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
import importlib.util

import pytest
import yaml

# The one reader of chimerad's "listening" lines (scripts/chimerad-ports.py).
_spec = importlib.util.spec_from_file_location(
    "chimerad_ports", os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "chimerad-ports.py"))
PORTS = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(PORTS)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHIMERAD = os.environ.get("CHIMERAD", os.path.join(ROOT, "dataplane", "target", "release", "chimerad"))
RULES = os.path.join(ROOT, "charts", "chimera", "files", "prometheus-rules.yaml")
DASHBOARD = os.path.join(ROOT, "charts", "chimera", "files", "grafana-dashboard.json")
TOKEN = "monitoring-test-token"
START_S = 20
# Series Prometheus makes itself for every target.
PROMETHEUS_OWN = {"up"}

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "inf", "nan"}


def metric_names(expr):
    """The metric names a PromQL expression selects (functions, keywords,
    label names, label values, ranges and numbers removed)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*", expr, re.S)
    if m:  # Grafana's variable query: the series selector is the first argument
        expr = m.group(1)
    e = re.sub(r'"(?:\\.|[^"\\])*"', "", expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"(?<![a-zA-Z0-9_:])\d+(\.\d+)?(e[+-]?\d+)?(ms|[smhdwy])?\b", "", e)
    names = set()
    for t in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        if e[t.end():].lstrip().startswith("(") or t.group(0).lower() in KEYWORDS:
            continue
        names.add(t.group(0))
    return names


def used_names():
    """metric name -> where it is used, over the rules and the dashboard."""
    used = {}
    for g in yaml.safe_load(open(RULES))["groups"]:
        for r in g["rules"]:
            for n in metric_names(r["expr"]):
                used.setdefault(n, set()).add("rule " + r.get("alert", r.get("record", "?")))
    dash = json.load(open(DASHBOARD))
    exprs = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
    for v in dash["templating"]["list"]:
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            exprs.append(("variable " + v["name"], q))
    for where, e in exprs:
        for n in metric_names(e):
            used.setdefault(n, set()).add("dashboard " + where)
    return used


def test_metric_names_reads_promql():
    # What the extraction must see through: functions, grouping, matchers
    # with regexes and variables, ranges, numbers, binary operators.
    assert metric_names('histogram_quantile(0.99, sum by (pod, le) (rate(a_bucket{x=~"read|write",ns=~"$ns"}[$__rate_interval])))') == {"a_bucket"}
    assert metric_names("b / (c > 0) > 0.85 and on (x) d offset 5m") == {"b", "c", "d"}
    assert metric_names("count(e == 0) or vector(0)") == {"e"}
    assert metric_names('label_values(f{namespace=~"$namespace"}, chimera_cluster)') == {"f"}
    assert metric_names('increase(g[10m]) > 1e3') == {"g"}


def bound_ports(log_path, services, proc, deadline):
    """Ports from chimerad's {"msg":"listening","service":...,"addr":...} lines."""
    while True:
        found = PORTS.logged_ports(log_path, services)
        if set(found) == set(services):
            return found
        assert proc.poll() is None, f"chimerad exited: {open(log_path).read()}"
        assert time.time() < deadline, f"chimerad did not report ports {sorted(set(services) - set(found))} in {START_S} s"
        time.sleep(0.05)


class Chimerad:
    def __init__(self, tmp, name, cfg, services):
        path = os.path.join(tmp, f"{name}.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        self.log = open(os.path.join(tmp, f"{name}.log"), "w")
        self.proc = subprocess.Popen([CHIMERAD, "--config", path], stdout=self.log, stderr=subprocess.STDOUT)
        self.ports = bound_ports(self.log.name, services, self.proc, time.time() + START_S)

    def scrape(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['metrics']}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("chimerad did not exit within 15 s of SIGTERM")
        self.log.close()
        assert rc == 0, f"chimerad exited {rc}: {open(self.log.name).read()[-2000:]}"


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory):
    assert os.path.exists(CHIMERAD), f"{CHIMERAD} missing: run `make build-dataplane`"
    tmp = str(tmp_path_factory.mktemp("monitoring"))
    ds = Chimerad(tmp, "ds", {
        "server": {"role": "ds", "bind": "127.0.0.1", "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "cores": 1},
        "mounts": {"ds": {"module": "memfs", "capacity_bytes": "64M"}},
        "metrics": {"bind": "127.0.0.1", "port": 0},
    }, ("nfs", "metrics"))
    servers = [ds]
    try:
        mds = Chimerad(tmp, "mds", {
            "server": {"role": "mds", "bind": "127.0.0.1", "nfs_port": 0, "mount_port": 0, "portmap_port": 0, "cores": 1,
                       "grace_time_s": 0,
                       "pnfs": {"enabled": True, "data_servers": [{"name": "ds-0", "uaddr": f"127.0.0.1:{ds.ports['nfs']}"}]}},
            "mounts": {"memfs": {"module": "memfs", "capacity_bytes": "64M"}},
            "exports": {"/memfs": {"path": "/memfs"}},
            "admin": {"bind": "127.0.0.1", "port": 0, "token": TOKEN, "tls": False},
            "metrics": {"bind": "127.0.0.1", "port": 0},
        }, ("nfs", "admin", "metrics"))
        servers.append(mds)
        req = urllib.request.Request(f"http://127.0.0.1:{mds.ports['admin']}/api/v1/volumes", method="POST",
                                     data=json.dumps({"name": "pvc-1", "capacityBytes": 1 << 20}).encode(),
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status in (200, 201), r.status
        yield {"ds": ds.scrape(), "mds": mds.scrape()}
    finally:
        for s in reversed(servers):
            s.stop()


def sample_names(text):
    return {re.split(r"[{ ]", l, maxsplit=1)[0] for l in text.splitlines() if l and not l.startswith("#")}


def test_every_metric_the_rules_and_dashboard_use_is_exported(scrapes):
    used = used_names()
    chimera = {n for n in used if n.startswith("chimera_")}
    # Not vacuous: the rules and the dashboard use many names.
    assert len(chimera) >= 25, f"only {sorted(chimera)} found: is the extraction broken?"
    exported = sample_names(scrapes["ds"]) | sample_names(scrapes["mds"])
    missing = {n: sorted(w) for n, w in used.items() if n not in exported and n not in PROMETHEUS_OWN}
    assert not missing, "used but not exported by chimerad:\n" + "\n".join(f"  {n}: {w}" for n, w in sorted(missing.items()))


def test_scrapes_have_the_series_the_alerts_group_by(scrapes):
    # The label values the alerts name must be there too, not just the names.
    mds, ds = scrapes["mds"], scrapes["ds"]
    assert re.search(r'^chimera_pnfs_ds_healthy\{ds="ds-0"\} 1$', mds, re.M), "the MDS does not report ds-0 healthy"
    assert re.search(r'^chimera_volume_capacity_bytes\{volume="[^"]+"\} 1048576$', mds, re.M), "the new volume's capacity is missing"
    assert re.search(r'^chimera_ready 1$', mds, re.M), "the MDS is not ready in its own metrics"
    assert re.search(r'^chimera_mount_capacity_bytes\{mount="ds"\} 67108864$', ds, re.M), "the DS mount's capacity is missing"
    assert re.search(r'^chimera_data_servers\{state="not_ready"\} \d+$', mds, re.M)
