#!/usr/bin/env python3
"""A minimal NFSv3 client that issues a fixed number of calls, for `make bench-profile`.

Why its own client: the profile counts the server's instructions per operation,
so the client must issue exactly N calls of one kind and nothing else while the
count runs (fio's libnfs engine adds opens, lookups and teardown traffic). Its
own speed does not matter: the server runs under callgrind, ~50x slower.

Standard library only; the calls are encoded by hand (RFC 5531 call header with
AUTH_SYS uid 0, RFC 1813 MOUNT3 MNT, LOOKUP, CREATE, GETATTR, READ, WRITE), so the
tool shares no code with the server it measures.

Driven over stdin by bench/profile.py, one command per line, one answer line each:
    setup                 MNT the export, CREATE `profile.dat`, write FILE_BYTES of it
    run OP COUNT DEPTH    COUNT calls of OP (getattr, read4k, write4k, read1m),
                          DEPTH of them in flight (sent as one batch, then read)
    quit
Answers are `ok ...` or `error <message naming the problem>`.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys

RPC_VERSION = 2
MSG_CALL, MSG_REPLY = 0, 1
AUTH_SYS = 1
LAST_FRAGMENT = 0x8000_0000
MOUNT_PROGRAM, MOUNT_V3, MOUNTPROC3_MNT = 100005, 3, 1
NFS_PROGRAM, NFS_V3 = 100003, 3
NFSPROC3_GETATTR, NFSPROC3_LOOKUP, NFSPROC3_READ, NFSPROC3_WRITE, NFSPROC3_CREATE = 1, 3, 6, 7, 8
UNSTABLE = 0
FILE_NAME = b"profile.dat"
# The file the READ/WRITE calls address: 1 MiB reads need at least this much.
FILE_BYTES = 8 << 20
RECORD_BYTES_MAX = 4 << 20
# The calls one `run` may make and keep in flight: bounds the work and memory.
COUNT_MAX = 1_000_000
DEPTH_MAX = 64
OPS = {"getattr": (NFSPROC3_GETATTR, 0), "read4k": (NFSPROC3_READ, 4096),
       "write4k": (NFSPROC3_WRITE, 4096), "read1m": (NFSPROC3_READ, 1 << 20)}


class CallError(Exception):
    """A reply that is not a successful answer; the message names the problem."""


def pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def opaque(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + pad4(b)


def auth_sys_cred() -> bytes:
    body = struct.pack(">I", 0) + opaque(b"bench") + struct.pack(">III", 0, 0, 0)  # stamp, name, uid, gid, no gids
    return struct.pack(">I", AUTH_SYS) + opaque(body)


CRED = auth_sys_cred()
VERF_NONE = struct.pack(">II", 0, 0)


def encode_call(xid: int, prog: int, vers: int, proc: int, args: bytes) -> bytes:
    body = struct.pack(">IIIIII", xid, MSG_CALL, RPC_VERSION, prog, vers, proc) + CRED + VERF_NONE + args
    return struct.pack(">I", LAST_FRAGMENT | len(body)) + body


def parse_reply(body: bytes, xid: int) -> bytes:
    """The procedure's result bytes of an accepted, successful reply to `xid`."""
    if len(body) < 24:
        raise CallError(f"reply of {len(body)} bytes is shorter than an RPC reply header")
    rxid, mtype, stat = struct.unpack_from(">III", body, 0)
    if rxid != xid:
        raise CallError(f"reply xid {rxid:#x}, expected {xid:#x}")
    if mtype != MSG_REPLY or stat != 0:
        raise CallError(f"xid {xid:#x}: not an accepted reply (msg_type {mtype}, reply_stat {stat})")
    _flavor, vlen = struct.unpack_from(">II", body, 12)
    at = 20 + vlen + (-vlen % 4)
    if len(body) < at + 4:
        raise CallError(f"xid {xid:#x}: reply truncated inside the verifier")
    (accept,) = struct.unpack_from(">I", body, at)
    if accept != 0:
        raise CallError(f"xid {xid:#x}: accept_stat {accept} (not SUCCESS)")
    return body[at + 4:]


def nfs_ok(res: bytes, what: str) -> bytes:
    if len(res) < 4:
        raise CallError(f"{what}: empty result")
    (status,) = struct.unpack_from(">I", res, 0)
    if status != 0:
        raise CallError(f"{what}: status {status}")
    return res[4:]


