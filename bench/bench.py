#!/usr/bin/env python3
"""Side-by-side NFSv3 benchmark: chimerad against NFS-Ganesha, same client, same run.

What it does (bench/README.md says how to read the output):
  1. starts every server in its own private network namespace of the same kind
     (e2e/peers/netns.sh), so the client reaches each over the same loopback path;
  2. lays out the test files on each server (fio's libnfs engine only creates
     files on sequential writes);
  3. runs the cell matrix round by round, and inside a round each cell against
     every server back to back (A, B, A, B, ...), so slow drifts in machine load
     hit all servers alike;
  4. per run records fio's IOPS, MB/s and completion-latency percentiles, the
     server's CPU-seconds (utime+stime from /proc/<pid>/stat) and its peak RSS
     during the run (VmHWM, reset before each run through clear_refs);
  5. optionally runs the transport microbenchmark (dataplane/rpcbench) against
     each server;
  6. prints a side-by-side table of medians, min-max and ratios, and writes the raw
     fio JSON, results.json and a PNG chart of the ratios into the results dir.

It never invents a number: a server that does not start, does not answer, or a
cell whose fio run fails is recorded as an error, reported at the end, and makes
the exit status non-zero.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEERS = REPO / "e2e" / "peers"

RESULTS_SCHEMA = "chimera-bench/1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Percentiles fio reports (fio's keys are formatted "%f").
PERCENTILES = ("50", "99", "99.9")
# How long a server may take to answer after start.
SERVER_START_TIMEOUT_S = 60
# Slack on top of a cell's runtime before its fio run counts as hung (mount,
# file open, unmount; TESTING.md reports libnfs hangs at large block sizes).
FIO_SLACK_S = 60
# Bounds that keep a run from exhausting the shared machine.
FILE_BYTES_MAX = 1 << 30
RUNTIME_S_MAX = 600
ROUNDS_MAX = 50


@dataclass(frozen=True)
class Cell:
    """One workload of the matrix."""

    name: str
    rw: str
    bs_bytes: int
    iodepth: int
    numjobs: int

    @property
    def direction(self) -> str:
        return "read" if "read" in self.rw else "write"


def _cells() -> list[Cell]:
    out = []
    for rw in ("randread", "randwrite"):
        for qd in (1, 32):
            for jobs in (1, 2):
                out.append(Cell(f"4k-{rw}-qd{qd}-j{jobs}", rw, 4096, qd, jobs))
    # iodepth 1 for the large blocks: at iodepth 8 the libnfs engine hangs in
    # its end-of-run teardown (bench/README.md), at 1 MiB and at 128 KiB.
    out.append(Cell("128k-randread-qd1-j1", "randread", 128 << 10, 1, 1))
    out.append(Cell("1m-write-qd1-j1", "write", 1 << 20, 1, 1))
    out.append(Cell("1m-read-qd1-j1", "read", 1 << 20, 1, 1))
    return out


CELLS_FULL = _cells()
CELLS_QUICK_NAMES = ("4k-randread-qd1-j1", "4k-randwrite-qd32-j1", "4k-randread-qd32-j2",
                     "1m-write-qd1-j1", "1m-read-qd1-j1")
# The numbers compared across servers, with the direction that is better.
METRICS = (
    ("iops", "IOPS", "higher"),
    ("mb_s", "MB/s", "higher"),
    ("lat_us_p50", "p50 us", "lower"),
    ("lat_us_p99", "p99 us", "lower"),
    ("lat_us_p99_9", "p99.9 us", "lower"),
    ("cpu_s", "srv CPU-s", "lower"),
    ("iops_per_cpu_s", "IOPS/CPU-s", "higher"),
    ("client_cpu_s", "client CPU-s", "lower"),
    ("iops_per_client_cpu_s", "IOPS/client-CPU-s", "higher"),
    ("rss_peak_mib", "RSS peak MiB", "lower"),
)
# The two NFS clients fio can drive: fio's libnfs engine (ioengine=nfs) and
# ours (dataplane/fio, ioengine=external). A target named "<server>+engine"
# is that server driven by our engine; a plain name, by libnfs.
ENGINE_SUFFIX = "+engine"


class BenchError(Exception):
    """A failure that stops the benchmark; the message names the problem."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(cmd: list[str], timeout_s: float, check: bool = True) -> subprocess.CompletedProcess:
    """Run a short helper command with a deadline."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{shlex.join(cmd)} did not finish within {timeout_s}s") from e
    if check and p.returncode != 0:
        raise BenchError(f"{shlex.join(cmd)} failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-2000:]}")
    return p


# ---------------------------------------------------------------- /proc readings

def proc_cpu_s(pid: int) -> float:
    """utime+stime of the whole process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The command name is in parentheses and may contain spaces: split after it.
    fields = stat[stat.rindex(")") + 2:].split()
    # Fields 14 and 15 of proc(5) (utime, stime) are at 11 and 12 after the name.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_bytes(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                value, unit = line.split()[1:3]
                assert unit == "kB", line
                return int(value) * 1024
    raise BenchError(f"/proc/{pid}/status has no {key}")


def reset_peak_rss(pid: int) -> None:
    """Make VmHWM restart from the current RSS (proc(5): clear_refs value 5)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False


def tcp_answers(netns: str, port: int) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:port inside netns."""
    p = subprocess.run(["ip", "netns", "exec", netns, "timeout", "3", "bash", "-c",
                        f"exec 3<>/dev/tcp/127.0.0.1/{port}"], capture_output=True)
    return p.returncode == 0


