"""Independent clients against a real chimerad: the libnfs command-line tools
(nfs-cp, nfs-cat, nfs-ls) over NFSv3, with data verified by checksum, and
what they see over NFSv4 (libnfs speaks only NFSv4.0, which chimerad answers
with a clear minor-version error: it serves NFSv4.1)."""

import hashlib
import os
import subprocess


def run(*args, check=True):
    p = subprocess.run(args, capture_output=True, timeout=60)
    if check:
        assert p.returncode == 0, f"{args}: rc={p.returncode} {p.stderr.decode()}"
    return p


def test_copy_in_and_out_v3(server, tmp_path):
    data = os.urandom(8 << 20) + b"tail-not-aligned"
    src = tmp_path / "src"
    src.write_bytes(data)
    run("nfs-cp", str(src), server.url("/big.bin"))
    out = run("nfs-cat", server.url("/big.bin")).stdout
    assert hashlib.sha256(out).hexdigest() == hashlib.sha256(data).hexdigest()
    dst = tmp_path / "dst"
    run("nfs-cp", server.url("/big.bin"), str(dst))
    assert dst.read_bytes() == data


def test_listing_v3(server, tmp_path):
    small = tmp_path / "s"
    small.write_bytes(b"hello")
    names = [f"f{i:03d}" for i in range(60)]
    for n in names:
        run("nfs-cp", str(small), server.url(f"/{n}"))
    listing = run("nfs-ls", server.url("/")).stdout.decode()
    for n in names:
        assert f" {n}\n" in listing or listing.endswith(f" {n}"), f"{n} missing from listing"
    # Sizes are reported as written.
    line = next(l for l in listing.splitlines() if l.endswith(" f000"))
    assert " 5 " in line


def test_copy_over_existing_name_fails_cleanly(server, tmp_path):
    f = tmp_path / "x"
    f.write_bytes(b"1")
    run("nfs-cp", str(f), server.url("/once"))
    p = run("nfs-cp", str(f), server.url("/once"), check=False)
    assert p.returncode != 0


def test_missing_export_and_file(server):
    p = run("nfs-cat", server.url("/does-not-exist"), check=False)
    assert p.returncode != 0
    p = run("nfs-ls", f"nfs://127.0.0.1/nope?nfsport={server.nfs_port}&mountport={server.nfs_port}&version=3", check=False)
    assert p.returncode != 0


def test_nfs4_minor_version_0_is_refused_clearly(server):
    p = run("nfs-ls", server.url("/", version=4), check=False)
    assert p.returncode != 0
    err = (p.stdout + p.stderr).decode()
    assert "MINOR_VERS_MISMATCH" in err or "minor" in err.lower(), err
