#!/usr/bin/env python3
"""Durable backends side by side: chimerad on diskfs against NFS-Ganesha VFS on ext4.

What it does (bench/README.md, "diskfs cells", says how to read it):
  1. writes two backing files of the same size in the cache directory (on this
     machine's disk, not tmpfs: diskfs opens its device O_DIRECT), every byte
     written so no read of either lands on a hole;
  2. starts chimerad on diskfs over the first, and NFS-Ganesha (FSAL VFS) over
     ext4 on a loop device (direct I/O to its backing file) over the second, each
     in its own network namespace (bench.py's servers, same fio client);
  3. lays out the read files on both, then round by round runs every cell against
     both servers back to back, and the device baseline (fio io_uring, O_DIRECT,
     4 KiB random reads at QD1 of the diskfs backing file) next to the QD1 cell,
     with the same chimerad on memfs (its own namespace) as the RPC path's
     reference in that cell;
  4. per run records fio's numbers, the server's CPU-seconds, the bytes that
     reached the server's device (write cells: device bytes per byte written),
     and its RSS before and at peak;
  5. prints medians, ratios and the issue's targets (recorded, never gated), and
     keeps every fio JSON in the results directory.

The loop device and the mount are always removed (finally, and on SIGTERM/SIGINT);
a start finds and removes leftovers of a killed run first.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import bench
from bench import BenchError, Cell, log, fmt, run

SCHEMA = "chimera-bench-diskfs/1"
CACHE = Path(os.environ.get("CACHE", Path.home() / ".cache" / "chimera-test"))
SECTOR_BYTES = 512
BLOCK_BYTES = 4096
DEVICE_BYTES_MAX = 16 << 30
# Targets of issue 13 ("Benchmarks"): recorded next to the figures, never gated.
TARGET_IOPS_PER_CPU_RATIO_MIN = 3.0
TARGET_QD1_P50_OVER_DEVICE_US_MAX = 20.0
TARGET_WRITE_AMPLIFICATION_MAX = 2.5
TARGET_RSS_SLACK_BYTES = 256 << 20


@dataclass(frozen=True)
class DiskCell:
    """A cell of the diskfs suite: a bench.Cell plus how it is run."""

    cell: Cell
    # "nfs": fio's libnfs engine (WRITEs UNSTABLE); "filesync": the same engine
    # opening files O_SYNC, so every WRITE is FILE_SYNC (bench/fio-nfs-filesync.sh);
    # "meta": bench/nfs3meta.py, CREATE + REMOVE loops on `iodepth` connections
    # (one call in flight each), "IOPS" being calls per second.
    engine: str = "nfs"
    # Writes this many bytes sequentially to its own file (not time based).
    fixed_bytes: bool = False
    # The device baseline (fio io_uring O_DIRECT on the diskfs file) runs with it.
    with_device: bool = False
    # chimerad on memfs runs it too (same binary, client and cell): the
    # server path without the device, to split a diskfs latency into the
    # RPC path, the device and what diskfs itself adds.
    with_memfs: bool = False

    @property
    def name(self) -> str:
        return self.cell.name


def diskfs_cells(rss_write_bytes: int) -> list[DiskCell]:
    return [
        DiskCell(Cell("4k-randread-qd32-j1", "randread", 4096, 32, 1)),
        DiskCell(Cell("4k-randwrite-qd32-j1", "randwrite", 4096, 32, 1)),
        DiskCell(Cell("4k-randread-qd1-j1", "randread", 4096, 1, 1), with_device=True, with_memfs=True),
        # QD1: no concurrent write to share a log flush with, the worst case.
        DiskCell(Cell("4k-randwrite-filesync-qd1-j1", "randwrite", 4096, 1, 1), engine="filesync"),
        DiskCell(Cell(f"rss-1m-write-{rss_write_bytes >> 20}m", "write", 1 << 20, 1, 1), fixed_bytes=True),
        # 16 clients creating and removing files: what a durable CREATE/REMOVE
        # costs, and whether calls arriving together share a log flush.
        DiskCell(Cell("meta-create-remove-c16", "write", 0, 16, 1), engine="meta"),
    ]


# ---------------------------------------------------------------- /proc and /sys readings

def parse_proc_io(text: str) -> dict[str, int]:
    """/proc/<pid>/io as a dict (proc(5): "key: value" lines)."""
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep or not value.strip().isdigit():
            raise BenchError(f"unexpected /proc/<pid>/io line {line!r}")
        out[key.strip()] = int(value)
    if "write_bytes" not in out:
        raise BenchError("/proc/<pid>/io has no write_bytes (kernel without task I/O accounting?)")
    return out


def parse_block_stat(text: str) -> tuple[int, int]:
    """(bytes read, bytes written) from /sys/block/<dev>/stat: fields 3 and 7, sectors
    read and written, 512 bytes each whatever the device's block size
    (the kernel's Documentation/block/stat.rst)."""
    fields = text.split()
    if len(fields) < 11 or not all(f.isdigit() for f in fields):
        raise BenchError(f"unexpected /sys/block/<dev>/stat content {text.strip()!r}")
    return int(fields[2]) * SECTOR_BYTES, int(fields[6]) * SECTOR_BYTES


def parse_losetup_j(text: str) -> list[str]:
    """Loop devices `losetup -j FILE` lists ("/dev/loop3: []: (/path)" per line)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^(/dev/loop\d+):", line.strip())
        if m:
            out.append(m.group(1))
        elif line.strip():
            raise BenchError(f"unexpected losetup -j line {line!r}")
    return out


# NFSv3 WRITE3args end in count, stable_how, then the data's opaque length (equal
# to count): three XDR words that say how a WRITE of 4 KiB asked to be kept.
_WRITE4K_STABLE = re.compile(rb"\x00\x00\x10\x00\x00\x00\x00([\x00-\x02])\x00\x00\x10\x00")
STABLE_HOW = {0: "UNSTABLE", 1: "DATA_SYNC", 2: "FILE_SYNC"}


def count_write4k_stable(strace_text: str) -> dict[str, int]:
    """How many 4 KiB NFSv3 WRITEs of each stable_how an `strace -xx` log of the client sent."""
    out = {v: 0 for v in STABLE_HOW.values()}
    for line in strace_text.splitlines():
        if "sendto(" not in line and "sendmsg(" not in line and "write" not in line:
            continue
        for literal in re.findall(r'"((?:\\x[0-9a-f]{2})+)"', line):
            data = bytes.fromhex(literal.replace("\\x", ""))
            for m in _WRITE4K_STABLE.finditer(data):
                out[STABLE_HOW[m.group(1)[0]]] += 1
    return out


def proc_device_bytes(pid: int) -> tuple[int, int]:
    """(read_bytes, write_bytes) of /proc/<pid>/io: what the process made the block layer read and write."""
    io = parse_proc_io(Path(f"/proc/{pid}/io").read_text())
    if "read_bytes" not in io:
        raise BenchError(f"/proc/{pid}/io has no read_bytes")
    return io["read_bytes"], io["write_bytes"]


def allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


# ---------------------------------------------------------------- backing files, loop device, mount

def fill_file(path: Path, size_bytes: int) -> None:
    """Write every byte of a new file (zeros, really written: no hole, no unwritten extent)."""
    path.unlink(missing_ok=True)
    chunk = bytes(8 << 20)
    t0 = time.monotonic()
    with open(path, "wb") as f:
        left = size_bytes
        while left:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    if allocated_bytes(path) < size_bytes:
        raise BenchError(f"{path}: {allocated_bytes(path)} of {size_bytes} bytes allocated after filling it "
                         "(a file system that compresses or dedups zeros?)")
    log(f"  filled {path} ({size_bytes >> 20} MiB) in {time.monotonic() - t0:.1f}s")


class Ext4Loop:
    """ext4 on a loop device over a file, mounted at a directory; removable even after a kill."""

    def __init__(self, image: Path, mountpoint: Path):
        self.image = image
        self.mountpoint = mountpoint
        self.dev: str | None = None

    def cleanup_leftovers(self) -> None:
        if subprocess.run(["mountpoint", "-q", str(self.mountpoint)]).returncode == 0:
            log(f"  unmounting a leftover mount at {self.mountpoint}")
            run(["umount", str(self.mountpoint)], timeout_s=60)
        if self.image.exists():
            for dev in parse_losetup_j(run(["losetup", "-j", str(self.image)], timeout_s=30).stdout):
                log(f"  detaching leftover loop device {dev}")
                run(["losetup", "-d", dev], timeout_s=30)

    def setup(self) -> None:
        # Direct I/O from the loop device to its file: ext4's page cache is the only
        # cache, as on a real disk, and the backing file's pages are not a second one.
        self.dev = run(["losetup", "-f", "--show", "--direct-io=on", str(self.image)], timeout_s=30).stdout.strip()
        if not re.fullmatch(r"/dev/loop\d+", self.dev):
            raise BenchError(f"losetup printed {self.dev!r}, not a loop device")
        # nodiscard: mkfs must not punch the pre-written file back into holes.
        run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", self.dev],
            timeout_s=300)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        run(["mount", "-t", "ext4", self.dev, str(self.mountpoint)], timeout_s=60)
        os.chmod(self.mountpoint, 0o777)

    def device_bytes(self) -> tuple[int, int]:
        assert self.dev
        return parse_block_stat(Path(f"/sys/block/{Path(self.dev).name}/stat").read_text())

    def teardown(self) -> list[str]:
        """Unmount and detach; returns what could not be undone (reported as errors)."""
        errs = []
        if subprocess.run(["mountpoint", "-q", str(self.mountpoint)]).returncode == 0:
            p = subprocess.run(["umount", str(self.mountpoint)], capture_output=True, text=True)
            if p.returncode != 0:
                errs.append(f"umount {self.mountpoint}: {p.stderr.strip()}")
        if self.image.exists():
            for dev in parse_losetup_j(subprocess.run(["losetup", "-j", str(self.image)], capture_output=True,
                                                      text=True).stdout):
                p = subprocess.run(["losetup", "-d", dev], capture_output=True, text=True)
                if p.returncode != 0:
                    errs.append(f"losetup -d {dev}: {p.stderr.strip()}")
            # A loop device still open (a mount living on in another process's mount
            # namespace) is only marked autoclear: say who holds it.
            for _ in range(50):
                left = parse_losetup_j(subprocess.run(["losetup", "-j", str(self.image)], capture_output=True,
                                                      text=True).stdout)
                if not left:
                    break
                time.sleep(0.1)
            else:
                errs.append(f"{', '.join(left)} still bound to {self.image}, held by pids "
                            f"{holders(self.mountpoint) or 'unknown'}; it detaches when they exit")
        self.dev = None
        return errs


def holders(mountpoint: Path) -> list[int]:
    """Processes whose mount namespace still has a mount at mountpoint."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if any(line.split()[4] == str(mountpoint) for line in (d / "mountinfo").read_text().splitlines()):
                out.append(int(d.name))
        except (OSError, IndexError):
            continue
    return out


# ---------------------------------------------------------------- servers

class ChimeradDiskfs(bench.Chimerad):
    """chimerad on diskfs over one io_uring device file."""

    def __init__(self, binary: Path, out_dir: Path, cores: int, device: Path, cache_blocks: int, device_poll_us: int = 0):
        super().__init__(binary, out_dir, cores, capacity_bytes=0, config=None)
        self.name = "chimerad-diskfs"
        self.netns = os.environ.get("CHIMERAD_DISKFS_NETNS", "chimera-bench-diskfs")
        self.export = "/diskfs"
        self.capacity_bytes = None
        self.device = device
        self.cache_blocks = cache_blocks
        self.device_poll_us = device_poll_us

    def write_config(self) -> Path:
        cfg = {
            "common": {"log_level": "warn"},
            "server": {"bind": "127.0.0.1", "cores": self.cores, "nfs_port": self.nfs_port,
                       "mount_port": self.mnt_port, "device_poll_us": self.device_poll_us,
                       "vfs": {"diskfs": {"config": {"initialize": True, "block_cache_blocks": self.cache_blocks,
                                                     "devices": [{"type": "io_uring", "path": str(self.device)}]}}}},
            "mounts": {"diskfs": {"module": "diskfs", "path": "/"}},
            "exports": {self.export: {"path": "/diskfs"}},
            "admin": {"enabled": False},
            "metrics": {"enabled": False},
        }
        path = self.out_dir / "chimerad-diskfs.json"
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        return path

    def settle(self) -> None:
        pass  # diskfs caches no data: nothing of an earlier cell is left to write

    def device_bytes(self) -> tuple[int, int]:
        # diskfs reads and writes its device itself, O_DIRECT, from chimerad's
        # threads: the task I/O accounting counts each byte when its bio is
        # submitted (and nothing else of note: chimerad's log is a few lines at warn).
        return proc_device_bytes(self.pid())


class ChimeradMemfs(bench.Chimerad):
    """The same chimerad on memfs: the reference for the cells `with_memfs`."""

    def __init__(self, binary: Path, out_dir: Path, cores: int, file_bytes: int):
        super().__init__(binary, out_dir, cores, capacity_bytes=file_bytes + (256 << 20), config=None)
        self.name = "chimerad-memfs"
        self.netns = os.environ.get("CHIMERAD_MEMFS_NETNS", "chimera-bench-memfs")

    def settle(self) -> None:
        pass

    def device_bytes(self) -> tuple[int, int]:
        return proc_device_bytes(self.pid())


class GaneshaExt4(bench.Server):
    """NFS-Ganesha, FSAL VFS exporting an ext4 mount, its own instance and namespace."""

    def __init__(self, fs: Ext4Loop, state: Path):
        self.name = "ganesha-ext4"
        self.netns = os.environ.get("GANESHA_EXT4_NETNS", "chimera-ganesha-ext4")
        self.nfs_port = 2049
        self.mnt_port = 20048
        self.export = "/vfs"
        self.fs = fs
        self.env = dict(os.environ, GANESHA_NETNS=self.netns, GANESHA_STATE=str(state),
                        GANESHA_VFS_DIR=str(fs.mountpoint))
        self._pid = 0

    def _script(self, verb: str, timeout_s: float, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(bench.PEERS / "ganesha.sh"), verb]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=self.env)
        except subprocess.TimeoutExpired as e:
            raise BenchError(f"ganesha.sh {verb} did not finish within {timeout_s}s") from e
        if check and p.returncode != 0:
            raise BenchError(f"ganesha.sh {verb} failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-2000:]}")
        return p

    def start(self) -> None:
        self._script("stop", 60, check=False)  # a leftover of a killed run
        self._script("start", bench.SERVER_START_TIMEOUT_S + 120)
        p = self._script("status", 30)
        fields = dict(kv.split("=", 1) for kv in p.stdout.split()[1:] if "=" in kv)
        self._pid = int(fields["pid"])

    def stop(self) -> None:
        self._script("stop", 60, check=False)
        self._pid = 0

    def pid(self) -> int:
        return self._pid

    def settle(self) -> None:
        # Dirty pages of earlier cells (the layout, UNSTABLE writes) must reach the
        # device before this cell's window opens, or their writeback is charged to it.
        run(["sync", "-f", str(self.fs.mountpoint)], timeout_s=300)

    def device_bytes(self) -> tuple[int, int]:
        # Ganesha writes through ext4: the journal goes out from jbd2 and data
        # from writeback, not from Ganesha's threads, so its task I/O accounting
        # would miss them. The loop device under ext4 sees every byte.
        return self.fs.device_bytes()


