"""Unit tests of the benchmark harness, no servers needed.

Proves: fio JSON is turned into the numbers the table shows (and a failed or
empty fio run is an error, never a number); the /proc readers return this
process's real CPU time and peak RSS; medians and ratios are computed from the
runs; and check_results accepts a sound results.json but rejects each way one
can go wrong (a harness error, a missing server, a missing or non-finite
number, percentiles out of order, a missing raw file or chart).
"""

import copy
import json
import math
import os
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402
import check_results  # noqa: E402


def fio_doc(direction="read", iops=1000.0, total_ios=3000, error=0, pct=(10_000, 40_000, 90_000)):
    return {"jobs": [{
        "error": error, "usr_cpu": 10.0, "sys_cpu": 5.0,
        direction: {"iops": iops, "bw_bytes": iops * 4096, "total_ios": total_ios, "runtime": 3000,
                    "clat_ns": {"percentile": {"50.000000": pct[0], "99.000000": pct[1], "99.900000": pct[2]}}},
    }]}


CELL = bench.Cell("4k-randread-qd1-j1", "randread", 4096, 1, 1)


class ParseFio(unittest.TestCase):
    def test_numbers(self):
        r = bench.parse_fio(fio_doc(), CELL)
        self.assertEqual(r["iops"], 1000.0)
        self.assertAlmostEqual(r["mb_s"], 4.096)
        self.assertEqual(r["lat_us_p50"], 10.0)
        self.assertEqual(r["lat_us_p99"], 40.0)
        self.assertEqual(r["lat_us_p99_9"], 90.0)
        self.assertEqual(r["total_ios"], 3000)

    def test_total_latency_is_preferred_when_fio_reports_it(self):
        d = fio_doc(pct=(300, 60_000, 90_000))
        self.assertEqual(bench.parse_fio(d, CELL)["latency"], "completion")
        d["jobs"][0]["read"]["lat_ns"] = {"percentile": {"50.000000": 84_000, "99.000000": 130_000, "99.900000": 200_000}}
        r = bench.parse_fio(d, CELL)
        self.assertEqual((r["lat_us_p50"], r["lat_us_p99"], r["latency"]), (84.0, 130.0, "total"))

    def test_write_cell_reads_write_section(self):
        cell = bench.Cell("w", "randwrite", 4096, 32, 1)
        self.assertEqual(bench.parse_fio(fio_doc("write", iops=7.0), cell)["iops"], 7.0)
        with self.assertRaisesRegex(bench.BenchError, "no write I/O"):
            doc = fio_doc("write", total_ios=0)
            bench.parse_fio(doc, cell)

    def test_failures_are_errors(self):
        with self.assertRaisesRegex(bench.BenchError, "error 5"):
            bench.parse_fio(fio_doc(error=5), CELL)
        with self.assertRaisesRegex(bench.BenchError, "no read I/O"):
            bench.parse_fio(fio_doc(total_ios=0), CELL)
        with self.assertRaisesRegex(bench.BenchError, "2 job entries"):
            d = fio_doc()
            d["jobs"].append(d["jobs"][0])
            bench.parse_fio(d, CELL)
        d = fio_doc()
        del d["jobs"][0]["read"]["clat_ns"]["percentile"]["99.900000"]
        with self.assertRaisesRegex(bench.BenchError, "p99.9"):
            bench.parse_fio(d, CELL)


class EngineErrors(unittest.TestCase):
    def test_logged_nfs_failures_fail_the_run(self):
        err = "fio: some note\nFailed NFS operation(code:-14): (null)\nGot NFS EOF, this is probably not expected\n"
        self.assertEqual(len(bench.engine_errors(err)), 2)
        self.assertEqual(bench.engine_errors("fio-3.33\nnote: both iodepth >= 1 and synchronous I/O engine\n"), [])

    def test_teardown_errors_are_bounded_by_the_inflight_ios(self):
        t = "Failed NFS operation(code:-14): (null)"
        # QD32, one job: up to 31 explained; 32 are not.
        self.assertEqual(bench.split_teardown_errors([t] * 31, 31), (31, []))
        self.assertEqual(bench.split_teardown_errors([t] * 32, 31), (0, [t] * 32))
        # QD1: nothing is in flight at the end, so any failure is real.
        self.assertEqual(bench.split_teardown_errors([t], 0), (0, [t]))
        # Another error code is never explained by the teardown.
        eio = "Failed NFS operation(code:-5): (null)"
        self.assertEqual(bench.split_teardown_errors([t, eio], 31), (1, [eio]))


