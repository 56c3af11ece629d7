"""Volumes made through the admin API are quota-bounded directories: a real
client writing past a volume's capacity gets NFS3ERR_DQUOT and FSSTAT reports
the volume's capacity. The memory backend stays bounded: writing four times its
capacity ends in NFS3ERR_NOSPC with the server's peak RSS under capacity +
256 MiB."""

import pytest
from conftest import Server
from rpcclient import Client

MiB = 1 << 20


def test_volume_quota_seen_by_client(server):
    st, v = server.admin("POST", "/api/v1/volumes", {"name": "pvc-quota", "capacityBytes": 4 * MiB})
    assert st in (200, 201), v
    c = Client(server.nfs_port)
    st, fh_root = c.mnt(v["exportPath"].encode())
    assert st == 0, f"MNT {v['exportPath']}: {st}"
    st, stat = c.fsstat(fh_root)
    assert st == 0 and stat["tbytes"] == 4 * MiB, stat
    st, f = c.create(fh_root, b"fill")
    assert st == 0
    chunk = b"q" * (512 << 10)
    statuses = [c.write(f, i * len(chunk), chunk)[0] for i in range(12)]
    assert 69 in statuses, f"NFS3ERR_DQUOT expected, got {statuses}"
    assert statuses[0] == 0
    # The quota is visible through the admin API too.
    st, got = server.admin("GET", f"/api/v1/volumes/{v['id']}")
    assert st == 200 and got["usedBytes"] > 0
    # Expanding the volume lets writes continue.
    st, _ = server.admin("PATCH", f"/api/v1/volumes/{v['id']}", {"capacityBytes": 16 * MiB})
    assert st == 200
    assert c.write(f, 8 * MiB, chunk)[0] == 0
    c.close()


def test_admin_requires_token(server):
    st, _ = server.admin("POST", "/api/v1/volumes", {"name": "x", "capacityBytes": MiB}, token=None)
    assert st == 401
    st, _ = server.admin("POST", "/api/v1/volumes", {"name": "x", "capacityBytes": MiB}, token="wrong")
    assert st == 401
    st, vols = server.admin("GET", "/api/v1/volumes")
    assert st == 200
    names = [v["name"] for v in (vols["volumes"] if isinstance(vols, dict) else vols)]
    assert "x" not in names


@pytest.fixture
def small(tmp_path):
    s = Server(str(tmp_path), capacity="64M")
    yield s
    s.stop()


def test_memory_bounded_under_4x_capacity(small):
    c = Client(small.nfs_port)
    _, root = c.mnt(b"/memfs")
    chunk = b"m" * MiB
    nospc = ok = 0
    for i in range(4 * 64):
        if i % 16 == 0:
            st, f = c.create(root, f"f{i // 16}".encode())
            if st == 28:
                nospc += 1
                continue
            assert st == 0, st
        st, _ = c.write(f, (i % 16) * MiB, chunk)
        if st == 0:
            ok += 1
        else:
            assert st == 28, f"NFS3ERR_NOSPC expected, got {st}"
            nospc += 1
    assert nospc > 0, "ENOSPC never arrived"
    assert 32 <= ok <= 64, ok
    peak = small.rss_peak_bytes()
    assert peak <= 64 * MiB + 256 * MiB, f"peak RSS {peak >> 20} MiB"
    c.close()