# ---------------------------------------------------------------- runs

def nfs_engine_args(server: bench.Server, dcell: DiskCell, filesync_engine: Path | None) -> list[str]:
    if dcell.engine == "filesync":
        if filesync_engine is None:
            raise BenchError("the FILE_SYNC cell needs --filesync-engine (bench/fio-nfs-filesync.sh)")
        return [f"--ioengine=external:{filesync_engine}", f"--nfs_url={server.nfs_url()}"]
    return ["--ioengine=nfs", f"--nfs_url={server.nfs_url()}"]


def cell_args(dcell: DiskCell, runtime_s: int) -> list[str]:
    c = dcell.cell
    out = [f"--rw={c.rw}", f"--bs={c.bs_bytes}", f"--iodepth={c.iodepth}", f"--numjobs={c.numjobs}",
           "--percentile_list=" + ":".join(bench.PERCENTILES), "--lat_percentiles=1"]
    if not dcell.fixed_bytes:
        out += ["--time_based", f"--runtime={runtime_s}"]
    if c.rw.startswith("rand"):
        out.append("--norandommap")
    return out


def parse_meta(doc: dict) -> dict:
    """bench/nfs3meta.py's numbers in the fio cells' terms (IOPS: calls per second)."""
    for k in ("calls", "seconds", "calls_per_s", "lat_us_p50", "lat_us_p99", "lat_us_p99_9"):
        if not isinstance(doc.get(k), (int, float)):
            raise BenchError(f"nfs3meta output lacks {k}: {doc}")
    if doc["calls"] <= 0:
        raise BenchError("nfs3meta completed no call")
    return {"iops": doc["calls_per_s"], "total_ios": doc["calls"], "fio_runtime_s": doc["seconds"],
            "lat_us_p50": doc["lat_us_p50"], "lat_us_p99": doc["lat_us_p99"], "lat_us_p99_9": doc["lat_us_p99_9"]}