class Proc(unittest.TestCase):
    def test_cpu_and_rss_of_this_process(self):
        pid = os.getpid()
        c0 = bench.proc_cpu_s(pid)
        t_end = bench.time.process_time() + 0.05
        while bench.time.process_time() < t_end:
            pass
        self.assertGreater(bench.proc_cpu_s(pid), c0)
        hwm = bench.proc_status_bytes(pid, "VmHWM")
        self.assertGreater(hwm, 1 << 20)
        bench.reset_peak_rss(pid)
        self.assertLessEqual(bench.proc_status_bytes(pid, "VmHWM"), hwm + (8 << 20))
        self.assertTrue(bench.pid_alive(pid))
        with self.assertRaises(bench.BenchError):
            bench.proc_status_bytes(pid, "NoSuchKey")


class Summaries(unittest.TestCase):
    def test_median_min_max_skip_non_numbers(self):
        runs = [{"iops": 3.0}, {"iops": 1.0}, {"iops": 2.0}, {"iops": None}, {"iops": math.nan}]
        s = bench.summarize(runs, ["iops", "mb_s"])
        self.assertEqual(s["iops"], {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3})
        self.assertNotIn("mb_s", s)

    def test_cells_and_selection(self):
        names = [c.name for c in bench.CELLS_FULL]
        self.assertEqual(len(names), 11)
        self.assertIn("4k-randwrite-qd32-j2", names)
        for n in bench.CELLS_QUICK_NAMES:
            self.assertIn(n, names)
        a = bench.parse_args(["--fio", "/x", "--cells", "nope"])
        with self.assertRaisesRegex(bench.BenchError, "unknown cell"):
            bench.select_cells(a)
        self.assertEqual(len(bench.select_cells(bench.parse_args(["--fio", "/x", "--quick"]))), 5)

    def test_bad_arguments_are_refused(self):
        for argv in (["--fio", "/x", "--rounds", "0"], ["--fio", "/x", "--runtime-s", "100000"],
                     ["--fio", "/x", "--file-mib", "0"]):
            with self.assertRaises(SystemExit):
                with open(os.devnull, "w") as devnull:
                    old, sys.stderr = sys.stderr, devnull
                    try:
                        bench.parse_args(argv)
                    finally:
                        sys.stderr = old
        a = bench.parse_args(["--fio", "/x", "--servers", "chimerad"])
        with self.assertRaisesRegex(bench.BenchError, "--chimerad BINARY"):
            bench.make_servers(a, Path("/tmp"))
        a = bench.parse_args(["--fio", "/x", "--servers", "ganesha-mem,knfsd"])
        with self.assertRaisesRegex(bench.BenchError, "unknown server 'knfsd'"):
            bench.make_servers(a, Path("/tmp"))