# ---------------------------------------------------------------- servers

class Server:
    """A server under test: where it lives and how to account for it."""

    name: str
    netns: str
    nfs_port: int
    mnt_port: int
    export: str
    capacity_bytes: int | None = None
    # "libnfs" or "engine": which client fio drives this target with.
    client: str = "libnfs"

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def pid(self) -> int:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "netns": self.netns, "addr": "127.0.0.1", "nfs_port": self.nfs_port,
                "mnt_port": self.mnt_port, "export": self.export, "pid": self.pid(),
                "capacity_bytes": self.capacity_bytes}

    def nfs_url(self) -> str:
        return f"nfs://127.0.0.1{self.export}?nfsport={self.nfs_port}&mountport={self.mnt_port}"

    def check_alive(self) -> None:
        pid = self.pid()
        if not pid_alive(pid):
            raise BenchError(f"{self.name}: server process {pid} is gone")


class ViaEngine(Server):
    """A server reached through our fio engine instead of libnfs: the same
    process, ports and export (started and laid out once, by its plain
    target); only the client differs."""

    client = "engine"

    def __init__(self, base: Server):
        self.base = base
        self.name = base.name + ENGINE_SUFFIX
        self.netns = base.netns
        self.nfs_port = base.nfs_port
        self.mnt_port = base.mnt_port
        self.export = base.export
        self.capacity_bytes = base.capacity_bytes

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def pid(self) -> int:
        return self.base.pid()

    def describe(self) -> dict:
        return {**self.base.describe(), "name": self.name, "client": "engine"}


class Ganesha(Server):
    """NFS-Ganesha through e2e/peers/ganesha.sh; the MEM and VFS exports share one process."""

    _started_by_us = False
    _users = 0

    def __init__(self, fsal: str):
        assert fsal in ("mem", "vfs")
        self.name = f"ganesha-{fsal}"
        self.netns = os.environ.get("GANESHA_NETNS", "chimera-ganesha")
        self.nfs_port = int(os.environ.get("GANESHA_NFS_PORT", "2049"))
        self.mnt_port = int(os.environ.get("GANESHA_MNT_PORT", "20048"))
        self.export = f"/{fsal}"
        self._pid = 0

    def _status(self) -> int:
        p = run([str(PEERS / "ganesha.sh"), "status"], timeout_s=30, check=False)
        if p.returncode != 0:
            return 0
        fields = dict(kv.split("=", 1) for kv in p.stdout.split()[1:] if "=" in kv)
        return int(fields["pid"])

    def start(self) -> None:
        if Ganesha._users == 0:
            already = self._status()
            if not already:
                log(f"  starting NFS-Ganesha in netns {self.netns}")
                run([str(PEERS / "ganesha.sh"), "start"], timeout_s=SERVER_START_TIMEOUT_S + 120)
                Ganesha._started_by_us = True
        Ganesha._users += 1
        self._pid = self._status()
        if not self._pid:
            raise BenchError(f"{self.name}: ganesha.sh start returned but status says stopped")

    def stop(self) -> None:
        Ganesha._users -= 1
        if Ganesha._users == 0 and Ganesha._started_by_us:
            run([str(PEERS / "ganesha.sh"), "stop"], timeout_s=60, check=False)
            Ganesha._started_by_us = False

    def pid(self) -> int:
        return self._pid