def run_meta(a: argparse.Namespace, server: bench.Server, dcell: DiskCell, rnd: int, raw: Path) -> dict:
    cmd = ["ip", "netns", "exec", server.netns, sys.executable, str(bench.HERE / "nfs3meta.py"),
           "--nfs-port", str(server.nfs_port), "--mount-port", str(server.mnt_port), "--export", server.export,
           "--clients", str(dcell.cell.iodepth), "--seconds", str(a.runtime_s), "--tag", f"r{rnd}"]
    p = run(cmd, timeout_s=a.runtime_s + bench.FIO_SLACK_S + 120)
    raw.write_text(p.stdout)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise BenchError(f"nfs3meta printed no JSON ({e}): {p.stdout[-500:]!r}") from e
    return parse_meta(doc)


def run_server_cell(a: argparse.Namespace, out_dir: Path, server: bench.Server, dcell: DiskCell, rnd: int) -> dict:
    raw = out_dir / "raw" / f"r{rnd}-{dcell.name}-{server.name}.json"
    if dcell.engine == "meta":
        return run_measured(server, dcell, rnd, out_dir, raw, lambda: run_meta(a, server, dcell, rnd, raw))
    if dcell.fixed_bytes:
        files = ["--filename_format=rss.$jobnum", f"--size={a.rss_write_bytes}"]
        timeout_s = a.rss_write_bytes / (1 << 20) + bench.FIO_SLACK_S  # 1 MiB/s floor
    else:
        files = ["--filename_format=bench.$jobnum", f"--size={a.file_mib << 20}"]
        timeout_s = a.runtime_s + bench.FIO_SLACK_S
    cmd = (["ip", "netns", "exec", server.netns, str(a.fio), "--output-format=json", f"--output={raw}",
            f"--name={dcell.name}"] + nfs_engine_args(server, dcell, a.filesync_engine) + files
           + ["--group_reporting"] + cell_args(dcell, a.runtime_s))
    teardown: list[int] = []

    def fio() -> dict:
        doc = bench.run_fio(cmd, timeout_s, raw, teardown_max=(dcell.cell.iodepth - 1) * dcell.cell.numjobs)
        teardown.append(doc["chimera_bench_teardown_errors"])
        return bench.parse_fio(doc, dcell.cell)
    r = run_measured(server, dcell, rnd, out_dir, raw, fio)
    r["client_teardown_errors"] = teardown[0]
    return r