def read_fh(b: bytes, at: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from(">I", b, at)
    if n == 0 or n > 64:
        raise CallError(f"file handle of {n} bytes (NFSv3 allows 1..64)")
    return b[at + 4:at + 4 + n], at + 4 + n + (-n % 4)


class Client:
    def __init__(self, host: str, nfs_port: int, mount_port: int, export: str):
        self.host, self.nfs_port, self.mount_port, self.export = host, nfs_port, mount_port, export
        self.xid = 0x5000_0000
        self.sock: socket.socket | None = None
        self.fh = b""

    def _next_xid(self) -> int:
        self.xid = (self.xid + 1) & 0xffff_ffff
        return self.xid

    @staticmethod
    def _recv_exact(s: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            got = s.recv(n - len(buf))
            if not got:
                raise CallError("server closed the connection")
            buf += got
        return bytes(buf)

    def _recv_record(self, s: socket.socket) -> bytes:
        parts, total = [], 0
        while True:
            (mark,) = struct.unpack(">I", self._recv_exact(s, 4))
            n = mark & ~LAST_FRAGMENT
            total += n
            if total > RECORD_BYTES_MAX:
                raise CallError(f"reply record over {RECORD_BYTES_MAX} bytes")
            parts.append(self._recv_exact(s, n))
            if mark & LAST_FRAGMENT:
                return b"".join(parts)

    def _call(self, s: socket.socket, prog: int, vers: int, proc: int, args: bytes) -> bytes:
        xid = self._next_xid()
        s.sendall(encode_call(xid, prog, vers, proc, args))
        return parse_reply(self._recv_record(s), xid)

    def setup(self) -> None:
        with socket.create_connection((self.host, self.mount_port), timeout=60) as m:
            res = nfs_ok(self._call(m, MOUNT_PROGRAM, MOUNT_V3, MOUNTPROC3_MNT, opaque(self.export.encode())), "MNT")
            root, _ = read_fh(res, 0)
        self.sock = socket.create_connection((self.host, self.nfs_port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # CREATE UNCHECKED with no attributes set (sattr3: six "don't set" arms).
        args = opaque(root) + opaque(FILE_NAME) + struct.pack(">I", 0) + struct.pack(">6I", 0, 0, 0, 0, 0, 0)
        res = nfs_ok(self._call(self.sock, NFS_PROGRAM, NFS_V3, NFSPROC3_CREATE, args), "CREATE")
        (has_fh,) = struct.unpack_from(">I", res, 0)
        if has_fh != 1:
            raise CallError("CREATE returned no file handle")
        self.fh, _ = read_fh(res, 4)
        chunk = bytes(range(256)) * 4096  # 1 MiB
        for off in range(0, FILE_BYTES, len(chunk)):
            nfs_ok(self._call(self.sock, NFS_PROGRAM, NFS_V3, NFSPROC3_WRITE, self._write_args(off, chunk)), "WRITE")

    def _write_args(self, offset: int, data: bytes) -> bytes:
        return opaque(self.fh) + struct.pack(">QII", offset, len(data), UNSTABLE) + opaque(data)

    def _args(self, op: str, i: int) -> tuple[int, bytes]:
        proc, size = OPS[op]
        if proc == NFSPROC3_GETATTR:
            return proc, opaque(self.fh)
        # Walk the file so reads touch all of it (as a sequential reader would).
        offset = (i * size) % FILE_BYTES
        if proc == NFSPROC3_READ:
            return proc, opaque(self.fh) + struct.pack(">QI", offset, size)
        return proc, self._write_args(offset, bytes(size))

    def run(self, op: str, count: int, depth: int) -> None:
        if op not in OPS:
            raise CallError(f"unknown op {op!r} (have {', '.join(OPS)})")
        if not 1 <= count <= COUNT_MAX or not 1 <= depth <= DEPTH_MAX:
            raise CallError(f"count must be 1..{COUNT_MAX} and depth 1..{DEPTH_MAX}, got {count}, {depth}")
        if self.sock is None:
            raise CallError("run before setup")
        _, size = OPS[op]
        done = 0
        while done < count:
            n = min(depth, count - done)
            xids, batch = [], []
            for i in range(done, done + n):
                proc, args = self._args(op, i)
                xid = self._next_xid()
                xids.append(xid)
                batch.append(encode_call(xid, NFS_PROGRAM, NFS_V3, proc, args))
            self.sock.sendall(b"".join(batch))
            for xid in xids:  # one connection, answered in order by the server's loop
                res = nfs_ok(parse_reply(self._recv_record(self.sock), xid), op)
                if op.startswith("read"):
                    check_read(res, size)
            done += n


def check_read(res: bytes, size: int) -> None:
    """A READ3resok must carry attributes and exactly `size` bytes (the file is larger)."""
    (has_attr,) = struct.unpack_from(">I", res, 0)
    at = 4 + (84 if has_attr else 0)
    if len(res) < at + 12:
        raise CallError(f"READ result truncated ({len(res)} bytes)")
    count, _eof, dlen = struct.unpack_from(">III", res, at)
    if count != size or dlen != size:
        raise CallError(f"READ returned {count}/{dlen} bytes, asked {size}")


def serve(c: Client) -> int:
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            if words[0] == "quit":
                print("ok bye", flush=True)
                return 0
            if words[0] == "setup":
                c.setup()
                print(f"ok fh {c.fh.hex()}", flush=True)
            elif words[0] == "run" and len(words) == 4:
                c.run(words[1], int(words[2]), int(words[3]))
                print(f"ok {words[1]} {words[2]}", flush=True)
            else:
                print(f"error unknown command {line.strip()!r}", flush=True)
        except (CallError, OSError, ValueError, struct.error) as e:
            print(f"error {e}", flush=True)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--nfs-port", type=int, default=2049)
    p.add_argument("--mount-port", type=int, default=20048)
    p.add_argument("--export", default="/memfs")
    a = p.parse_args(argv)
    return serve(Client(a.host, a.nfs_port, a.mount_port, a.export))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
