"""Unit tests of bench/nfs3meta.py against a scripted NFSv3 server on 127.0.0.1 (port 0).

Proves: the load mounts the export and each connection alternates CREATE
(GUARDED, mode 0644, a name of its own) and REMOVE of the same name in the
mounted directory; calls are counted and timed; a call the server refuses
fails the run with a message naming it; bad arguments are refused; the
nearest-rank percentile; diskfs_bench reads its output and refuses one that
lacks a number.
"""

import socket
import struct
import sys
import threading
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import diskfs_bench as db  # noqa: E402
import nfs3calls as n3  # noqa: E402
import nfs3meta  # noqa: E402
from bench import BenchError  # noqa: E402

ROOT_FH = b"R" * 16


class Scripted:
    """Answers MNT, CREATE and REMOVE; records what it was asked; REMOVE fails when `fail_remove`."""

    def __init__(self, fail_remove: bool = False):
        self.fail_remove = fail_remove
        self.lock = threading.Lock()
        self.seen: list[tuple[int, bytes, bytes]] = []  # (proc, dir fh, name)
        self.create_tail: set[bytes] = set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                s, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(s,), daemon=True).start()

    @staticmethod
    def recv_exact(s: socket.socket, n: int) -> bytes:
        b = b""
        while len(b) < n:
            got = s.recv(n - len(b))
            if not got:
                raise EOFError
            b += got
        return b

    def serve(self, s: socket.socket) -> None:
        with s:
            try:
                while True:
                    (mark,) = struct.unpack(">I", self.recv_exact(s, 4))
                    body = self.recv_exact(s, mark & 0x7FFF_FFFF)
                    s.sendall(self.answer(body))
            except (EOFError, OSError):
                return

    def answer(self, body: bytes) -> bytes:
        xid, _mtype, _rpcv, prog, _vers, proc = struct.unpack_from(">6I", body, 0)
        at = 24
        for _ in range(2):  # credential, verifier
            _flavor, n = struct.unpack_from(">II", body, at)
            at += 8 + n + (-n % 4)
        args = body[at:]
        if prog == n3.MOUNT_PROGRAM:
            res = struct.pack(">I", 0) + n3.opaque(ROOT_FH) + struct.pack(">II", 1, 1)
        else:
            fh, at = n3.read_fh(args, 0)
            (n,) = struct.unpack_from(">I", args, at)
            name = args[at + 4:at + 4 + n]
            with self.lock:
                self.seen.append((proc, fh, name))
                if proc == n3.NFSPROC3_CREATE:
                    self.create_tail.add(args[at + 4 + n + (-n % 4):])
            status = 2 if proc == nfs3meta.NFSPROC3_REMOVE and self.fail_remove else 0
            res = struct.pack(">I", status) + b"\0" * 8
        reply = struct.pack(">IIIIII", xid, 1, 0, 0, 0, 0) + res
        return struct.pack(">I", 0x8000_0000 | len(reply)) + reply

    def close(self) -> None:
        self.listener.close()


class Load(unittest.TestCase):
    def test_create_remove_loops_per_connection(self):
        srv = Scripted()
        try:
            out = nfs3meta.run("127.0.0.1", srv.port, srv.port, "/x", 3, 0.3, "t")
        finally:
            srv.close()
        self.assertEqual(out["clients"], 3)
        self.assertGreater(out["calls"], 6)
        self.assertEqual(out["calls"] % 2, 0, "every CREATE has its REMOVE")
        self.assertGreater(out["calls_per_s"], 0)
        self.assertLessEqual(out["lat_us_p50"], out["lat_us_p99"])
        self.assertEqual(len(srv.seen), out["calls"])
        self.assertTrue(all(fh == ROOT_FH for _, fh, _ in srv.seen), "calls go to the mounted directory")
        # GUARDED, then sattr3 setting mode 0644 and nothing else.
        self.assertEqual(srv.create_tail, {struct.pack(">III5I", 1, 1, 0o644, 0, 0, 0, 0, 0)})
        by_conn: dict[bytes, list[int]] = {}
        for proc, _, name in srv.seen:
            conn = name.rsplit(b"-", 1)[0]
            by_conn.setdefault(conn, []).append(proc)
        self.assertEqual(len(by_conn), 3, "a name space per connection")
        for procs in by_conn.values():
            self.assertEqual(procs[0::2], [n3.NFSPROC3_CREATE] * len(procs[0::2]))
            self.assertEqual(procs[1::2], [nfs3meta.NFSPROC3_REMOVE] * len(procs[1::2]))
        names = [name for proc, _, name in srv.seen if proc == n3.NFSPROC3_CREATE]
        self.assertEqual(len(names), len(set(names)), "every CREATE names a new file")

    def test_a_refused_call_fails_the_run_naming_it(self):
        srv = Scripted(fail_remove=True)
        try:
            with self.assertRaisesRegex(n3.CallError, r"REMOVE meta-t-\d+-0: status 2"):
                nfs3meta.run("127.0.0.1", srv.port, srv.port, "/x", 2, 0.2, "t")
        finally:
            srv.close()

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "clients"):
            nfs3meta.run("127.0.0.1", 1, 1, "/x", 0, 1, "t")
        with self.assertRaisesRegex(ValueError, "seconds"):
            nfs3meta.run("127.0.0.1", 1, 1, "/x", 1, 0, "t")

    def test_percentile_is_nearest_rank(self):
        xs = [float(i) for i in range(1, 101)]
        self.assertEqual(nfs3meta.percentile(xs, 50), 50.0)
        self.assertEqual(nfs3meta.percentile(xs, 99), 99.0)
        self.assertEqual(nfs3meta.percentile(xs, 99.9), 100.0)
        self.assertEqual(nfs3meta.percentile([7.0], 50), 7.0)
        with self.assertRaises(ValueError):
            nfs3meta.percentile([], 50)


class BenchReadsIt(unittest.TestCase):
    def test_parse_meta(self):
        doc = {"calls": 1000, "seconds": 2.0, "calls_per_s": 500.0, "clients": 16,
               "lat_us_p50": 900.0, "lat_us_p99": 4000.0, "lat_us_p99_9": 9000.0}
        r = db.parse_meta(doc)
        self.assertEqual((r["iops"], r["total_ios"], r["lat_us_p50"], r["lat_us_p99"]), (500.0, 1000, 900.0, 4000.0))
        bad = dict(doc)
        del bad["lat_us_p99"]
        with self.assertRaisesRegex(BenchError, "lat_us_p99"):
            db.parse_meta(bad)
        with self.assertRaisesRegex(BenchError, "no call"):
            db.parse_meta(dict(doc, calls=0))

    def test_the_meta_cell_is_in_the_suite(self):
        cells = {c.name: c for c in db.diskfs_cells(1 << 30)}
        self.assertEqual(cells["meta-create-remove-c16"].engine, "meta")
        self.assertEqual(cells["meta-create-remove-c16"].cell.iodepth, 16)


if __name__ == "__main__":
    unittest.main()