def run_measured(server: bench.Server, dcell: DiskCell, rnd: int, out_dir: Path, raw: Path, load) -> dict:
    """Run `load` (it returns the client's numbers) and add the server's: CPU-seconds, RSS, device bytes."""
    server.settle()
    pid = server.pid()
    server.check_alive()
    rss_start = bench.proc_status_bytes(pid, "VmRSS")
    bench.reset_peak_rss(pid)
    cpu0 = bench.proc_cpu_s(pid)
    read0, written0 = server.device_bytes()
    r = load()
    read1, written1 = server.device_bytes()
    dev_read, dev_written = read1 - read0, written1 - written0
    cpu_s = bench.proc_cpu_s(pid) - cpu0
    r["cpu_s"] = cpu_s
    r["iops_per_cpu_s"] = r["total_ios"] / cpu_s if cpu_s > 0 else None
    r["rss_start_mib"] = rss_start / (1 << 20)
    r["rss_peak_mib"] = bench.proc_status_bytes(pid, "VmHWM") / (1 << 20)
    r["rss_growth_mib"] = r["rss_peak_mib"] - r["rss_start_mib"]
    r["dev_written_mib"] = dev_written / (1 << 20)
    r["dev_read_mib"] = dev_read / (1 << 20)
    moved = r["total_ios"] * dcell.cell.bs_bytes
    if dcell.engine == "meta":
        # What reached the device per metadata call (the log units, the journal).
        r["dev_kib_written_per_call"] = dev_written / 1024 / r["total_ios"]
    elif dcell.cell.direction == "write":
        r["dev_bytes_per_byte"] = amplification(dev_written, moved)
    else:
        # Below 1: reads served from a cache (Ganesha: ext4's page cache), not the device.
        r["dev_read_bytes_per_byte"] = amplification(dev_read, moved)
    r["round"] = rnd
    r["raw"] = str(raw.relative_to(out_dir))
    return r


