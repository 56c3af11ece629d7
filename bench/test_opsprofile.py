"""Unit tests of `make bench-profile`'s pieces, no server or valgrind needed.

Proves: the NFSv3 call encoder lays out the RFC 5531 header the server expects
(record mark, AUTH_SYS credential, arguments); the reply parser returns the
results of a successful reply and refuses, with a message naming the problem,
a wrong xid, a denied reply, a failed accept_stat, a truncated reply, an NFS
error status and a short READ; the client refuses counts and depths outside its
bounds; and the callgrind dump reader charges self cost to the right function,
skips a call's inclusive cost (the annotate bug it exists to avoid) and fails
on a dump without totals.
"""

import struct
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nfs3calls  # noqa: E402
import opsprofile as prof  # noqa: E402


def reply(xid, results=b"", mtype=1, stat=0, accept=0, verf=b""):
    return (struct.pack(">IIIII", xid, mtype, stat, 0, len(verf)) + nfs3calls.pad4(verf)
            + struct.pack(">I", accept) + results)


class Encode(unittest.TestCase):
    def test_call_header(self):
        rec = nfs3calls.encode_call(7, 100003, 3, 6, b"ARGS")
        (mark,) = struct.unpack_from(">I", rec, 0)
        self.assertEqual(mark & 0x8000_0000, 0x8000_0000, "single, last fragment")
        self.assertEqual(mark & 0x7fff_ffff, len(rec) - 4)
        xid, mtype, rpcvers, prog, vers, proc, flavor = struct.unpack_from(">7I", rec, 4)
        self.assertEqual((xid, mtype, rpcvers, prog, vers, proc, flavor), (7, 0, 2, 100003, 3, 6, 1))
        self.assertTrue(rec.endswith(struct.pack(">II", 0, 0) + b"ARGS"), "AUTH_NONE verifier, then the arguments")

    def test_opaque_pads_to_four(self):
        self.assertEqual(nfs3calls.opaque(b"abcde"), struct.pack(">I", 5) + b"abcde\0\0\0")


class Replies(unittest.TestCase):
    def test_success_returns_results(self):
        self.assertEqual(nfs3calls.parse_reply(reply(9, b"RES", verf=b"v"), 9), b"RES")

    def test_each_bad_reply_is_named(self):
        cases = [
            (reply(8), "xid"),
            (reply(9, mtype=0), "not an accepted reply"),
            (reply(9, stat=1), "not an accepted reply"),
            (reply(9, accept=3), "accept_stat 3"),
            (reply(9)[:10], "shorter than an RPC reply header"),
        ]
        for body, want in cases:
            with self.subTest(want=want):
                with self.assertRaisesRegex(nfs3calls.CallError, want):
                    nfs3calls.parse_reply(body, 9)

    def test_nfs_error_status_and_short_read(self):
        with self.assertRaisesRegex(nfs3calls.CallError, "READ: status 70"):
            nfs3calls.nfs_ok(struct.pack(">I", 70), "READ")
        with self.assertRaisesRegex(nfs3calls.CallError, "100/100 bytes, asked 4096"):
            nfs3calls.check_read(struct.pack(">IIII", 0, 100, 1, 100), 4096)
        with self.assertRaisesRegex(nfs3calls.CallError, "truncated"):
            nfs3calls.check_read(struct.pack(">I", 1) + bytes(20), 4096)
        nfs3calls.check_read(struct.pack(">IIII", 0, 4096, 0, 4096), 4096)

    def test_client_bounds(self):
        c = nfs3calls.Client("127.0.0.1", 1, 1, "/x")
        for op, count, depth, want in [("read4k", 0, 1, "count must be"), ("read4k", 1, 65, "depth 1..64"),
                                       ("readdir", 1, 1, "unknown op"), ("read4k", 1, 1, "run before setup")]:
            with self.subTest(op=op, count=count, depth=depth):
                with self.assertRaisesRegex(nfs3calls.CallError, want):
                    c.run(op, count, depth)


DUMP = """# callgrind format
events: Ir
summary: 1000

fn=loop
5 100
cfn=handle
calls=0 10
7 900
fn=handle
10 600
cfn=memcpy
calls=3 20
11 300
fn=memcpy
20 300
totals: 1000
"""


class Callgrind(unittest.TestCase):
    def test_self_costs_skip_inclusive_call_costs(self):
        costs = prof.parse_self_costs(DUMP)
        self.assertEqual(costs, {"loop": 100, "handle": 600, "memcpy": 300})
        self.assertEqual(sum(costs.values()), prof.parse_total(DUMP))
        top = prof.top_self(costs, 2)
        self.assertEqual([t["function"] for t in top], ["handle", "memcpy"])
        self.assertAlmostEqual(top[0]["pct"], 60.0)

    def test_dump_without_totals_fails(self):
        with self.assertRaisesRegex(prof.ProfileError, "no totals"):
            prof.parse_total("events: Ir\nfn=x\n1 2\n")

    def test_phases_argument(self):
        self.assertEqual(prof.parse_phases("read4k:10:4,getattr:5:1"), (("read4k", 10, 4), ("getattr", 5, 1)))


if __name__ == "__main__":
    unittest.main()