class EngineTargets(unittest.TestCase):
    """NAME+engine: the same server process driven by our fio engine."""

    def test_engine_target_shares_the_server_and_needs_the_engine(self):
        a = bench.parse_args(["--fio", "/x", "--servers", "ganesha-mem+engine,ganesha-mem"])
        with self.assertRaisesRegex(bench.BenchError, "--engine PATH"):
            bench.make_servers(a, Path("/tmp"))
        a = bench.parse_args(["--fio", "/x", "--engine", "/e.so", "--servers", "ganesha-mem+engine,ganesha-mem,ganesha-vfs"])
        t = bench.make_servers(a, Path("/tmp"))
        self.assertEqual([s.name for s in t], ["ganesha-mem+engine", "ganesha-mem", "ganesha-vfs"])
        self.assertIs(t[0].base, t[1])
        procs = bench.processes(t)
        self.assertEqual([p.name for p in procs], ["ganesha-mem", "ganesha-vfs"])
        a = bench.parse_args(["--fio", "/x", "--engine", "/e.so", "--servers", "knfsd+engine"])
        with self.assertRaisesRegex(bench.BenchError, "unknown server 'knfsd\\+engine'"):
            bench.make_servers(a, Path("/tmp"))

    def test_fio_arguments_per_client(self):
        a = bench.parse_args(["--fio", "/x", "--engine", "/e.so", "--servers", "ganesha-mem+engine,ganesha-mem"])
        eng, lib = bench.make_servers(a, Path("/tmp"))
        plan = bench.Plan(fio=Path("/x"), out_dir=Path("/tmp"), cells=[CELL], rounds=1, runtime_s=1, file_bytes=1 << 20,
                          engine=Path("/e.so"))
        e = bench.fio_cmd(plan, eng, "c", [], Path("/o.json"))
        self.assertIn("--ioengine=external:/e.so", e)
        self.assertIn(f"--chimera_server=127.0.0.1:{lib.nfs_port}", e)
        self.assertIn("--chimera_export=/mem", e)
        self.assertIn(f"--chimera_mount_port={lib.mnt_port}", e)
        self.assertNotIn("--ioengine=nfs", e)
        n = bench.fio_cmd(plan, lib, "c", [], Path("/o.json"))
        self.assertIn("--ioengine=nfs", n)
        no_engine = bench.Plan(fio=Path("/x"), out_dir=Path("/tmp"), cells=[CELL], rounds=1, runtime_s=1, file_bytes=1)
        with self.assertRaisesRegex(bench.BenchError, "--engine"):
            bench.fio_cmd(no_engine, eng, "c", [], Path("/o.json"))

    def test_engine_log_lines_fail_the_run(self):
        self.assertEqual(len(bench.engine_errors("chimera-fio: Read of 4096 bytes at 0 on bench.0 failed: x\nok")), 1)
        self.assertEqual(len(bench.engine_errors("chimera: MOUNT of export /m on 127.0.0.1: refused")), 1)

    def test_client_cpu_and_floor_ratio(self):
        r = bench.parse_fio(fio_doc(), CELL)
        # 15 % of a 3 s run = 0.45 CPU-s; 3000 I/Os over it.
        self.assertAlmostEqual(r["client_cpu_s"], 0.45)
        self.assertAlmostEqual(r["iops_per_client_cpu_s"], 3000 / 0.45)
        results = {
            "servers": [{"name": "chimerad+engine"}, {"name": "chimerad"}],
            "transport": {"chimerad": {"summary": {"read4k_echo_us_p50": {"median": 20.0}}}},
            "cells": [{"name": "4k-randread-qd1-j1", "servers": {
                "chimerad+engine": {"summary": {"lat_us_p50": {"median": 22.0}}},
                "chimerad": {"summary": {"lat_us_p50": {"median": 50.0}}}}}],
        }
        lines = bench.engine_vs_echo(results)
        self.assertEqual(len(lines), 2, lines)
        self.assertIn("1.10 x the raw TCP echo", lines[1])