def amplification(device_bytes: int, client_bytes: int) -> float | None:
    """Device bytes per byte the client moved (None when it moved none)."""
    if client_bytes <= 0:
        return None
    if device_bytes < 0:
        raise BenchError(f"a device byte counter went backwards by {-device_bytes} bytes")
    return device_bytes / client_bytes


def run_device_cell(a: argparse.Namespace, out_dir: Path, dcell: DiskCell, rnd: int) -> dict:
    """The device's own 4 KiB random-read latency: fio io_uring, O_DIRECT, on the diskfs file."""
    raw = out_dir / "raw" / f"r{rnd}-{dcell.name}-device.json"
    cmd = [str(a.fio), "--output-format=json", f"--output={raw}", f"--name={dcell.name}-device",
           "--ioengine=io_uring", "--direct=1", "--readonly", f"--filename={a.diskfs_device}",
           f"--size={a.device_mib << 20}", "--group_reporting"] + cell_args(dcell, a.runtime_s)
    doc = bench.run_fio(cmd, a.runtime_s + bench.FIO_SLACK_S, raw)
    r = bench.parse_fio(doc, dcell.cell)
    r["round"] = rnd
    r["raw"] = str(raw.relative_to(out_dir))
    return r


def layout(a: argparse.Namespace, out_dir: Path, server: bench.Server) -> None:
    raw = out_dir / "raw" / f"layout-{server.name}.json"
    cmd = ["ip", "netns", "exec", server.netns, str(a.fio), "--output-format=json", f"--output={raw}",
           "--name=layout", "--ioengine=nfs", f"--nfs_url={server.nfs_url()}", "--filename_format=bench.$jobnum",
           f"--size={a.file_mib << 20}", "--group_reporting", "--rw=write", "--bs=1m", "--iodepth=1", "--numjobs=1"]
    t0 = time.monotonic()
    bench.run_fio(cmd, (a.file_mib) + bench.FIO_SLACK_S, raw)
    log(f"  laid out {a.file_mib} MiB on {server.name} in {time.monotonic() - t0:.1f}s")


def check_filesync_on_wire(a: argparse.Namespace, out_dir: Path, server: bench.Server) -> dict[str, int]:
    """Prove the FILE_SYNC cell's engine sends FILE_SYNC: 8 WRITEs under strace, decoded.

    The write-amplification figure means nothing if a libnfs or fio change made
    the engine's WRITEs UNSTABLE again, so every run checks it on the wire."""
    if a.filesync_engine is None:
        raise BenchError("the FILE_SYNC cell needs --filesync-engine (bench/fio-nfs-filesync.sh)")
    trace = out_dir / "raw" / f"filesync-check-{server.name}.strace"
    cmd = ["ip", "netns", "exec", server.netns, "strace", "-f", "-qq", "-e", "trace=sendto,sendmsg,write,writev",
           "-xx", "-s", "256", "-o", str(trace), str(a.fio), "--name=filesync-check",
           f"--ioengine=external:{a.filesync_engine}", f"--nfs_url={server.nfs_url()}",
           "--filename=filesync-check.0", "--size=1m", "--rw=write", "--bs=4k", "--number_ios=8",
           "--output-format=json", f"--output={out_dir / 'raw' / f'filesync-check-{server.name}.json'}"]
    run(cmd, timeout_s=bench.FIO_SLACK_S)
    seen = count_write4k_stable(trace.read_text(errors="replace"))
    if seen["FILE_SYNC"] < 8 or seen["UNSTABLE"] or seen["DATA_SYNC"]:
        raise BenchError(f"the FILE_SYNC engine's WRITEs on the wire: {seen} (expected 8 FILE_SYNC only); "
                         f"trace {trace}")
    log(f"  checked on the wire: the FILE_SYNC engine sent {seen['FILE_SYNC']} FILE_SYNC WRITEs to {server.name}")
    return seen


# ---------------------------------------------------------------- summary

METRICS = (
    ("iops", "IOPS", "higher"),
    ("lat_us_p50", "p50 us", "lower"),
    ("lat_us_p99", "p99 us", "lower"),
    ("cpu_s", "srv CPU-s", "lower"),
    ("iops_per_cpu_s", "IOPS/CPU-s", "higher"),
    ("dev_bytes_per_byte", "dev bytes written/byte", "lower"),
    ("dev_read_bytes_per_byte", "dev bytes read/byte", "lower"),
    ("dev_kib_written_per_call", "dev KiB written/call", "lower"),
    ("rss_start_mib", "RSS start MiB", "lower"),
    ("rss_peak_mib", "RSS peak MiB", "lower"),
    ("rss_growth_mib", "RSS growth MiB", "lower"),
)


