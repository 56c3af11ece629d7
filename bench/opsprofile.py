#!/usr/bin/env python3
"""Instructions per NFSv3 operation: chimerad under callgrind, a fixed number of calls per kind.

Why: wall-clock figures on this shared 2-core machine move +-30 % between runs;
an instruction count per operation does not. It is the stable figure for "did
this change add or remove work on the data path" (issue 6, bench/README.md).

How:
  1. chimerad (memfs, one event loop) starts under `valgrind --tool=callgrind` in
     a private network namespace (e2e/peers/netns.sh), with instrumentation on
     from the start;
  2. bench/nfs3calls.py mounts the export, creates a file and writes it;
  3. for each operation (GETATTR, 4 KiB READ, 4 KiB WRITE, 1 MiB READ): the
     counters are zeroed (`callgrind_control -z`), the client issues exactly
     COUNT calls of that kind, DEPTH in flight, and the counters are dumped
     (`callgrind_control -d`). The dump's total divided by COUNT is the
     instructions per operation, event loop and syscalls' user side included;
  4. each phase's top functions by self instructions are read from its dump.
Writes profile.json, profile.txt and the callgrind dumps into the results dir.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEERS = REPO / "e2e" / "peers"
SCHEMA = "chimera-bench-profile/1"
NETNS = "chimera-prof"
NFS_PORT, MOUNT_PORT = 2049, 20048
# (operation, calls, calls in flight). 1 MiB reads are fewer: each costs ~100x a 4 KiB one.
PHASES_DEFAULT = (("getattr", 2000, 16), ("read4k", 2000, 16), ("write4k", 2000, 16), ("read1m", 100, 1))
# Under callgrind the server runs ~50x slower; these bound a phase and start-up.
START_TIMEOUT_S = 120
PHASE_TIMEOUT_S = 600
TOP_FUNCTIONS = 12


class ProfileError(Exception):
    """A failure that stops the profile; the message names the problem."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise ProfileError(f"{' '.join(cmd)} failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-500:]}")
    return p


def parse_total(text: str) -> int:
    """The instruction total of a callgrind dump (its `summary:` or `totals:` line)."""
    for key in ("totals:", "summary:"):
        m = re.search(rf"^{key}\s+(\d+)", text, re.M)
        if m:
            return int(m.group(1))
    raise ProfileError("callgrind dump has no totals/summary line")


def parse_self_costs(text: str) -> dict[str, int]:
    """Self instructions per function from a callgrind dump (--compress-strings=no).

    callgrind_annotate 3.19 charges a call's inclusive cost to the caller's self
    cost when the call began before the counters were zeroed (`calls=0`), which
    is every phase here (the event loop is always inside its run loop). So the
    dump is read directly: a cost line right after `calls=` is a call's
    inclusive cost and is skipped; every other cost line is self cost of the
    current `fn=`.
    """
    costs: dict[str, int] = {}
    fn = None
    after_calls = False
    for line in text.splitlines():
        if line.startswith("fn="):
            fn = re.sub(r"^\(\d+\)\s*", "", line[3:])
            after_calls = False
        elif line.startswith("calls="):
            after_calls = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            parts = line.split()
            if after_calls:
                after_calls = False
            elif fn is not None and len(parts) >= 2:
                costs[fn] = costs.get(fn, 0) + int(parts[1])
    return costs


def top_self(costs: dict[str, int], limit: int) -> list[dict]:
    total = sum(costs.values()) or 1
    ranked = sorted(costs.items(), key=lambda kv: -kv[1])[:limit]
    return [{"function": f, "ir": ir, "pct": 100.0 * ir / total} for f, ir in ranked]


def write_config(out_dir: Path) -> Path:
    cfg = {
        "common": {"log_level": "warn"},
        "server": {"bind": "127.0.0.1", "cores": 1, "nfs_port": NFS_PORT, "mount_port": MOUNT_PORT},
        "mounts": {"memfs": {"module": "memfs", "path": "/", "capacity_bytes": 256 << 20}},
        "exports": {"/memfs": {"path": "/memfs"}},
        "admin": {"enabled": False},
        "metrics": {"enabled": False},
    }
    path = out_dir / "chimerad.json"
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def client_cmd(client: subprocess.Popen, line: str, timeout_s: float) -> str:
    assert client.stdin and client.stdout
    client.stdin.write(line + "\n")
    client.stdin.flush()
    deadline = time.monotonic() + timeout_s
    # readline blocks; the client answers every command, and a stuck server is
    # caught by the client's own socket timeout (60 s) which it reports.
    answer = client.stdout.readline().strip()
    if time.monotonic() > deadline:
        raise ProfileError(f"client took over {timeout_s:.0f}s for {line!r}")
    if not answer.startswith("ok"):
        raise ProfileError(f"client: {line!r}: {answer or 'no answer (client died)'}")
    return answer


