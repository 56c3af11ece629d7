"""Hostile NFSv4 COMPOUNDs over the wire: wrong minor versions, operations
outside a session, a forged session id, forged file handles, a bad stateid and
an illegal operation number each get the RFC 8881 error; NFSv4.2 operations
(RFC 7862, RFC 8276) with offsets past 2^63, truncated or random arguments
get theirs; and the server keeps serving a well-behaved NFSv3 client
throughout."""

import os
import struct

from rpcclient import NFS_PROG, Client, opaque

OK = 0
NFS4ERR_BADHANDLE = 10001
NFS4ERR_BAD_STATEID = 10025
NFS4ERR_STALE_STATEID = 10023
NFS4ERR_MINOR_VERS_MISMATCH = 10021
NFS4ERR_OP_ILLEGAL = 10044
NFS4ERR_BADSESSION = 10052
NFS4ERR_OP_NOT_IN_SESSION = 10071
NFS4ERR_SEQ_MISORDERED = 10063
NFS4ERR_NXIO = 6
NFS4ERR_FBIG = 27
NFS4ERR_NOTSUPP = 10004
NFS4ERR_BADXDR = 10036
NFS4ERR_NOXATTR = 10095

OP_GETFH, OP_LOOKUP, OP_PUTFH, OP_PUTROOTFH, OP_READ = 10, 15, 22, 24, 25
OP_EXCHANGE_ID, OP_CREATE_SESSION, OP_SEQUENCE = 42, 43, 53
OP_ALLOCATE, OP_COPY, OP_READ_PLUS, OP_SEEK, OP_CLONE, OP_GETXATTR = 59, 60, 68, 69, 71, 72


def u32(*v):
    return b"".join(struct.pack(">I", x) for x in v)


def compound(c, ops, minor=1):
    args = opaque(b"") + u32(minor, len(ops)) + b"".join(ops)
    r = c.call(NFS_PROG, 4, 1, args)
    assert r.accept_stat == 0, f"accept_stat {r.accept_stat}"
    status = r.u32()
    r.opaque()  # tag
    n = r.u32()
    return status, n, r


def channel_attrs():
    # headerpad, maxreq, maxresp, maxresp_cached, maxops, maxreqs, rdma_ird<>
    return u32(0, 1 << 20, 1 << 20, 8192, 16, 8, 0)


class Session:
    def __init__(self, c, minor=1):
        self.c = c
        owner = b"verifier" + opaque(b"hostile-test-" + os.urandom(4).hex().encode())
        eid = u32(OP_EXCHANGE_ID) + owner + u32(0x1, 0, 0)  # flags SUPP_MOVED_REFER?, SP4_NONE, no impl id
        st, n, r = compound(c, [eid], minor=minor)
        assert st == OK, f"EXCHANGE_ID: {st}"
        assert r.u32() == OP_EXCHANGE_ID and r.u32() == OK
        self.clientid = r.u64()
        seq = r.u32()
        cs = u32(OP_CREATE_SESSION) + struct.pack(">Q", self.clientid) + u32(seq, 0) + channel_attrs() + channel_attrs() + u32(0x40000000, 1, 0)
        st, n, r = compound(c, [cs], minor=minor)
        assert st == OK, f"CREATE_SESSION: {st}"
        assert r.u32() == OP_CREATE_SESSION and r.u32() == OK
        self.sessionid = r.body[r.pos : r.pos + 16]
        self.seq = 0

    def sequence(self, sessionid=None):
        self.seq += 1
        return u32(OP_SEQUENCE) + (sessionid or self.sessionid) + u32(self.seq, 0, 0, 0)


def test_wrong_minor_versions(server):
    c = Client(server.nfs_port)
    for minor in (0, 3, 7):
        st, n, _ = compound(c, [u32(OP_PUTROOTFH)], minor=minor)
        assert (st, n) == (NFS4ERR_MINOR_VERS_MISMATCH, 0), minor


def test_ops_outside_a_session_and_forged_session(server):
    c = Client(server.nfs_port)
    st, _, _ = compound(c, [u32(OP_PUTROOTFH)])
    assert st == NFS4ERR_OP_NOT_IN_SESSION
    st, _, _ = compound(c, [u32(OP_SEQUENCE) + os.urandom(16) + u32(1, 0, 0, 0), u32(OP_PUTROOTFH)])
    assert st == NFS4ERR_BADSESSION
    st, _, _ = compound(c, [u32(99)])
    assert st in (NFS4ERR_OP_ILLEGAL, NFS4ERR_OP_NOT_IN_SESSION)