def summarize_cells(results: dict) -> None:
    keys = [m[0] for m in METRICS]
    names = [s["name"] for s in results["servers"]]
    for cell in results["cells"]:
        for n, entry in cell["servers"].items():
            entry["summary"] = bench.summarize(entry["runs"], keys)
        base = cell["servers"][names[0]]["summary"]
        for n in names[1:]:
            other = cell["servers"].get(n, {}).get("summary", {})
            cell["ratios"][n] = {k: base[k]["median"] / other[k]["median"]
                                 for k in keys if k in base and k in other and other[k]["median"]}


def median_of(results: dict, cell_name: str, server: str, metric: str) -> float | None:
    for c in results["cells"]:
        if c["name"] == cell_name:
            st = c["servers"].get(server, {}).get("summary", {}).get(metric)
            return st["median"] if st else None
    return None


def targets(results: dict) -> list[dict]:
    """The issue's four targets against the medians: figure, target, met (None: no data)."""
    out = []
    chim, gan = "chimerad-diskfs", "ganesha-ext4"
    for cell in ("4k-randread-qd32-j1", "4k-randwrite-qd32-j1"):
        c, g = median_of(results, cell, chim, "iops_per_cpu_s"), median_of(results, cell, gan, "iops_per_cpu_s")
        ratio = c / g if c is not None and g else None
        out.append({"target": f"{cell}: IOPS per server CPU-s, {chim} / {gan}", "value": ratio,
                    "limit": f">= {TARGET_IOPS_PER_CPU_RATIO_MIN:g}x",
                    "met": None if ratio is None else ratio >= TARGET_IOPS_PER_CPU_RATIO_MIN})
    c, d = median_of(results, "4k-randread-qd1-j1", chim, "lat_us_p50"), \
        median_of(results, "4k-randread-qd1-j1", "device", "lat_us_p50")
    over = c - d if c is not None and d is not None else None
    out.append({"target": f"4k-randread-qd1-j1: p50 of {chim} minus the device's p50 (us)", "value": over,
                "limit": f"<= +{TARGET_QD1_P50_OVER_DEVICE_US_MAX:g} us",
                "met": None if over is None else over <= TARGET_QD1_P50_OVER_DEVICE_US_MAX})
    # The same split with the RPC path taken out: what diskfs adds over memfs
    # and the device (the target above also counts the client and TCP, which
    # the device baseline has none of). Informative, no target of its own.
    mem = median_of(results, "4k-randread-qd1-j1", "chimerad-memfs", "lat_us_p50")
    own = c - mem - d if None not in (c, mem, d) else None
    out.append({"target": f"4k-randread-qd1-j1: p50 of {chim} minus chimerad-memfs's p50 (the RPC path, "
                          "same client) minus the device's (us)", "value": own, "limit": "informative",
                "met": None, "info": True})
    wa = median_of(results, "4k-randwrite-filesync-qd1-j1", chim, "dev_bytes_per_byte")
    out.append({"target": "4k FILE_SYNC random writes: device bytes per byte written", "value": wa,
                "limit": f"<= {TARGET_WRITE_AMPLIFICATION_MAX:g}",
                "met": None if wa is None else wa <= TARGET_WRITE_AMPLIFICATION_MAX})
    rss_cells = [c["name"] for c in results["cells"] if c["name"].startswith("rss-")]
    peak = max((r["rss_peak_mib"] for c in results["cells"] if c["name"] in rss_cells
                for r in c["servers"].get(chim, {}).get("runs", [])), default=None)
    bound_mib = (results["diskfs"]["block_cache_blocks"] * BLOCK_BYTES + TARGET_RSS_SLACK_BYTES) / (1 << 20)
    out.append({"target": f"peak RSS of {chim} writing 4x the block cache (MiB; block cache + 256 MiB; the inode "
                          "cache is not a byte bound in this build)", "value": peak, "limit": f"<= {bound_mib:.0f}",
                "met": None if peak is None else peak <= bound_mib})
    return out