def good_results(tmp: Path) -> dict:
    """A results.json as the harness writes it for two servers, one round."""
    (tmp / "raw").mkdir()
    servers = ["chimerad", "ganesha-mem"]
    cells = []
    for name in ("4k-randread-qd1-j1", "1m-write-qd1-j1"):
        entry = {"name": name, "rw": "randread", "servers": {}, "ratios": {}}
        for s in servers:
            raw = tmp / "raw" / f"r1-{name}-{s}.json"
            raw.write_text(json.dumps(fio_doc()))
            run = {"round": 1, "iops": 100.0, "mb_s": 1.0, "lat_us_p50": 10.0, "lat_us_p99": 20.0,
                   "lat_us_p99_9": 30.0, "cpu_s": 0.5, "iops_per_cpu_s": 600.0, "rss_peak_mib": 40.0,
                   "total_ios": 300, "raw": str(raw.relative_to(tmp))}
            entry["servers"][s] = {"runs": [run], "summary": bench.summarize([run], ["iops"])}
        entry["ratios"]["ganesha-mem"] = {"iops": 1.0}
        cells.append(entry)
    transport = {s: {"runs": [{"round": 1, "null_us_p50": 20.0, "null_us_p99": 50.0, "null_calls_per_s": 40000.0,
                               "echo_us_p50": 10.0, "echo_us_p99": 30.0, "read4k_us_p50": 30.0,
                               "read4k_echo_us_p50": 15.0}]} for s in servers}
    (tmp / "ratios.png").write_bytes(check_results.PNG_MAGIC + b"rest")
    return {"schema": check_results.SCHEMA, "rounds": 1, "errors": [], "servers": [{"name": s} for s in servers],
            "cells": cells, "transport": transport, "chart": "ratios.png"}


class CheckResults(unittest.TestCase):
    def setUp(self):
        self.tmpdir = tempfile.TemporaryDirectory()
        self.tmp = Path(self.tmpdir.name)
        self.doc = good_results(self.tmp)
        self.servers = ["chimerad", "ganesha-mem"]

    def tearDown(self):
        self.tmpdir.cleanup()

    def problems(self, doc):
        return check_results.check(doc, self.tmp, self.servers, transport=True, chart=True)

    def test_sound_results_pass(self):
        self.assertEqual(self.problems(self.doc), [])
        (self.tmp / "results.json").write_text(json.dumps(self.doc))
        self.assertEqual(check_results.main([str(self.tmp), "--servers", "chimerad,ganesha-mem", "--transport",
                                             "--chart"]), 0)

    def broken(self, mutate) -> list:
        doc = copy.deepcopy(self.doc)
        mutate(doc)
        return self.problems(doc)

    def test_each_defect_is_reported(self):
        run0 = lambda d: d["cells"][0]["servers"]["chimerad"]["runs"][0]  # noqa: E731
        cases = {
            "harness error": lambda d: d["errors"].append("chimerad exited during start"),
            "expected ['chimerad', 'ganesha-mem']": lambda d: d["servers"].pop(0),
            "no entry for chimerad": lambda d: d["cells"][0]["servers"].pop("chimerad"),
            "0 runs, expected 1": lambda d: d["cells"][1]["servers"]["ganesha-mem"].update(runs=[]),
            "iops is nan": lambda d: run0(d).update(iops=math.nan),
            "cpu_s is 0": lambda d: run0(d).update(cpu_s=0),
            "lat_us_p99 is None": lambda d: run0(d).pop("lat_us_p99"),
            "out of order": lambda d: run0(d).update(lat_us_p50=25.0),
            "unreadable": lambda d: run0(d).update(raw="raw/missing.json"),
            "no IOPS ratio": lambda d: d["cells"][0]["ratios"].clear(),
            "transport ganesha-mem: 0 runs": lambda d: d["transport"]["ganesha-mem"].update(runs=[]),
            "echo_us_p50": lambda d: d["transport"]["chimerad"]["runs"][0].update(echo_us_p50=-1),
            "read4k_us_p50": lambda d: d["transport"]["chimerad"]["runs"][0].pop("read4k_us_p50"),
            "chart missing": lambda d: d.update(chart="nope.png"),
            "schema is": lambda d: d.update(schema="other/2"),
            "no cells": lambda d: d.update(cells=[]),
        }
        for needle, mutate in cases.items():
            with self.subTest(needle):
                found = self.broken(mutate)
                self.assertTrue(any(needle in p for p in found), f"{needle!r} not in {found}")

    def test_unreadable_results_json_fails(self):
        (self.tmp / "results.json").write_text("{not json")
        with open(os.devnull, "w") as devnull:
            old, sys.stderr = sys.stderr, devnull
            try:
                rc = check_results.main([str(self.tmp), "--servers", "chimerad"])
            finally:
                sys.stderr = old
        self.assertEqual(rc, 1)


if __name__ == "__main__":
    unittest.main()