class Chimerad(Server):
    """chimerad on the memfs backend, started as a child of this process."""

    def __init__(self, binary: Path, out_dir: Path, cores: int, capacity_bytes: int, config: Path | None):
        self.name = "chimerad"
        self.netns = os.environ.get("CHIMERAD_NETNS", "chimera-bench-chimerad")
        self.nfs_port = 2049
        self.mnt_port = 20048
        self.export = "/memfs"
        self.capacity_bytes = capacity_bytes
        self.binary = binary
        self.out_dir = out_dir
        self.cores = cores
        self.config = config
        self.proc: subprocess.Popen | None = None

    def write_config(self) -> Path:
        if self.config is not None:
            return self.config
        cfg = {
            "common": {"log_level": "warn"},
            "server": {"bind": "127.0.0.1", "cores": self.cores, "nfs_port": self.nfs_port,
                       "mount_port": self.mnt_port},
            "mounts": {"memfs": {"module": "memfs", "path": "/", "capacity_bytes": self.capacity_bytes}},
            "exports": {self.export: {"path": "/memfs"}},
            "admin": {"enabled": False},
            "metrics": {"enabled": False},
        }
        path = self.out_dir / "chimerad.json"
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        return path

    def start(self) -> None:
        if not self.binary.is_file():
            raise BenchError(f"chimerad: binary {self.binary} not found (build it with `make build-dataplane`)")
        run([str(PEERS / "netns.sh"), "up", self.netns], timeout_s=30)
        # A leftover server on these ports would take part of the load (listeners
        # may share a port) and the numbers would belong to the wrong process.
        for port in (self.nfs_port, self.mnt_port):
            if tcp_answers(self.netns, port):
                raise BenchError(f"chimerad: something already listens on 127.0.0.1:{port} in netns {self.netns} "
                                 f"(a leftover server? see `ip netns pids {self.netns}`)")
        try:
            self._spawn()
        except BaseException:
            self.stop()
            raise

    def _spawn(self) -> None:
        cfg = self.write_config()
        log_path = self.out_dir / f"{self.name}.log"
        self.log_file = open(log_path, "wb")
        # `ip netns exec` execs the command, so the child's pid is chimerad's.
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.netns, str(self.binary), "--config", str(cfg)],
                                     stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                tail = log_path.read_text(errors="replace").strip()[-1500:]
                raise BenchError(f"chimerad exited during start (exit {rc}); log {log_path}:\n{tail}")
            if tcp_answers(self.netns, self.nfs_port) and tcp_answers(self.netns, self.mnt_port):
                # The kernel truncates comm to 15 bytes.
                comm = Path(f"/proc/{self.proc.pid}/comm").read_text().strip()
                if comm != self.binary.name[:15]:
                    raise BenchError(f"chimerad: pid {self.proc.pid} is {comm!r}, not {self.binary.name}; "
                                     "CPU accounting would be wrong")
                return
            time.sleep(0.2)
        raise BenchError(f"chimerad: nothing answered on 127.0.0.1:{self.nfs_port}/{self.mnt_port} in netns "
                         f"{self.netns} within {SERVER_START_TIMEOUT_S}s (log {log_path})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        run([str(PEERS / "netns.sh"), "down", self.netns], timeout_s=30, check=False)

    def pid(self) -> int:
        return self.proc.pid if self.proc else 0


# ---------------------------------------------------------------- fio

def parse_fio(doc: dict, cell: Cell) -> dict:
    """The numbers of one fio run (group_reporting: one aggregated job)."""
    jobs = doc.get("jobs") or []
    if len(jobs) != 1:
        raise BenchError(f"fio output has {len(jobs)} job entries, expected 1 (group_reporting)")
    job = jobs[0]
    if job.get("error"):
        raise BenchError(f"fio job reported error {job['error']}")
    d = job[cell.direction]
    if d.get("total_ios", 0) <= 0:
        raise BenchError(f"fio did no {cell.direction} I/O")
    # Total latency (submission + completion) when fio reports it
    # (--lat_percentiles=1, as the diskfs suite asks): an engine whose I/O
    # may complete inside its submit call (io_uring on a VM's disk: the
    # doorbell's exit is in io_uring_enter) has a bimodal completion latency
    # (~0.3 us or the device's), so completion latency alone misreads it.
    lat_pct = (d.get("lat_ns") or {}).get("percentile")
    pct = lat_pct or d["clat_ns"].get("percentile") or {}
    out = {
        "iops": d["iops"],
        "mb_s": d["bw_bytes"] / 1e6,
        "total_ios": d["total_ios"],
        "fio_runtime_s": d["runtime"] / 1000.0,
        "client_cpu_pct": job["usr_cpu"] + job["sys_cpu"],
    }
    # fio's usr/sys percentages are of the job's run time (all jobs of the
    # group together): the client's CPU-seconds, engine and fio included.
    out["client_cpu_s"] = out["client_cpu_pct"] / 100.0 * out["fio_runtime_s"]
    out["iops_per_client_cpu_s"] = out["total_ios"] / out["client_cpu_s"] if out["client_cpu_s"] > 0 else None
    for p in PERCENTILES:
        key = f"{float(p):f}"
        if key not in pct:
            raise BenchError(f"fio output lacks the p{p} completion latency")
        out["lat_us_p" + p.replace(".", "_")] = pct[key] / 1000.0
    out["latency"] = "total" if lat_pct else "completion"
    return out


@dataclass
class Plan:
    fio: Path
    out_dir: Path
    cells: list[Cell]
    rounds: int
    runtime_s: int
    file_bytes: int
    engine: Path | None = None
    jobs_max: int = field(init=False)

    def __post_init__(self):
        self.jobs_max = max(c.numjobs for c in self.cells)


def client_args(plan: Plan, server: Server) -> list[str]:
    """fio's engine options for the target's client."""
    if server.client == "engine":
        if plan.engine is None:
            raise BenchError(f"{server.name}: --engine PATH (make build-fio-engine) is required")
        return [f"--ioengine=external:{plan.engine}", f"--chimera_server=127.0.0.1:{server.nfs_port}",
                f"--chimera_export={server.export}", f"--chimera_mount_port={server.mnt_port}"]
    return ["--ioengine=nfs", f"--nfs_url={server.nfs_url()}"]


def fio_cmd(plan: Plan, server: Server, name: str, extra: list[str], out_json: Path) -> list[str]:
    return ["ip", "netns", "exec", server.netns, str(plan.fio), "--output-format=json", f"--output={out_json}",
            f"--name={name}", *client_args(plan, server),
            # Each job its own file: bench.0, bench.1 (laid out first).
            "--filename_format=bench.$jobnum", f"--size={plan.file_bytes}", "--group_reporting"] + extra


# fio's libnfs engine logs failed operations but does not always fail the job
# (fio then counts them as done I/O): any of these on stderr fails the run...
FIO_ENGINE_ERRORS = ("Failed NFS operation", "Got NFS EOF", "nfs: Failed", "Failed to open",
                     # ours (dataplane/fio): every failure it logs is one
                     "chimera-fio:", "chimera:")
# ...except one artefact of the engine at the end of a run. Its getevents()
# ignores fio's `min` and only blocks when all iodepth slots are busy, so when a
# time_based run ends fio tears the NFS context down with up to iodepth-1 I/Os
# per job still in flight; libnfs then fails each with RPC_STATUS_ERROR, which
# the engine logs as code -14. Observed against chimerad and both Ganesha
# exports alike, always at most (iodepth-1) x numjobs per run (31 at QD32, 62
# with two jobs). Up to that many are counted, recorded and tolerated; more, or
# any at iodepth 1, or any other error, fail the run.
FIO_TEARDOWN_ERROR = "Failed NFS operation(code:-14)"


def engine_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(e in line for e in FIO_ENGINE_ERRORS)]


