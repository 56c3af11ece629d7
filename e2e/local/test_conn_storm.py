"""Connection storms against a real chimerad (2 cores, memfs): 1,000
connections that each keep NULL calls in flight, then 3,000 (only 1,024 fit
under conns_max), each for a few seconds, driven by `rpcbench storm` (one
polling thread under SCHED_IDLE, so that on this 2-CPU machine the generator
does not take the CPUs from the server it measures: at nice 10 it still ran
11.5 ms at a stretch while a server loop waited on its CPU) while a well-behaved client
on its own connection, at normal priority, makes one NULL call at a time. Proves, per storm: the good client's NULL p99 stays
under 10 ms; the server's resident memory during the storm stays within
64 KiB per admitted connection over its size before (connections own 32 KiB
of buffers; NULL replies never need a pool buffer); after the clients leave
it is back within 64 MiB of where it started (buffers are unmapped at
close); and the storm was real (calls answered on ~every admitted connection,
the excess refused).

The server runs with `server.pin_cores: true`, as on a node whose pod has
dedicated CPUs. Unpinned on this 2-CPU machine, the two polling loops and
the generator are three busy threads on two CPUs, and the scheduler at
times stacks both loops on one CPU, where they take turns of whole time
slices (perf sched: core-0 and core-1 alternating 4.2 and 7.8 ms on one CPU
while the other ran the generator). The good client's p99 then measured
the scheduler (5.3-6.0 ms here with the generator at nice 10, 12.8 ms in a
CI run) rather than the server (0.6-2.6 ms pinned, same runs; 0.2-2.2 ms
pinned with the generator idle-class, one run of ten at 5.0)."""

import json
import os
import subprocess
import threading
import time

import pytest

from conftest import ROOT, Server

RPCBENCH = os.environ.get("RPCBENCH", os.path.join(ROOT, "dataplane", "target", "release", "rpcbench"))
MiB = 1 << 20
KiB = 1 << 10
CONNS_MAX = 1024  # chimerad's default server.conns_max
STORM_SECONDS = 4


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KiB
    raise AssertionError("no VmRSS")


class Sampler:
    """The largest RSS seen, sampled every 50 ms on its own thread."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.05)

    def done(self):
        self.stop.set()
        self.t.join()
        return self.peak


@pytest.fixture(scope="module")
def stormed(tmp_path_factory):
    assert os.path.exists(RPCBENCH), f"{RPCBENCH} missing: run `make build-dataplane`"
    s = Server(str(tmp_path_factory.mktemp("storm")), extra_server={"pin_cores": True})
    yield s
    s.stop()


def storm(server, conns):
    before = rss_bytes(server.proc.pid)
    sampler = Sampler(server.proc.pid)
    out = subprocess.run(
        [RPCBENCH, "storm", "--addr", f"127.0.0.1:{server.nfs_port}", "--conns", str(conns),
         "--depth", "4", "--seconds", str(STORM_SECONDS), "--json"],
        capture_output=True, text=True, timeout=STORM_SECONDS + 60)
    peak = sampler.done()
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    # The clients are gone; give the loops a moment to close every socket.
    deadline = time.time() + 10
    while server.metric("chimera_connections_open") > 0 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    after = rss_bytes(server.proc.pid)
    print(f"storm of {conns}: {r}; RSS before {before / MiB:.1f} MiB, peak {peak / MiB:.1f} MiB, after {after / MiB:.1f} MiB")
    return r, before, peak, after


@pytest.mark.parametrize("conns", [1000, 3000])
def test_storm_keeps_a_good_client_fast_and_memory_bounded(stormed, conns):
    r, before, peak, after = storm(stormed, conns)
    admitted = min(conns, CONNS_MAX - 1)  # the good client holds one place
    assert r["served"] >= admitted * 0.95, f"storm not real: {r['served']} of {admitted} connections answered"
    assert r["calls"] >= 10 * admitted, f"storm not real: {r['calls']} calls"
    if conns > CONNS_MAX:
        assert r["refused"] >= conns - CONNS_MAX, f"over the limit, {r['refused']} refused"
        assert r["served"] <= CONNS_MAX - 1
    assert r["good"]["calls"] >= 1000, r["good"]
    assert r["good"]["p99_us"] < 10_000, f"good client's NULL p99 {r['good']['p99_us']} us under the storm"
    assert peak - before <= admitted * 64 * KiB, \
        f"RSS grew {(peak - before) / MiB:.1f} MiB for {admitted} connections (bound {admitted * 64 * KiB / MiB:.0f} MiB)"
    assert after <= before + 64 * MiB, f"RSS {after / MiB:.1f} MiB after the storm, {before / MiB:.1f} MiB before"
