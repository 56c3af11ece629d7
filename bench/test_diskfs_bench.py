"""Unit tests of the diskfs suite's own logic (bench/diskfs_bench.py), no servers.

Proves: /proc/<pid>/io, /sys/block/<dev>/stat and `losetup -j` output are read
into the right numbers, and malformed text is an error, never a number (the
/proc reader is also checked against this process's real counters); write
amplification refuses a counter that went backwards; the FILE_SYNC cell runs
the external engine and refuses to run without it; fixed-size cells are not
time based; the issue's targets are judged on medians (met, not met, no data);
the shared table leaves out metrics no run measured; bad arguments are refused.
"""

import os
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402
import diskfs_bench as db  # noqa: E402

PROC_IO = """rchar: 4096
wchar: 8192
syscr: 3
syscw: 2
read_bytes: 0
write_bytes: 1245184
cancelled_write_bytes: 0
"""

# /sys/block/loop0/stat: 17 fields; the 7th is sectors written.
BLOCK_STAT = "    1393        0    54010      212    60110        0  2097160    31720        0    32040    31932        0        0        0        0      120       14\n"


class Readers(unittest.TestCase):
    def test_proc_io(self):
        d = db.parse_proc_io(PROC_IO)
        self.assertEqual(d["write_bytes"], 1245184)
        self.assertEqual(d["rchar"], 4096)
        with self.assertRaisesRegex(bench.BenchError, "unexpected"):
            db.parse_proc_io(PROC_IO + "write_bytes: lots\n")
        with self.assertRaisesRegex(bench.BenchError, "no write_bytes"):
            db.parse_proc_io("rchar: 1\n")

    def test_proc_io_of_this_process(self):
        before = db.parse_proc_io(Path("/proc/self/io").read_text())["rchar"]
        with tempfile.TemporaryFile() as f:
            f.write(b"x" * 65536)
            f.seek(0)
            self.assertEqual(len(f.read()), 65536)
        after = db.parse_proc_io(Path(f"/proc/{os.getpid()}/io").read_text())["rchar"]
        self.assertGreaterEqual(after - before, 65536)

    def test_block_stat_sectors_are_512_bytes(self):
        self.assertEqual(db.parse_block_stat(BLOCK_STAT), (54010 * 512, 2097160 * 512))
        with self.assertRaisesRegex(bench.BenchError, "unexpected"):
            db.parse_block_stat("1 2 3")
        with self.assertRaisesRegex(bench.BenchError, "unexpected"):
            db.parse_block_stat(BLOCK_STAT.replace("2097160", "-1"))

    def test_losetup_j(self):
        text = ("/dev/loop3: [64768]:1234 (/srv/bench/ganesha-ext4.img)\n"
                "/dev/loop12: [64768]:1234 (/srv/bench/ganesha-ext4.img)\n")
        self.assertEqual(db.parse_losetup_j(text), ["/dev/loop3", "/dev/loop12"])
        self.assertEqual(db.parse_losetup_j(""), [])
        with self.assertRaisesRegex(bench.BenchError, "unexpected"):
            db.parse_losetup_j("losetup: cannot open\n")


def strace_line(payload: bytes, call="sendto") -> str:
    """A line of `strace -xx` as it logs a socket send."""
    return f'4242  {call}(3, "' + "".join(f"\\x{b:02x}" for b in payload) + f'", {len(payload)}, MSG_NOSIGNAL, NULL, 0) = {len(payload)}'


def write3_args(stable: int) -> bytes:
    """The tail of an NFSv3 WRITE call: ..., offset, count 4096, stable_how, data length 4096, data."""
    return (b"\x80\x00\x10\x9c" + bytes(28) + (8192).to_bytes(8, "big") + (4096).to_bytes(4, "big")
            + stable.to_bytes(4, "big") + (4096).to_bytes(4, "big") + b"\xab" * 64)


class StableOnTheWire(unittest.TestCase):
    def test_each_stable_how_is_counted(self):
        log = "\n".join([strace_line(write3_args(2)), strace_line(write3_args(2), "sendmsg"),
                         strace_line(write3_args(0)), strace_line(write3_args(1)),
                         '4242  write(1, "hello", 5) = 5', "4242  --- SIGCHLD ---"])
        self.assertEqual(db.count_write4k_stable(log), {"UNSTABLE": 1, "DATA_SYNC": 1, "FILE_SYNC": 2})

    def test_other_calls_are_not_writes(self):
        # A READ of 4 KiB (count, then no stable_how/length pair) and a WRITE of another size.
        read3 = bytes(32) + (4096).to_bytes(4, "big") + bytes(8)
        write8k = bytes(8) + (8192).to_bytes(4, "big") + (2).to_bytes(4, "big") + (8192).to_bytes(4, "big")
        log = "\n".join([strace_line(read3), strace_line(write8k)])
        self.assertEqual(db.count_write4k_stable(log), {"UNSTABLE": 0, "DATA_SYNC": 0, "FILE_SYNC": 0})


class Amplification(unittest.TestCase):
    def test_ratio_and_edges(self):
        self.assertEqual(db.amplification(8192 * 100, 4096 * 100), 2.0)
        self.assertEqual(db.amplification(0, 4096), 0.0)
        self.assertIsNone(db.amplification(4096, 0))
        with self.assertRaisesRegex(bench.BenchError, "backwards"):
            db.amplification(-4096, 4096)


def args(*extra):
    return db.parse_args(["--fio", "/bin/true", "--chimerad", "/bin/true", *extra])