def split_teardown_errors(errors: list[str], teardown_max: int) -> tuple[int, list[str]]:
    """(errors explained by the end-of-run teardown, errors that fail the run)."""
    teardown = [e for e in errors if e.strip().startswith(FIO_TEARDOWN_ERROR)]
    other = [e for e in errors if e not in teardown]
    if len(teardown) > teardown_max:
        return 0, errors
    return len(teardown), other


def run_fio(cmd: list[str], timeout_s: float, out_json: Path, teardown_max: int = 0) -> dict:
    """Run fio in its own process group; kill the group if it hangs."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    def kill_fio() -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        # fio's job processes call setsid(), so the group kill misses them and
        # they keep our pipes open (seen: a job stuck in libnfs teardown after
        # UMNT). They carry the unique --output path on their command line.
        subprocess.run(["pkill", "-9", "-f", str(out_json)], check=False)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_fio()
        raise BenchError(f"fio did not finish within {timeout_s:.0f}s (server hung, client stuck, or too slow)")
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): fio runs in its own session and would
        # outlive us, holding the server's namespace (and mounts) busy.
        kill_fio()
        raise
    if proc.returncode != 0:
        msg = (err or out).strip().splitlines()
        raise BenchError(f"fio failed (exit {proc.returncode}): {' | '.join(msg[-5:])}")
    if err.strip():
        out_json.with_suffix(".stderr").write_text(err)
    teardown, bad = split_teardown_errors(engine_errors(err), teardown_max)
    if bad:
        raise BenchError(f"the NFS client saw {len(bad)} failed operation(s) (at most {teardown_max} are "
                         f"explained by the engine's end-of-run teardown), first: {bad[0].strip()}")
    try:
        doc = json.loads(out_json.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BenchError(f"fio wrote no valid JSON to {out_json}: {e}") from e
    doc["chimera_bench_teardown_errors"] = teardown
    return doc


def layout(plan: Plan, server: Server) -> None:
    """Write every file the matrix reads, sequentially, before any cell runs."""
    raw = plan.out_dir / "raw" / f"layout-{server.name}.json"
    cmd = fio_cmd(plan, server, "layout", ["--rw=write", "--bs=1m", "--iodepth=1", f"--numjobs={plan.jobs_max}"], raw)
    t0 = time.monotonic()
    mib_s_floor = 1  # a server slower than 1 MiB/s counts as not answering
    run_fio(cmd, plan.file_bytes * plan.jobs_max / (mib_s_floor << 20) + FIO_SLACK_S, raw)
    log(f"  laid out {plan.jobs_max} x {plan.file_bytes >> 20} MiB on {server.name} in {time.monotonic() - t0:.1f}s")


def run_cell(plan: Plan, server: Server, cell: Cell, rnd: int) -> dict:
    raw = plan.out_dir / "raw" / f"r{rnd}-{cell.name}-{server.name}.json"
    extra = [f"--rw={cell.rw}", f"--bs={cell.bs_bytes}", f"--iodepth={cell.iodepth}", f"--numjobs={cell.numjobs}",
             "--time_based", f"--runtime={plan.runtime_s}", "--percentile_list=" + ":".join(PERCENTILES)]
    if cell.rw.startswith("rand"):
        extra.append("--norandommap")
    cmd = fio_cmd(plan, server, cell.name, extra, raw)
    pid = server.pid()
    server.check_alive()
    reset_peak_rss(pid)
    cpu0 = proc_cpu_s(pid)
    doc = run_fio(cmd, plan.runtime_s + FIO_SLACK_S, raw, teardown_max=(cell.iodepth - 1) * cell.numjobs)
    cpu_s = proc_cpu_s(pid) - cpu0
    rss_peak = proc_status_bytes(pid, "VmHWM")
    r = parse_fio(doc, cell)
    r["cpu_s"] = cpu_s
    # No ramp time: fio's total_ios covers the whole run the CPU was measured over.
    r["iops_per_cpu_s"] = r["total_ios"] / cpu_s if cpu_s > 0 else None
    r["rss_peak_mib"] = rss_peak / (1 << 20)
    r["round"] = rnd
    r["raw"] = str(raw.relative_to(plan.out_dir))
    r["client_teardown_errors"] = doc["chimera_bench_teardown_errors"]
    return r


def run_cell_retry(plan: Plan, server: Server, cell: Cell, rnd: int, results: dict, tag: str) -> dict:
    """One run; a failed run is repeated once while the server lives.

    Why: on a shared machine a run can fail for reasons outside the server
    (the client starved past a timeout). A server that fails consistently
    still fails (twice), and every retry is recorded in results.json and
    printed, so nothing is hidden.
    """
    try:
        return run_cell(plan, server, cell, rnd)
    except BenchError as e:
        server.check_alive()
        results["retries"].append(f"round {rnd} {cell.name} {server.name}: {e}")
        log(f"{tag} retrying once after: {e}")
    return run_cell(plan, server, cell, rnd)


# ---------------------------------------------------------------- transport microbenchmark

def run_rpcbench(rpcbench: Path, server: Server, calls: int, out_dir: Path, rnd: int) -> dict:
    """RPC NULL round trips against the server next to a raw TCP echo in the same netns."""
    pid = server.pid()
    server.check_alive()
    cpu0 = proc_cpu_s(pid)
    # Then 4 KiB READs of the laid-out bench.0 against an echo of their bytes.
    cmd = ["ip", "netns", "exec", server.netns, str(rpcbench), "compare", "--addr", f"127.0.0.1:{server.nfs_port}",
           "--calls", str(calls), "--json", "--mount-port", str(server.mnt_port), "--export", server.export,
           "--file", "bench.0", "--count", "4096"]
    p = run(cmd, timeout_s=120)
    cpu_s = proc_cpu_s(pid) - cpu0
    (out_dir / "raw" / f"r{rnd}-rpcbench-{server.name}.json").write_text(p.stdout)
    try:
        doc = json.loads(p.stdout)
        t, e = doc["target"]["stats"], doc["echo"]
        rd, re_ = doc["read"]["stats"], doc["read"]["echo"]
        out = {"null_us_p50": t["rtt_us_p50"], "null_us_p99": t["rtt_us_p99"], "null_calls_per_s": t["calls_per_s"],
               "echo_us_p50": e["rtt_us_p50"], "echo_us_p99": e["rtt_us_p99"], "echo_calls_per_s": e["calls_per_s"],
               "null_calls": t["calls"], "cpu_s": cpu_s,
               "read4k_us_p50": rd["rtt_us_p50"], "read4k_us_p99": rd["rtt_us_p99"],
               "read4k_echo_us_p50": re_["rtt_us_p50"], "read4k_echo_us_p99": re_["rtt_us_p99"]}
    except (KeyError, TypeError, json.JSONDecodeError) as ex:
        raise BenchError(f"rpcbench printed unexpected output ({ex}): {p.stdout[:500]}") from ex
    out["null_over_echo_p50"] = out["null_us_p50"] / out["echo_us_p50"]
    out["read4k_over_echo_p50"] = out["read4k_us_p50"] / out["read4k_echo_us_p50"]
    out["null_calls_per_cpu_s"] = out["null_calls"] / cpu_s if cpu_s > 0 else None
    out["round"] = rnd
    return out


# ---------------------------------------------------------------- summary

def summarize(runs: list[dict], keys: list[str]) -> dict:
    out = {}
    for k in keys:
        vals = [r[k] for r in runs if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])]
        if vals:
            out[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
    return out


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 100_000:
        return f"{v / 1000:.0f}k"
    if a >= 10_000:
        return f"{v / 1000:.1f}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def render_table(results: dict, metrics: tuple = METRICS) -> str:
    servers = [s["name"] for s in results["servers"]]
    base = servers[0]
    lines = []
    # Columns as wide as their longest header (server names vary by suite).
    name_w = max([22] + [len(c["name"]) for c in results["cells"]])
    col_w = max([29] + [len(f"{s} median [min-max]") for s in servers]) + 1
    for metric, label, better in metrics:
        if not any(metric in c["servers"].get(s, {}).get("summary", {}) for c in results["cells"] for s in servers):
            continue  # a metric no run of this suite measures (bench/diskfs_bench.py shares this table)
        head = f"{label} ({better} is better)"
        cols = [f"{s} median [min-max]" for s in servers] + [f"{base}/{s}" for s in servers[1:]]
        lines.append("")
        lines.append(f"{head:<{name_w + 2}}" + "".join(f"{c:>{col_w}}" for c in cols))
        for cell in results["cells"]:
            row = f"  {cell['name']:<{name_w}}"
            for s in servers:
                st = cell["servers"].get(s, {}).get("summary", {}).get(metric)
                row += f"{(fmt(st['median']) + ' [' + fmt(st['min']) + '-' + fmt(st['max']) + ']') if st else 'no data':>{col_w}}"
            for s in servers[1:]:
                row += f"{fmt(cell['ratios'].get(s, {}).get(metric)):>{col_w}}"
            lines.append(row)
    tr = results.get("transport")
    if tr:
        lines.append("")
        lines.append("transport (QD1, one connection): RPC NULL round trip vs raw TCP echo, same sizes, same loopback")
        for s in tr:
            st = tr.get(s, {}).get("summary")
            if not st:
                lines.append(f"  {s:<14} no data")
                continue
            g = lambda k: fmt(st[k]["median"]) if k in st else "-"  # noqa: E731
            lines.append(f"  {s:<14} NULL p50 {g('null_us_p50')} us p99 {g('null_us_p99')} us {g('null_calls_per_s')} calls/s"
                         f" {g('null_calls_per_cpu_s')} calls/srv-CPU-s | echo p50 {g('echo_us_p50')} us p99 "
                         f"{g('echo_us_p99')} us | NULL/echo p50 {g('null_over_echo_p50')}")
        lines.append("transport (QD1): 4 KiB NFSv3 READ at random offsets of bench.0 vs a raw TCP echo of the same bytes")
        for s in tr:
            st = tr.get(s, {}).get("summary")
            if not st:
                continue
            g = lambda k: fmt(st[k]["median"]) if k in st else "-"  # noqa: E731
            lines.append(f"  {s:<14} READ p50 {g('read4k_us_p50')} us p99 {g('read4k_us_p99')} us | echo p50 "
                         f"{g('read4k_echo_us_p50')} us p99 {g('read4k_echo_us_p99')} us | READ/echo p50 "
                         f"{g('read4k_over_echo_p50')}")
        lines.extend(engine_vs_echo(results))
    return "\n".join(lines)


def engine_vs_echo(results: dict) -> list[str]:
    """Each engine target's QD1 4 KiB random-read p50 over the raw TCP echo
    of the same bytes against its server (issue 16: at most 1.1x)."""
    tr = results.get("transport") or {}
    out = []
    for srv in results["servers"]:
        name = srv["name"]
        if not name.endswith(ENGINE_SUFFIX):
            continue
        base = name.removesuffix(ENGINE_SUFFIX)
        echo = tr.get(base, {}).get("summary", {}).get("read4k_echo_us_p50")
        for cell in results["cells"]:
            if cell["name"] != "4k-randread-qd1-j1":
                continue
            p50 = cell["servers"].get(name, {}).get("summary", {}).get("lat_us_p50")
            if p50 and echo:
                out.append(f"  {name}: 4 KiB random read QD1 p50 {fmt(p50['median'])} us = "
                           f"{fmt(p50['median'] / echo['median'])} x the raw TCP echo of the same bytes "
                           f"({fmt(echo['median'])} us)")
    if out:
        out.insert(0, "engine vs transport floor (fio completion latency includes fio's own overhead)")
    return out


def render_chart(results: dict, path: Path) -> str | None:
    """Bar chart of the first server's ratio over each other server, per cell."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no chart: matplotlib unavailable ({e})"
    servers = [s["name"] for s in results["servers"]]
    if len(servers) < 2:
        return "no chart: fewer than two servers"
    base = servers[0]
    # Every bar reads "above 1: the first server is better": latency ratios are
    # inverted (other / first). MB/s is left out: its ratio equals the IOPS one.
    shown = [("iops", "IOPS", False), ("iops_per_cpu_s", "IOPS per server CPU-s", False),
             ("lat_us_p50", "p50 latency (inverted)", True), ("lat_us_p99", "p99 latency (inverted)", True)]
    cells = [c["name"] for c in results["cells"]]
    fig, axes = plt.subplots(len(servers) - 1, 1, figsize=(max(8, len(cells) * 0.9), 4.5 * (len(servers) - 1)),
                             squeeze=False)
    width = 0.8 / len(shown)
    for ax, other in zip(axes[:, 0], servers[1:]):
        for i, (metric, label, invert) in enumerate(shown):
            vals = []
            for c in results["cells"]:
                v = c["ratios"].get(other, {}).get(metric)
                vals.append((1 / v if invert else v) if v else 0)
            ax.bar([x + i * width for x in range(len(cells))], vals, width, label=label)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + width * (len(shown) - 1) / 2 for x in range(len(cells))])
        ax.set_xticklabels(cells, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"{base} vs {other} (medians)")
        ax.set_title(f"{base} relative to {other}: above 1 means {base} is better")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# ---------------------------------------------------------------- main