def render(results: dict) -> str:
    lines = [bench.render_table(results, METRICS)]
    lines.append("")
    lines.append("targets of issue 13 (recorded, not gated):")
    for t in results["targets"]:
        if t.get("info"):
            lines.append(f"  {t['target']}: {fmt(t['value'])} ({t['limit']})")
            continue
        state = "no data" if t["met"] is None else ("met" if t["met"] else "NOT met")
        lines.append(f"  {t['target']}: {fmt(t['value'])} (target {t['limit']}): {state}")
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fio", type=Path, required=True, help="fio built with the libnfs engine")
    ap.add_argument("--filesync-engine", type=Path, help="bench/fio-nfs-filesync.sh's engine (FILE_SYNC cell)")
    ap.add_argument("--chimerad", type=Path, required=True)
    ap.add_argument("--chimerad-cores", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="one round, 3 s runs, smaller files")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--runtime-s", type=int)
    ap.add_argument("--file-mib", type=int, help="the read/write file laid out on each server")
    ap.add_argument("--device-mib", type=int, help="each backing file (diskfs device, ext4 loop image)")
    ap.add_argument("--cache-blocks", type=int, default=16384, help="diskfs block_cache_blocks (4 KiB each)")
    ap.add_argument("--device-poll-us", type=int, default=0,
                    help="chimerad server.device_poll_us: polling while device I/O is in flight (0: sleep at once)")
    ap.add_argument("--cells", help="comma-separated cell names (default: all)")
    ap.add_argument("--dir", type=Path, default=CACHE / "bench", help="where the backing files live (a disk, not tmpfs)")
    ap.add_argument("--results", type=Path)
    a = ap.parse_args(argv)
    if a.rounds is None:
        a.rounds = 1 if a.quick else 3
    if a.runtime_s is None:
        a.runtime_s = 3 if a.quick else 10
    if a.file_mib is None:
        a.file_mib = 128 if a.quick else 256
    if a.device_mib is None:
        a.device_mib = 1024 if a.quick else 2048
    if not 1 <= a.rounds <= bench.ROUNDS_MAX:
        ap.error(f"--rounds must be 1..{bench.ROUNDS_MAX}")
    if not 1 <= a.runtime_s <= bench.RUNTIME_S_MAX:
        ap.error(f"--runtime-s must be 1..{bench.RUNTIME_S_MAX}")
    if not 256 <= a.cache_blocks <= 1 << 20:
        ap.error("--cache-blocks must be 256..1048576")
    a.rss_write_bytes = 4 * a.cache_blocks * BLOCK_BYTES
    if not 64 <= a.device_mib <= DEVICE_BYTES_MAX >> 20:
        ap.error(f"--device-mib must be 64..{DEVICE_BYTES_MAX >> 20}")
    # Room for the read file, the RSS file and diskfs's own log and checkpoints.
    if not 1 <= a.file_mib or (a.file_mib << 20) + a.rss_write_bytes > (a.device_mib << 20) * 3 // 4:
        ap.error("--file-mib plus 4x the block cache must fit in 3/4 of --device-mib")
    return a


