#!/usr/bin/env python3
"""NFSv3 metadata load for the diskfs bench: CLIENTS connections, each a CREATE/REMOVE loop.

Why its own client: fio's NFS engine moves data only, and the metadata cell
measures what a CREATE or REMOVE costs when the server must make it durable
before it answers (RFC 1813 §3.3) — one call in flight per connection, as many
clients doing small-file work would, so calls that arrive together may share a
log flush. Each connection creates a name of its own (GUARDED, in the export's
root) and removes it again, for `--seconds`; every call must succeed.

Prints one JSON object: calls, seconds, calls per second, latency percentiles
(microseconds, over every call) and the connections used. Exit status 1 with a
message naming the failed call otherwise.

Standard library only; shares its encoding with bench/nfs3calls.py (no server code).
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import struct
import sys
import threading
import time

import nfs3calls as n3

NFSPROC3_REMOVE = 12
GUARDED = 1
CLIENTS_MAX = 256
SECONDS_MAX = 600
# Latency samples kept per connection (a 10 s run at 10k calls/s needs 100k).
SAMPLES_MAX = 1_000_000


def percentile(sorted_us: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_us:
        raise ValueError("no samples")
    rank = max(1, min(len(sorted_us), math.ceil(p / 100.0 * len(sorted_us))))
    return sorted_us[rank - 1]


def create_args(dir_fh: bytes, name: bytes) -> bytes:
    # CREATE GUARDED, mode 0644 set, nothing else (sattr3: set_mode TRUE, then five "don't set").
    return (n3.opaque(dir_fh) + n3.opaque(name) + struct.pack(">I", GUARDED)
            + struct.pack(">II", 1, 0o644) + struct.pack(">5I", 0, 0, 0, 0, 0))


def remove_args(dir_fh: bytes, name: bytes) -> bytes:
    return n3.opaque(dir_fh) + n3.opaque(name)


class Worker(threading.Thread):
    def __init__(self, index: int, host: str, port: int, root: bytes, deadline: float, tag: str):
        super().__init__(name=f"meta-{index}", daemon=True)
        self.client = n3.Client(host, port, 0, "")
        self.client.xid = 0x6000_0000 + (index << 20)
        self.index, self.host, self.port, self.root, self.deadline, self.tag = index, host, port, root, deadline, tag
        self.lat_us: list[float] = []
        self.calls = 0
        self.error: str | None = None

    def call(self, s: socket.socket, proc: int, args: bytes, what: str) -> None:
        t0 = time.perf_counter()
        n3.nfs_ok(self.client._call(s, n3.NFS_PROGRAM, n3.NFS_V3, proc, args), what)
        if len(self.lat_us) < SAMPLES_MAX:
            self.lat_us.append((time.perf_counter() - t0) * 1e6)
        self.calls += 1

    def run(self) -> None:
        try:
            with socket.create_connection((self.host, self.port), timeout=60) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                i = 0
                while time.monotonic() < self.deadline:
                    name = f"meta-{self.tag}-{self.index}-{i}".encode()
                    self.call(s, n3.NFSPROC3_CREATE, create_args(self.root, name), f"CREATE {name.decode()}")
                    self.call(s, NFSPROC3_REMOVE, remove_args(self.root, name), f"REMOVE {name.decode()}")
                    i += 1
        except (n3.CallError, OSError, struct.error) as e:
            self.error = f"connection {self.index}: {e}"


def mount_root(host: str, mount_port: int, export: str) -> bytes:
    c = n3.Client(host, 0, mount_port, export)
    with socket.create_connection((host, mount_port), timeout=60) as m:
        res = n3.nfs_ok(c._call(m, n3.MOUNT_PROGRAM, n3.MOUNT_V3, n3.MOUNTPROC3_MNT, n3.opaque(export.encode())), "MNT")
    fh, _ = n3.read_fh(res, 0)
    return fh


def run(host: str, nfs_port: int, mount_port: int, export: str, clients: int, seconds: float, tag: str) -> dict:
    if not 1 <= clients <= CLIENTS_MAX:
        raise ValueError(f"--clients must be 1..{CLIENTS_MAX}, got {clients}")
    if not 0 < seconds <= SECONDS_MAX:
        raise ValueError(f"--seconds must be in (0, {SECONDS_MAX}], got {seconds}")
    root = mount_root(host, mount_port, export)
    t0 = time.monotonic()
    workers = [Worker(i, host, nfs_port, root, t0 + seconds, tag) for i in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(seconds + 120)
        if w.is_alive():
            raise n3.CallError(f"connection {w.index} still running {seconds + 120:.0f} s after its deadline")
    took = time.monotonic() - t0
    errors = [w.error for w in workers if w.error]
    if errors:
        raise n3.CallError("; ".join(errors[:4]) + (f" (+{len(errors) - 4} more)" if len(errors) > 4 else ""))
    lat = sorted(x for w in workers for x in w.lat_us)
    calls = sum(w.calls for w in workers)
    if calls == 0:
        raise n3.CallError("no call completed")
    return {"calls": calls, "seconds": took, "calls_per_s": calls / took, "clients": clients,
            "lat_us_p50": percentile(lat, 50), "lat_us_p99": percentile(lat, 99), "lat_us_p99_9": percentile(lat, 99.9)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--nfs-port", type=int, default=2049)
    p.add_argument("--mount-port", type=int, default=20048)
    p.add_argument("--export", required=True)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--tag", default="r", help="names are meta-TAG-CONN-I (one tag per run keeps runs apart)")
    a = p.parse_args(argv)
    try:
        out = run(a.host, a.nfs_port, a.mount_port, a.export, a.clients, a.seconds, a.tag)
    except (n3.CallError, OSError, ValueError) as e:
        print(f"nfs3meta: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