def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fio", type=Path, required=True, help="fio built with the libnfs engine (e2e/peers/fio-libnfs.sh)")
    ap.add_argument("--servers", default="chimerad,ganesha-mem",
                    help="comma-separated, first is the one compared: chimerad, ganesha-mem, ganesha-vfs; "
                    "NAME+engine: that server driven by our fio engine (--engine) instead of libnfs")
    ap.add_argument("--engine", type=Path, help="our fio engine, dataplane/fio (make build-fio-engine)")
    ap.add_argument("--chimerad", type=Path, help="chimerad binary (required when chimerad is benchmarked)")
    ap.add_argument("--chimerad-config", type=Path, help="use this config instead of the generated one "
                    "(must bind 127.0.0.1:2049/20048 and export /memfs)")
    ap.add_argument("--chimerad-cores", type=int, default=1)
    ap.add_argument("--capacity-mib", type=int, default=1024, help="chimerad memfs capacity")
    ap.add_argument("--rpcbench", type=Path, help="dataplane rpcbench binary; omitted: no transport microbenchmark")
    ap.add_argument("--rpcbench-calls", type=int, default=20000)
    ap.add_argument("--quick", action="store_true", help="one round, fewer cells, short runs")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--runtime-s", type=int)
    ap.add_argument("--file-mib", type=int, help="size of each test file")
    ap.add_argument("--cells", help="comma-separated cell names (default: all, or the quick set)")
    ap.add_argument("--results", type=Path, help="results directory (default bench/results/<UTC time>)")
    a = ap.parse_args(argv)
    # Defaults depend on --quick; an explicit 0 must reach the range checks.
    if a.rounds is None:
        a.rounds = 1 if a.quick else 3
    if a.runtime_s is None:
        a.runtime_s = 3 if a.quick else 10
    if a.file_mib is None:
        a.file_mib = 64 if a.quick else 256
    if not 1 <= a.rounds <= ROUNDS_MAX:
        ap.error(f"--rounds must be 1..{ROUNDS_MAX}")
    if not 1 <= a.runtime_s <= RUNTIME_S_MAX:
        ap.error(f"--runtime-s must be 1..{RUNTIME_S_MAX}")
    if not 1 <= a.file_mib <= FILE_BYTES_MAX >> 20:
        ap.error(f"--file-mib must be 1..{FILE_BYTES_MAX >> 20}")
    if not 1 <= a.rpcbench_calls <= 10_000_000:
        ap.error("--rpcbench-calls must be 1..10000000")
    return a