def test_forged_handle_bad_stateid_illegal_op(server):
    v3 = Client(server.nfs_port)
    _, root = v3.mnt(b"/memfs")
    st, _ = v3.create(root, b"v4-target")
    assert st == 0
    c = Client(server.nfs_port)
    s = Session(c)
    st, _, _ = compound(c, [s.sequence(), u32(OP_PUTFH) + opaque(b"forged" * 4)])
    assert st == NFS4ERR_BADHANDLE
    # Replaying a slot's sequence id out of order is refused.
    s.seq -= 2
    st, _, _ = compound(c, [s.sequence(), u32(OP_PUTROOTFH)])
    assert st == NFS4ERR_SEQ_MISORDERED
    s.seq += 1
    lookup = lambda name: u32(OP_LOOKUP) + opaque(name)
    bad_stateid = u32(1) + os.urandom(12)
    read = u32(OP_READ) + bad_stateid + struct.pack(">QI", 0, 4096)
    st, _, _ = compound(c, [s.sequence(), u32(OP_PUTROOTFH), lookup(b"memfs"), lookup(b"v4-target"), read])
    assert st in (NFS4ERR_BAD_STATEID, NFS4ERR_STALE_STATEID), st
    st, _, _ = compound(c, [s.sequence(), u32(OP_PUTROOTFH), u32(12345)])
    assert st == NFS4ERR_OP_ILLEGAL
    # The session still works, and so does the NFSv3 client.
    st, _, _ = compound(c, [s.sequence(), u32(OP_PUTROOTFH), u32(OP_GETFH)])
    assert st == OK
    assert v3.getattr(root) == 0


def test_v42_operations_with_hostile_arguments(server):
    v3 = Client(server.nfs_port)
    _, root = v3.mnt(b"/memfs")
    st, _ = v3.create(root, b"v42-target")
    assert st == 0
    c = Client(server.nfs_port)
    s = Session(c, minor=2)
    lookup = lambda name: u32(OP_LOOKUP) + opaque(name)
    anon = u32(0) + bytes(12)
    path = [u32(OP_PUTROOTFH), lookup(b"memfs"), lookup(b"v42-target")]

    def last(ops):
        st, n, r = compound(c, [s.sequence()] + path + ops, minor=2)
        return st

    assert last([u32(OP_SEEK) + anon + struct.pack(">QI", 1 << 63, 0)]) == NFS4ERR_NXIO
    assert last([u32(OP_SEEK) + anon + struct.pack(">QI", (1 << 64) - 1, 1)]) == NFS4ERR_NXIO
    assert last([u32(OP_SEEK) + anon + struct.pack(">Q", 0)]) == NFS4ERR_BADXDR  # truncated
    assert last([u32(OP_ALLOCATE) + anon + struct.pack(">QQ", 1 << 63, 1)]) == NFS4ERR_FBIG
    assert last([u32(OP_ALLOCATE) + anon + struct.pack(">QQ", (1 << 64) - 1, (1 << 64) - 1)]) == NFS4ERR_FBIG
    assert last([u32(OP_READ_PLUS) + anon + struct.pack(">QI", 1 << 63, 1 << 31)]) == OK
    assert last([u32(OP_COPY) + os.urandom(20)]) == NFS4ERR_BADXDR
    assert last([u32(OP_CLONE) + os.urandom(20)]) == NFS4ERR_BADXDR  # truncated
    assert last([u32(OP_GETXATTR) + opaque(b"absent")]) == NFS4ERR_NOXATTR
    assert last([u32(OP_GETXATTR) + u32(0xFFFFFFFF)]) == NFS4ERR_BADXDR  # a 4 GiB name
    # Random arguments to every 4.2 operation: each answered, none fatal.
    for op in range(59, 76):
        for n in (0, 3, 16, 40, 200):
            st, _, r = compound(c, [s.sequence()] + path + [u32(op) + os.urandom(n)], minor=2)
            assert st != OK or n > 0, (op, n, st)
    # 4.2-only operations in a 4.1 COMPOUND are not operations there.
    st, _, _ = compound(c, [s.sequence()] + path + [u32(OP_SEEK) + anon + struct.pack(">QI", 0, 0)], minor=1)
    assert st == NFS4ERR_OP_ILLEGAL
    # The session still works, and so does the NFSv3 client.
    st, _, _ = compound(c, [s.sequence(), u32(OP_PUTROOTFH), u32(OP_GETFH)], minor=2)
    assert st == OK
    assert v3.getattr(root) == 0