def select(a: argparse.Namespace) -> list[DiskCell]:
    cells = diskfs_cells(a.rss_write_bytes)
    if not a.cells:
        return cells
    by_name = {c.name: c for c in cells}
    unknown = [n for n in a.cells.split(",") if n not in by_name]
    if unknown:
        raise BenchError(f"unknown cell(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in a.cells.split(",")]


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def new_results(a: argparse.Namespace, stamp: str, fstype: str, cells: list[DiskCell], names: list[str]) -> dict:
    return {
        "schema": SCHEMA, "started_utc": stamp, "quick": a.quick, "rounds": a.rounds, "runtime_s": a.runtime_s,
        "file_bytes": a.file_mib << 20,
        "host": {"cpus": os.cpu_count(), "kernel": os.uname().release, "backing_fs": fstype,
                 "note": "client and servers share this machine's cores", "loadavg_start": list(os.getloadavg())},
        "git_commit": bench.git_commit(),
        "diskfs": {"device_bytes": a.device_mib << 20, "block_cache_blocks": a.cache_blocks,
                   "rss_write_bytes": a.rss_write_bytes},
        "ganesha_ext4": {"image_bytes": a.device_mib << 20, "loop": "direct-io=on", "fs": "ext4"},
        "fio": {"version": run([str(a.fio), "--version"], 10).stdout.strip(),
                "filesync_engine": str(a.filesync_engine) if a.filesync_engine else None},
        "servers": [{"name": n} for n in names] + [{"name": "device"}],
        "cells": [{"name": c.name, "rw": c.cell.rw, "bs_bytes": c.cell.bs_bytes, "iodepth": c.cell.iodepth,
                   "numjobs": c.cell.numjobs, "engine": c.engine,
                   "servers": {n: {"runs": []} for n in names + (["device"] if c.with_device else [])
                               if n != "chimerad-memfs" or c.with_memfs},
                   "ratios": {}} for c in cells],
        "errors": [], "retries": [],
    }


def prepare(a: argparse.Namespace, out_dir: Path, ext4: Ext4Loop, servers: list[bench.Server],
            started: list[bench.Server], cells: list[DiskCell], results: dict) -> None:
    """Backing files, the ext4 loop mount, the servers and their files; `started` collects what to stop."""
    ext4.cleanup_leftovers()
    fill_file(a.diskfs_device, a.device_mib << 20)
    fill_file(ext4.image, a.device_mib << 20)
    ext4.setup()
    for s in servers:
        log(f"starting {s.name}")
        s.start()
        started.append(s)
        layout(a, out_dir, s)
    if any(c.engine == "filesync" for c in cells):
        results["filesync_check"] = check_filesync_on_wire(a, out_dir, servers[0])
    # diskfs must not have punched the filled device back into holes (the
    # device baseline would then time reads that never reach the disk).
    if allocated_bytes(a.diskfs_device) < (a.device_mib << 20):
        raise BenchError(f"{a.diskfs_device} has holes after chimerad started "
                         f"({allocated_bytes(a.diskfs_device)} of {a.device_mib << 20} bytes allocated)")


def run_once(a: argparse.Namespace, out_dir: Path, s: bench.Server | None, dcell: DiskCell, rnd: int,
             results: dict, tag: str) -> dict:
    """One run; a failed one is repeated once while the server lives (as bench.py does), and recorded."""
    def go() -> dict:
        return run_server_cell(a, out_dir, s, dcell, rnd) if s else run_device_cell(a, out_dir, dcell, rnd)
    try:
        return go()
    except BenchError as e:
        if s:
            s.check_alive()
        results["retries"].append(f"round {rnd} {dcell.name} {s.name if s else 'device'}: {e}")
        log(f"{tag} retrying once after: {e}")
    return go()


def run_rounds(a: argparse.Namespace, out_dir: Path, cells: list[DiskCell], servers: list[bench.Server],
               results: dict) -> None:
    for rnd in range(1, a.rounds + 1):
        for ci, dcell in enumerate(cells):
            runs = [(s.name, s) for s in servers if dcell.with_memfs or not isinstance(s, ChimeradMemfs)] \
                + ([("device", None)] if dcell.with_device else [])
            for name, s in runs:
                tag = f"round {rnd}/{a.rounds} {dcell.name:<30} {name:<16}"
                try:
                    r = run_once(a, out_dir, s, dcell, rnd, results, tag)
                except BenchError as e:
                    results["errors"].append(f"round {rnd} {dcell.name} {name}: {e}")
                    log(f"{tag} FAILED: {e}")
                    if s:
                        s.check_alive()  # a dead server ends the run; a failed cell does not
                    continue
                results["cells"][ci]["servers"][name]["runs"].append(r)
                extra = f" dev {fmt(r['dev_bytes_per_byte'])} B/B" if "dev_bytes_per_byte" in r else ""
                if "dev_kib_written_per_call" in r:
                    extra = f" dev {fmt(r['dev_kib_written_per_call'])} KiB/call"
                cpu = f" srv {r['cpu_s']:.2f} CPU-s RSS {fmt(r['rss_peak_mib'])} MiB" if "cpu_s" in r else ""
                log(f"{tag} {fmt(r['iops']):>7} IOPS p50 {fmt(r['lat_us_p50']):>6} us p99 "
                    f"{fmt(r['lat_us_p99']):>6} us{cpu}{extra}")


def report(results: dict, out_dir: Path) -> int:
    results["host"]["loadavg_end"] = list(os.getloadavg())
    summarize_cells(results)
    results["targets"] = targets(results)
    table = render(results)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "table.txt").write_text(table + "\n")
    base = results["servers"][0]["name"]
    print(f"\n== diskfs: medians [min-max] over {results['rounds']} round(s); ratios are {base} / other ==")
    print(table)
    host = results["host"]
    print("machine load average (1/5/15 min) at start " + " ".join(f"{x:.1f}" for x in host["loadavg_start"])
          + ", at end " + " ".join(f"{x:.1f}" for x in host["loadavg_end"]) + f" on {host['cpus']} CPUs")
    print(f"raw fio JSON: {out_dir / 'raw'}; summary: {out_dir / 'results.json'}")
    for r in results["retries"]:
        print(f"note: run repeated once: {r}")
    if results["errors"]:
        log(f"bench-diskfs: {len(results['errors'])} error(s):")
        for e in results["errors"]:
            log(f"  - {e}")
        return 1
    return 0


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        raise BenchError("needs root (network namespaces, loop devices, mounts)")
    cells = select(a)
    signal.signal(signal.SIGTERM, _terminate)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = (a.results or bench.HERE / "results" / f"diskfs-{stamp}").resolve()
    (out_dir / "raw").mkdir(parents=True, exist_ok=True)
    a.dir.mkdir(parents=True, exist_ok=True)
    fstype = run(["stat", "-f", "-c", "%T", str(a.dir)], timeout_s=10).stdout.strip()
    if fstype in ("tmpfs", "ramfs"):
        raise BenchError(f"{a.dir} is on {fstype}: diskfs needs O_DIRECT and a disk; pass --dir on a disk")
    a.diskfs_device = a.dir / "diskfs.img"
    ext4 = Ext4Loop(a.dir / "ganesha-ext4.img", a.dir / "ganesha-ext4.mnt")
    servers: list[bench.Server] = [
        ChimeradDiskfs(a.chimerad, out_dir, a.chimerad_cores, a.diskfs_device, a.cache_blocks, a.device_poll_us),
        GaneshaExt4(ext4, a.dir / "ganesha-ext4.state"),
    ]
    if any(c.with_memfs for c in cells):
        servers.append(ChimeradMemfs(a.chimerad, out_dir, a.chimerad_cores, a.file_mib << 20))
    results = new_results(a, stamp, fstype, cells, [s.name for s in servers])
    log(f"bench-diskfs: {len(cells)} cells x {len(servers)} servers x {a.rounds} rounds; results in {out_dir}")
    started: list[bench.Server] = []
    try:
        prepare(a, out_dir, ext4, servers, started, cells, results)
        run_rounds(a, out_dir, cells, servers, results)
    except (BenchError, KeyboardInterrupt) as e:
        results["errors"].append(f"fatal: {e!r}" if isinstance(e, KeyboardInterrupt) else f"fatal: {e}")
        log(f"bench-diskfs: FATAL: {e!r}")
    finally:
        # Every exit path: servers, then the mount and the loop device, then the files.
        for s in reversed(started):
            log(f"stopping {s.name}")
            try:
                s.stop()
            except BenchError as e:
                results["errors"].append(f"stop {s.name}: {e}")
        for e in ext4.teardown():
            results["errors"].append(f"cleanup: {e}")
        # The backing files are large; the next run writes them again anyway.
        for f in (a.diskfs_device, ext4.image):
            f.unlink(missing_ok=True)
    return report(results, out_dir)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as e:
        log(f"bench-diskfs: error: {e}")
        sys.exit(1)