def git_commit() -> str | None:
    """The commit benchmarked (with "-dirty" when the tree has changes)."""
    p = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


def select_cells(a: argparse.Namespace) -> list[Cell]:
    by_name = {c.name: c for c in CELLS_FULL}
    names = a.cells.split(",") if a.cells else (CELLS_QUICK_NAMES if a.quick else [c.name for c in CELLS_FULL])
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise BenchError(f"unknown cell(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in names]


def make_servers(a: argparse.Namespace, out_dir: Path) -> list[Server]:
    """The targets in --servers order; a NAME+engine target shares NAME's
    process (created once, whichever of the two comes first)."""
    out: list[Server] = []
    names = [s.strip() for s in a.servers.split(",") if s.strip()]
    if len(set(names)) != len(names) or not names:
        raise BenchError(f"--servers {a.servers!r}: give distinct server names")
    bases: dict[str, Server] = {}
    for n in names:
        base_name = n.removesuffix(ENGINE_SUFFIX)
        if base_name not in bases:
            if base_name == "chimerad":
                if a.chimerad is None:
                    raise BenchError("--chimerad BINARY is required to benchmark chimerad")
                bases[base_name] = Chimerad(a.chimerad, out_dir, a.chimerad_cores, a.capacity_mib << 20,
                                            a.chimerad_config)
            elif base_name in ("ganesha-mem", "ganesha-vfs"):
                bases[base_name] = Ganesha(base_name.split("-")[1])
            else:
                raise BenchError(f"unknown server {n!r} (known: chimerad, ganesha-mem, ganesha-vfs, "
                                 f"each also as NAME{ENGINE_SUFFIX})")
        if n.endswith(ENGINE_SUFFIX):
            if a.engine is None:
                raise BenchError(f"{n}: --engine PATH is required (make build-fio-engine)")
            out.append(ViaEngine(bases[base_name]))
        else:
            out.append(bases[base_name])
    return out


def processes(servers: list[Server]) -> list[Server]:
    """The distinct server processes behind the targets, in first-use order."""
    out: list[Server] = []
    for s in servers:
        b = s.base if isinstance(s, ViaEngine) else s
        if all(b is not o for o in out):
            out.append(b)
    return out


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        raise BenchError("needs root (network namespaces)")
    if not (a.fio.is_file() and os.access(a.fio, os.X_OK)):
        raise BenchError(f"fio binary {a.fio} not found or not executable (run e2e/peers/fio-libnfs.sh)")
    if a.engine is not None and not a.engine.is_file():
        raise BenchError(f"fio engine {a.engine} not found (make build-fio-engine)")
    cells = select_cells(a)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = (a.results or HERE / "results" / stamp).resolve()
    (out_dir / "raw").mkdir(parents=True, exist_ok=True)
    plan = Plan(fio=a.fio, out_dir=out_dir, cells=cells, rounds=a.rounds, runtime_s=a.runtime_s,
                file_bytes=a.file_mib << 20, engine=a.engine.resolve() if a.engine else None)
    servers = make_servers(a, out_dir)
    results = {
        "schema": RESULTS_SCHEMA,
        "started_utc": stamp,
        "quick": a.quick,
        "rounds": a.rounds,
        "runtime_s": a.runtime_s,
        "file_bytes": plan.file_bytes,
        "host": {"cpus": os.cpu_count(), "kernel": os.uname().release,
                 "note": "client and server share this machine's cores",
                 # Other work on the machine skews the comparison (README: "A loaded machine").
                 "loadavg_start": list(os.getloadavg())},
        "git_commit": git_commit(),
        "chimerad_cores": a.chimerad_cores,
        "fio": {"path_name": a.fio.name, "version": run([str(a.fio), "--version"], 10).stdout.strip()},
        "servers": [],
        "cells": [{"name": c.name, "rw": c.rw, "bs_bytes": c.bs_bytes, "iodepth": c.iodepth, "numjobs": c.numjobs,
                   "servers": {s.name: {"runs": []} for s in servers}, "ratios": {}} for c in cells],
        "transport": {s.name: {"runs": []} for s in processes(servers)} if a.rpcbench else None,
        "engine": str(a.engine) if a.engine else None,
        "errors": [],
        "retries": [],
    }
    total = len(cells) * len(servers) * a.rounds
    eta_s = total * (a.runtime_s + 1.5)
    log(f"bench: {len(cells)} cells x {len(servers)} servers x {a.rounds} rounds = {total} runs of {a.runtime_s}s "
        f"(~{eta_s / 60:.0f} min); results in {out_dir}")
    started: list[Server] = []
    try:
        for s in processes(servers):
            log(f"starting {s.name}")
            s.start()
            started.append(s)
            layout(plan, s)
        results["servers"] = [s.describe() for s in servers]
        done = 0
        for rnd in range(1, a.rounds + 1):
            for ci, cell in enumerate(cells):
                for s in servers:
                    done += 1
                    tag = f"[{done:>3}/{total}] round {rnd}/{a.rounds} {cell.name:<22} {s.name:<12}"
                    try:
                        r = run_cell_retry(plan, s, cell, rnd, results, tag)
                    except BenchError as e:
                        results["errors"].append(f"round {rnd} {cell.name} {s.name}: {e}")
                        log(f"{tag} FAILED: {e}")
                        s.check_alive()  # a dead server ends the run; a failed cell does not
                        continue
                    results["cells"][ci]["servers"][s.name]["runs"].append(r)
                    log(f"{tag} {fmt(r['iops']):>7} IOPS {fmt(r['mb_s']):>6} MB/s p50 {fmt(r['lat_us_p50']):>6} us "
                        f"p99 {fmt(r['lat_us_p99']):>6} us srv {r['cpu_s']:.2f} CPU-s {fmt(r['rss_peak_mib'])} MiB")
            if a.rpcbench:
                # The transport figures belong to the server process, not
                # the client: once per process.
                for s in processes(servers):
                    try:
                        r = run_rpcbench(a.rpcbench, s, a.rpcbench_calls, out_dir, rnd)
                    except BenchError as e:
                        results["errors"].append(f"round {rnd} rpcbench {s.name}: {e}")
                        log(f"round {rnd} rpcbench {s.name:<12} FAILED: {e}")
                        continue
                    results["transport"][s.name]["runs"].append(r)
                    log(f"round {rnd} rpcbench {s.name:<12} NULL p50 {fmt(r['null_us_p50'])} us p99 "
                        f"{fmt(r['null_us_p99'])} us; echo p50 {fmt(r['echo_us_p50'])} us; 4 KiB READ p50 "
                        f"{fmt(r['read4k_us_p50'])} us, its echo {fmt(r['read4k_echo_us_p50'])} us")
    except BenchError as e:
        results["errors"].append(f"fatal: {e}")
        log(f"bench: FATAL: {e}")
    finally:
        for s in reversed(started):
            log(f"stopping {s.name}")
            try:
                s.stop()
            except BenchError as e:
                results["errors"].append(f"stop {s.name}: {e}")
    finish(results, servers, out_dir)
    if results["errors"]:
        log(f"bench: {len(results['errors'])} error(s):")
        for e in results["errors"]:
            log(f"  - {e}")
        log(f"bench: FAILED; partial results in {out_dir}")
        return 1
    log(f"bench: results in {out_dir}")
    print(out_dir)
    return 0


def finish(results: dict, servers: list[Server], out_dir: Path) -> None:
    keys = [m[0] for m in METRICS]
    names = [s.name for s in servers]
    results.setdefault("host", {})["loadavg_end"] = list(os.getloadavg())
    if not results["servers"]:
        results["servers"] = [{"name": n} for n in names]
    for cell in results["cells"]:
        for n in names:
            cell["servers"][n]["summary"] = summarize(cell["servers"][n]["runs"], keys)
        base = cell["servers"][names[0]]["summary"]
        for n in names[1:]:
            other = cell["servers"][n]["summary"]
            cell["ratios"][n] = {k: base[k]["median"] / other[k]["median"]
                                 for k in keys if k in base and k in other and other[k]["median"]}
    if results["transport"]:
        tkeys = ["null_us_p50", "null_us_p99", "null_calls_per_s", "null_calls_per_cpu_s", "echo_us_p50",
                 "echo_us_p99", "echo_calls_per_s", "null_over_echo_p50", "read4k_us_p50", "read4k_us_p99",
                 "read4k_echo_us_p50", "read4k_echo_us_p99", "read4k_over_echo_p50"]
        for n in results["transport"]:
            results["transport"][n]["summary"] = summarize(results["transport"][n]["runs"], tkeys)
    writes = [c for c in results["cells"] if "write" in c["rw"]]
    results["rss_peak_mib_write_matrix"] = {
        n: max((r["rss_peak_mib"] for c in writes for r in c["servers"][n]["runs"]), default=None) for n in names}
    any_runs = any(c["servers"][n]["runs"] for c in results["cells"] for n in names)
    table = render_table(results) if any_runs else "(no run produced numbers)"
    note = render_chart(results, out_dir / "ratios.png") if any_runs else "no chart: no numbers"
    results["chart"] = None if note else "ratios.png"
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "table.txt").write_text(table + "\n")
    print(f"\n== results: medians [min-max] over {results['rounds']} round(s); ratios are {names[0]} / other ==")
    print(table)
    print(f"\npeak server RSS through the write cells (MiB): "
          + ", ".join(f"{n} {fmt(v)}" for n, v in results["rss_peak_mib_write_matrix"].items()))
    print(note or f"chart: {out_dir / 'ratios.png'}")
    host = results["host"]
    print("machine load average (1/5/15 min) at start " + " ".join(f"{x:.1f}" for x in host.get("loadavg_start", []))
          + ", at end " + " ".join(f"{x:.1f}" for x in host["loadavg_end"]) + f" on {host.get('cpus')} CPUs")
    print(f"raw fio JSON: {out_dir / 'raw'}; summary: {out_dir / 'results.json'}")
    for r in results["retries"]:
        print(f"note: run repeated once: {r}")


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as e:
        log(f"bench: error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        log("bench: interrupted")
        sys.exit(130)
