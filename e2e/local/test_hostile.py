"""Hostile input over the wire: truncated records, a 2^31-1 fragment length,
garbage after a valid header, unknown program/version/procedure, a wrong RPC
version, an unsupported auth flavor, forged and stale file handles. Each gets
the correct RPC/NFS error or a closed connection, while a well-behaved client
on its own connection keeps being served throughout."""

import os
import socket
import struct
import threading
import time

import pytest
from rpcclient import AUTH_NONE, MOUNT_PROG, NFS_PROG, Client, opaque


@pytest.fixture
def bystander(server):
    """A client calling GETATTR on the export root in a loop; asserts it never
    fails and made progress during the test."""
    c = Client(server.nfs_port)
    _, root = c.mnt(b"/memfs")
    state = {"calls": 0, "error": None, "stop": False}

    def loop():
        try:
            while not state["stop"]:
                assert c.getattr(root) == 0
                state["calls"] += 1
                time.sleep(0.002)
        except Exception as e:  # noqa: BLE001 - reported below
            state["error"] = e

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield state
    before = state["calls"]
    time.sleep(0.1)
    state["stop"] = True
    t.join(5)
    assert state["error"] is None, f"well-behaved client failed: {state['error']!r}"
    assert state["calls"] > before, "well-behaved client stopped making progress"
    c.close()


def closed(sock):
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_oversize_fragment_closes_connection(server, bystander):
    c = Client(server.nfs_port)
    c.send_raw(struct.pack(">I", 0xFFFFFFFF))
    assert closed(c.sock)


def test_truncated_record_then_hangup(server, bystander):
    c = Client(server.nfs_port)
    c.send_raw(struct.pack(">I", 0x80000100) + b"\0" * 40)
    c.close()
    c = Client(server.nfs_port)
    c.send_raw(struct.pack(">I", 0x80000002) + b"\1\2")  # too short for an xid
    assert closed(c.sock)


def test_garbage_after_header(server, bystander):
    c = Client(server.nfs_port)
    r = c.call(NFS_PROG, 3, 7, os.urandom(16))  # WRITE with nonsense arguments
    assert (r.reply_stat, r.accept_stat) == (0, 4), "GARBAGE_ARGS"
    assert c.null().accept_stat == 0, "connection still usable"


def test_unknown_program_version_procedure(server, bystander):
    c = Client(server.nfs_port)
    assert c.call(123456, 1, 0).accept_stat == 1, "PROG_UNAVAIL"
    r = c.call(NFS_PROG, 2, 0)
    assert r.accept_stat == 2, "PROG_MISMATCH"
    low, high = r.u32(), r.u32()
    assert low <= 3 <= high
    assert c.call(NFS_PROG, 3, 99).accept_stat == 3, "PROC_UNAVAIL"
    assert c.call(MOUNT_PROG, 3, 42).accept_stat == 3
    r = c.call(NFS_PROG, 3, 0, rpcvers=3)
    assert (r.reply_stat, r.reject_stat) == (1, 0), "MSG_DENIED RPC_MISMATCH"
    gss = struct.pack(">I", 6) + opaque(b"\0" * 8)
    r = c.call(NFS_PROG, 3, 0, cred=gss)
    assert (r.reply_stat, r.reject_stat, r.u32()) == (1, 1, 1), "AUTH_ERROR AUTH_BADCRED"
    none = struct.pack(">I", AUTH_NONE) + opaque(b"")
    assert c.call(NFS_PROG, 3, 0, cred=none).accept_stat == 0


def test_forged_and_stale_handles(server, bystander):
    c = Client(server.nfs_port)
    assert c.getattr(b"x" * 24) == 10001, "NFS3ERR_BADHANDLE"
    assert c.getattr(b"") == 10001
    assert c.getattr(b"\1" + b"\0" * 3 + b"\0\0\0\1" + b"\xff" * 16) in (70, 10001)
    _, root = c.mnt(b"/memfs")
    st, fh = c.create(root, b"doomed")
    assert st == 0
    r = c.call(NFS_PROG, 3, 12, opaque(root) + opaque(b"doomed"))  # REMOVE
    assert r.u32() == 0
    assert c.getattr(fh) == 70, "NFS3ERR_STALE"
    assert c.write(fh, 0, b"data")[0] == 70


def test_many_bad_connections_do_not_leak(server, bystander):
    open_before = server.metric("chimera_connections_open")
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", server.nfs_port))
        s.sendall(os.urandom(64))
        s.close()
    deadline = time.time() + 10
    while server.metric("chimera_connections_open") > open_before + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert server.metric("chimera_connections_open") <= open_before + 1