def wait_dump(out_base: Path, n: int, timeout_s: float) -> Path:
    """callgrind_control -d returns before the dump file is complete on disk."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in out_base.parent.glob(out_base.name + f"*.{n}"):
            text = p.read_text(errors="replace")
            if re.search(r"^(totals|summary):", text, re.M):
                return p
        time.sleep(0.2)
    raise ProfileError(f"no callgrind dump #{n} appeared next to {out_base}")


def profile(a: argparse.Namespace) -> dict:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = (a.results or HERE / "results" / f"profile-{stamp}").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = write_config(out_dir)
    out_base = out_dir / "callgrind.out"
    run([str(PEERS / "netns.sh"), "up", NETNS], 30)
    server = client = None
    result = {"schema": SCHEMA, "started_utc": stamp, "chimerad": str(a.chimerad), "phases": [], "errors": []}
    try:
        log_file = open(out_dir / "chimerad.log", "wb")
        server = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, "valgrind", "--tool=callgrind", f"--callgrind-out-file={out_base}",
             "--dump-instr=no", "--compress-strings=no", "--compress-pos=no", str(a.chimerad), "--config", str(cfg)],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
        client = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, sys.executable, str(HERE / "nfs3calls.py"),
             "--nfs-port", str(NFS_PORT), "--mount-port", str(MOUNT_PORT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                raise ProfileError(f"chimerad under callgrind exited (status {server.returncode}); "
                                   f"log {out_dir / 'chimerad.log'}")
            probe = subprocess.run(["ip", "netns", "exec", NETNS, "bash", "-c",
                                    f"exec 3<>/dev/tcp/127.0.0.1/{NFS_PORT}"], capture_output=True)
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise ProfileError(f"chimerad did not answer within {START_TIMEOUT_S}s under callgrind")
            time.sleep(1)
        log("profile: chimerad up under callgrind; setting up the file")
        client_cmd(client, "setup", PHASE_TIMEOUT_S)
        pid = server.pid  # `ip netns exec` execs valgrind, which runs chimerad in the same process
        for n, (op, count, depth) in enumerate(a.phases, start=1):
            run(["callgrind_control", "-z", str(pid)], 60)
            t0 = time.monotonic()
            client_cmd(client, f"run {op} {count} {depth}", PHASE_TIMEOUT_S)
            wall_s = time.monotonic() - t0
            run(["callgrind_control", "-d", op, str(pid)], 60)
            dump = wait_dump(out_base, n, 60)
            total = parse_total(dump.read_text(errors="replace"))
            costs = parse_self_costs(dump.read_text(errors="replace"))
            phase = {"op": op, "calls": count, "depth": depth, "instructions": total,
                     "instructions_per_call": total / count, "wall_s_under_callgrind": wall_s,
                     "dump": dump.name, "top_self": top_self(costs, TOP_FUNCTIONS)}
            result["phases"].append(phase)
            log(f"profile: {op:<8} {count:>5} calls (depth {depth}): {total / count:>12,.0f} instructions/call")
        client_cmd(client, "quit", 30)
    except (ProfileError, subprocess.TimeoutExpired, OSError) as e:
        result["errors"].append(str(e))
        log(f"profile: error: {e}")
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait(timeout=10)
        if server is not None and server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=30)
        subprocess.run([str(PEERS / "netns.sh"), "down", NETNS], capture_output=True, timeout=30)
    result["results_dir"] = str(out_dir)
    (out_dir / "profile.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "profile.txt").write_text(render(result) + "\n")
    return result


def render(result: dict) -> str:
    lines = ["instructions per NFSv3 call (chimerad under callgrind, memfs, one event loop)"]
    for p in result["phases"]:
        lines.append(f"  {p['op']:<8} {p['instructions_per_call']:>12,.0f}  ({p['calls']} calls, depth {p['depth']})")
    for p in result["phases"]:
        lines.append(f"\ntop functions by self instructions, {p['op']} (per call):")
        for f in p["top_self"]:
            lines.append(f"  {f['ir'] / p['calls']:>10,.0f}  {f['pct']:5.1f}%  {f['function']}")
    for e in result["errors"]:
        lines.append(f"ERROR: {e}")
    return "\n".join(lines)


def parse_phases(text: str) -> tuple:
    out = []
    for item in text.split(","):
        op, count, depth = item.split(":")
        out.append((op, int(count), int(depth)))
    return tuple(out)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chimerad", type=Path, required=True)
    p.add_argument("--results", type=Path, help="results directory (default bench/results/profile-<UTC time>)")
    p.add_argument("--phases", type=parse_phases, default=PHASES_DEFAULT,
                   help="op:calls:depth,... (ops: getattr, read4k, write4k, read1m)")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        log("profile: needs root (network namespaces)")
        return 1
    if not a.chimerad.is_file():
        log(f"profile: chimerad binary {a.chimerad} not found (make build-dataplane)")
        return 1
    result = profile(a)
    print(render(result))
    print(f"\nresults: {result['results_dir']}")
    return 1 if result["errors"] or not result["phases"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