class Cells(unittest.TestCase):
    def test_filesync_cell_uses_the_external_engine(self):
        s = bench.Server()
        s.nfs_port, s.mnt_port, s.export = 2049, 20048, "/diskfs"
        fs = next(c for c in db.diskfs_cells(1 << 20) if c.engine == "filesync")
        self.assertEqual(db.nfs_engine_args(s, fs, Path("/x/e.so"))[0], "--ioengine=external:/x/e.so")
        with self.assertRaisesRegex(bench.BenchError, "filesync-engine"):
            db.nfs_engine_args(s, fs, None)
        plain = db.diskfs_cells(1 << 20)[0]
        self.assertEqual(db.nfs_engine_args(s, plain, Path("/x/e.so"))[0], "--ioengine=nfs")

    def test_fixed_size_cell_is_not_time_based(self):
        cells = db.diskfs_cells(256 << 20)
        rss = next(c for c in cells if c.fixed_bytes)
        self.assertEqual(rss.name, "rss-1m-write-256m")
        self.assertNotIn("--time_based", db.cell_args(rss, 3))
        self.assertIn("--time_based", db.cell_args(cells[0], 3))
        self.assertIn("--runtime=3", db.cell_args(cells[0], 3))
        self.assertEqual(sum(c.with_device for c in cells), 1)

    def test_arguments(self):
        a = args("--quick")
        self.assertEqual((a.rounds, a.runtime_s), (1, 3))
        self.assertEqual(a.rss_write_bytes, 4 * 16384 * 4096)
        for bad in (["--cache-blocks", "100"], ["--device-mib", "32"], ["--rounds", "0"],
                    ["--device-mib", "512"]):  # 256 MiB file + 256 MiB RSS file do not fit in 3/4 of 512
            with self.assertRaises(SystemExit, msg=bad):
                with open(os.devnull, "w") as devnull:
                    old, sys.stderr = sys.stderr, devnull
                    try:
                        args(*bad)
                    finally:
                        sys.stderr = old

    def test_unknown_cell_is_refused(self):
        with self.assertRaisesRegex(bench.BenchError, "unknown cell"):
            db.select(args("--cells", "4k-randread-qd32-j1,nope"))
        self.assertEqual([c.name for c in db.select(args("--cells", "4k-randread-qd1-j1"))], ["4k-randread-qd1-j1"])


def results_with(medians: dict, cache_blocks=16384) -> dict:
    """results.json shape: medians[(cell, server)] = {metric: value}."""
    cells = {}
    for (cell, server), metrics in medians.items():
        c = cells.setdefault(cell, {"name": cell, "servers": {}, "ratios": {}})
        run = dict(metrics)
        c["servers"][server] = {"runs": [run]}
    r = {"servers": [{"name": "chimerad-diskfs"}, {"name": "ganesha-ext4"}, {"name": "device"}],
         "cells": list(cells.values()), "diskfs": {"block_cache_blocks": cache_blocks}}
    db.summarize_cells(r)
    return r


class Targets(unittest.TestCase):
    def test_met_not_met_and_no_data(self):
        r = results_with({
            ("4k-randread-qd32-j1", "chimerad-diskfs"): {"iops_per_cpu_s": 90_000.0},
            ("4k-randread-qd32-j1", "ganesha-ext4"): {"iops_per_cpu_s": 30_000.0},
            ("4k-randwrite-qd32-j1", "chimerad-diskfs"): {"iops_per_cpu_s": 50_000.0},
            ("4k-randwrite-qd32-j1", "ganesha-ext4"): {"iops_per_cpu_s": 30_000.0},
            ("4k-randread-qd1-j1", "chimerad-diskfs"): {"lat_us_p50": 60.0},
            ("4k-randread-qd1-j1", "device"): {"lat_us_p50": 37.0},
            ("4k-randread-qd1-j1", "chimerad-memfs"): {"lat_us_p50": 15.0},
            ("4k-randwrite-filesync-qd1-j1", "chimerad-diskfs"): {"dev_bytes_per_byte": 2.0},
            ("rss-1m-write-256m", "chimerad-diskfs"): {"rss_peak_mib": 400.0},
        })
        t = db.targets(r)
        self.assertEqual([x["met"] for x in t], [True, False, False, None, True, False])
        self.assertAlmostEqual(t[0]["value"], 3.0)
        self.assertAlmostEqual(t[2]["value"], 23.0)
        self.assertAlmostEqual(t[3]["value"], 8.0)  # 60 - 15 (memfs: the RPC path) - 37 (device)
        self.assertTrue(t[3]["info"])
        self.assertEqual(t[5]["limit"], "<= 320")  # 16384 x 4 KiB + 256 MiB
        text = db.render(dict(r, targets=t))
        self.assertIn("NOT met", text)
        self.assertIn("8.00 (informative)", text)

    def test_only_the_qd1_read_cell_runs_memfs_too(self):
        cells = db.diskfs_cells(256 << 20)
        self.assertEqual([c.name for c in cells if c.with_memfs], ["4k-randread-qd1-j1"])

    def test_missing_runs_are_no_data(self):
        r = results_with({("4k-randread-qd32-j1", "chimerad-diskfs"): {"iops_per_cpu_s": 1.0}})
        self.assertTrue(all(x["met"] is None and x["value"] is None for x in db.targets(r)))

    def test_table_leaves_out_unmeasured_metrics(self):
        r = results_with({("4k-randread-qd1-j1", "device"): {"lat_us_p50": 37.0},
                          ("4k-randread-qd1-j1", "chimerad-diskfs"): {"lat_us_p50": 50.0}})
        table = bench.render_table(r, db.METRICS)
        self.assertIn("p50 us", table)
        self.assertNotIn("dev bytes written/byte", table)
        self.assertIn("1.35", table)  # 50 / 37: chimerad-diskfs over the device


if __name__ == "__main__":
    unittest.main()
