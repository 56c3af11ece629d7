"""A deliberately small ONC RPC / NFSv3 client for tests: it builds records by
hand so tests can also send what no real client would (truncated records,
forged handles, wrong versions). Not a general-purpose client."""

import socket
import struct

NFS_PROG, MOUNT_PROG, PMAP_PROG = 100003, 100005, 100000
AUTH_NONE, AUTH_SYS = 0, 1


def pad(b: bytes) -> bytes:
    return b + b"\0" * ((4 - len(b) % 4) % 4)


def opaque(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + pad(b)


def auth_sys(uid=0, gid=0, machine=b"test"):
    body = struct.pack(">I", 0) + opaque(machine) + struct.pack(">III", uid, gid, 0)
    return struct.pack(">I", AUTH_SYS) + opaque(body)


class Reply:
    def __init__(self, body: bytes):
        self.body = body
        self.xid, self.mtype, self.reply_stat = struct.unpack(">III", body[:12])
        self.pos = 12
        if self.reply_stat == 0:  # MSG_ACCEPTED
            _flavor = self.u32()
            n = self.u32()
            self.pos += n + (4 - n % 4) % 4
            self.accept_stat = self.u32()
        else:
            self.accept_stat = None
            self.reject_stat = self.u32()

    def u32(self):
        (v,) = struct.unpack(">I", self.body[self.pos : self.pos + 4])
        self.pos += 4
        return v

    def u64(self):
        (v,) = struct.unpack(">Q", self.body[self.pos : self.pos + 8])
        self.pos += 8
        return v

    def opaque(self):
        n = self.u32()
        v = self.body[self.pos : self.pos + n]
        self.pos += n + (4 - n % 4) % 4
        return v

    def skip(self, n):
        self.pos += n

    def post_op_attr(self):
        """Returns the fattr3 size field (or None) and skips the attributes."""
        if self.u32():
            start = self.pos
            self.pos = start + 20
            size = self.u64()
            self.pos = start + 84
            return size
        return None

    def wcc(self):
        if self.u32():
            self.skip(24)
        return self.post_op_attr()


class Client:
    def __init__(self, port, host="127.0.0.1", timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.xid = 0x1000

    def close(self):
        self.sock.close()

    def send_raw(self, data: bytes):
        self.sock.sendall(data)

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by server")
            buf += chunk
        return buf

    def read_reply(self) -> Reply:
        (mark,) = struct.unpack(">I", self.recv_exact(4))
        return Reply(self.recv_exact(mark & 0x7FFFFFFF))

    def call(self, prog, vers, proc, args=b"", cred=None, rpcvers=2) -> Reply:
        self.xid += 1
        cred = cred if cred is not None else auth_sys()
        msg = struct.pack(">IIIIII", self.xid, 0, rpcvers, prog, vers, proc) + cred + struct.pack(">II", 0, 0) + args
        self.sock.sendall(struct.pack(">I", 0x80000000 | len(msg)) + msg)
        r = self.read_reply()
        assert r.xid == self.xid, f"reply xid {r.xid:#x} != {self.xid:#x}"
        return r

    # --- MOUNT / NFSv3 helpers (status first, then what tests need) ---

    def mnt(self, path: bytes):
        r = self.call(MOUNT_PROG, 3, 1, opaque(path))
        assert r.accept_stat == 0
        st = r.u32()
        return st, (r.opaque() if st == 0 else None)

    def lookup(self, dirfh, name):
        r = self.call(NFS_PROG, 3, 3, opaque(dirfh) + opaque(name))
        st = r.u32()
        return st, (r.opaque() if st == 0 else None)

    def create(self, dirfh, name, mode=0o644):
        # createhow3 UNCHECKED + sattr3 with only the mode set
        sattr = struct.pack(">II", 1, mode) + struct.pack(">IIIII", 0, 0, 0, 0, 0)
        r = self.call(NFS_PROG, 3, 8, opaque(dirfh) + opaque(name) + struct.pack(">I", 0) + sattr)
        st = r.u32()
        if st != 0:
            return st, None
        assert r.u32() == 1, "handle follows"
        return st, r.opaque()

    def write(self, fh, offset, data, stable=2):
        r = self.call(NFS_PROG, 3, 7, opaque(fh) + struct.pack(">QII", offset, len(data), stable) + opaque(data))
        assert r.accept_stat == 0, f"accept_stat {r.accept_stat}"
        st = r.u32()
        r.wcc()
        return st, (r.u32() if st == 0 else 0)

    def read(self, fh, offset, count):
        r = self.call(NFS_PROG, 3, 6, opaque(fh) + struct.pack(">QI", offset, count))
        st = r.u32()
        r.post_op_attr()
        if st != 0:
            return st, None
        _count, _eof = r.u32(), r.u32()
        return st, r.opaque()

    def getattr(self, fh):
        r = self.call(NFS_PROG, 3, 1, opaque(fh))
        return r.u32()

    def fsstat(self, fh):
        r = self.call(NFS_PROG, 3, 18, opaque(fh))
        st = r.u32()
        r.post_op_attr()
        if st != 0:
            return st, None
        return st, dict(tbytes=r.u64(), fbytes=r.u64(), abytes=r.u64())

    def null(self, prog=NFS_PROG, vers=3):
        return self.call(prog, vers, 0)
