#!/usr/bin/env python3
"""Check that a `make bench` results directory shows a benchmark that worked.

This is what the CI smoke test asserts: every expected server answered, every
cell has numbers for every server, the numbers are finite and consistent, the
raw fio JSON behind each run exists, results.json is valid. It never judges
performance: thresholds on a shared 2-core machine would be noise.

usage: check_results.py RESULTS_DIR --servers chimerad,ganesha-mem [--transport] [--chart]
Exit 0 when sound; otherwise exit 1 and print every problem found.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

SCHEMA = "chimera-bench/1"
RUN_POSITIVE = ("iops", "mb_s", "lat_us_p50", "lat_us_p99", "lat_us_p99_9", "cpu_s", "iops_per_cpu_s", "rss_peak_mib",
                "total_ios")
TRANSPORT_POSITIVE = ("null_us_p50", "null_us_p99", "null_calls_per_s", "echo_us_p50", "echo_us_p99",
                      "read4k_us_p50", "read4k_echo_us_p50")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def check(doc: dict, out_dir: Path, servers: list[str], transport: bool, chart: bool) -> list[str]:
    p: list[str] = []
    if doc.get("schema") != SCHEMA:
        return [f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}"]
    for e in doc.get("errors") or []:
        p.append(f"harness error: {e}")
    names = [s.get("name") for s in doc.get("servers") or []]
    if names[: len(servers)] != servers:
        p.append(f"servers are {names}, expected {servers} first")
    rounds = doc.get("rounds")
    if not isinstance(rounds, int) or rounds < 1:
        p.append(f"rounds is {rounds!r}")
        rounds = 1
    cells = doc.get("cells") or []
    if not cells:
        p.append("no cells")
    for c in cells:
        cname = c.get("name", "?")
        for s in servers:
            entry = (c.get("servers") or {}).get(s)
            if entry is None:
                p.append(f"{cname}: no entry for {s}")
                continue
            runs = entry.get("runs") or []
            if len(runs) != rounds:
                p.append(f"{cname} {s}: {len(runs)} runs, expected {rounds}")
            for r in runs:
                tag = f"{cname} {s} round {r.get('round')}"
                for k in RUN_POSITIVE:
                    if not positive(r.get(k)):
                        p.append(f"{tag}: {k} is {r.get(k)!r}, expected a positive number")
                lat = [r.get(k) for k in ("lat_us_p50", "lat_us_p99", "lat_us_p99_9")]
                if all(positive(x) for x in lat) and not lat[0] <= lat[1] <= lat[2]:
                    p.append(f"{tag}: latency percentiles out of order {lat}")
                raw = out_dir / str(r.get("raw"))
                try:
                    json.loads(raw.read_text())
                except (OSError, ValueError) as e:
                    p.append(f"{tag}: raw fio JSON {raw} unreadable: {e}")
            summary = entry.get("summary") or {}
            if "iops" not in summary:
                p.append(f"{cname} {s}: no summary")
        for s in servers[1:]:
            if not positive((c.get("ratios") or {}).get(s, {}).get("iops")):
                p.append(f"{cname}: no IOPS ratio {servers[0]}/{s}")
    if transport:
        tr = doc.get("transport") or {}
        # Transport figures are per server process: a NAME+engine target
        # shares NAME's.
        for s in dict.fromkeys(x.removesuffix("+engine") for x in servers):
            runs = (tr.get(s) or {}).get("runs") or []
            if len(runs) != rounds:
                p.append(f"transport {s}: {len(runs)} runs, expected {rounds}")
            for r in runs:
                for k in TRANSPORT_POSITIVE:
                    if not positive(r.get(k)):
                        p.append(f"transport {s} round {r.get('round')}: {k} is {r.get(k)!r}")
    if chart:
        png = out_dir / str(doc.get("chart"))
        try:
            if png.read_bytes()[:8] != PNG_MAGIC:
                p.append(f"chart {png} is not a PNG")
        except OSError as e:
            p.append(f"chart missing: {e}")
    return p


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="check a bench results directory")
    ap.add_argument("results_dir", type=Path)
    ap.add_argument("--servers", required=True, help="comma-separated, in the order the bench ran them")
    ap.add_argument("--transport", action="store_true", help="expect rpcbench results for every server")
    ap.add_argument("--chart", action="store_true", help="expect the PNG chart")
    a = ap.parse_args(argv)
    path = a.results_dir / "results.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"check_results: {path}: {e}", file=sys.stderr)
        return 1
    problems = check(doc, a.results_dir, a.servers.split(","), a.transport, a.chart)
    if problems:
        print(f"check_results: {len(problems)} problem(s) in {path}:", file=sys.stderr)
        for x in problems:
            print(f"  - {x}", file=sys.stderr)
        return 1
    cells = len(doc["cells"])
    print(f"check_results: OK: {cells} cells x {len(a.servers.split(','))} servers x {doc['rounds']} round(s), "
          f"every run has numbers{', transport measured' if a.transport else ''}{', chart written' if a.chart else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
