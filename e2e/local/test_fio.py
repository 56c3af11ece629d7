"""fio with its libnfs engine (an independent client) runs mixed random
read/write with crc32c verification against chimerad: zero verify errors.

A negative control proves verification is live: data overwritten behind
fio's back is detected."""

import json
import os
import subprocess


def fio_run(fio, tmp_path, job, name):
    path = tmp_path / f"{name}.fio"
    path.write_text(job)
    out_path, err_path = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    # Output goes to files, not pipes: fio's job processes call setsid(), so a
    # job stuck in libnfs teardown would otherwise hold our pipes open forever.
    # cwd: fio drops verify state files into its working directory.
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen([fio, "--output-format=json", str(path)], stdout=out, stderr=err, cwd=tmp_path)
        try:
            rc = p.wait(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            subprocess.run(["pkill", "-9", "-f", str(path)], check=False)
            raise AssertionError(f"fio job {name} did not finish in 300 s")
    text = out_path.read_text()
    data = json.loads(text[text.index("{") :]) if "{" in text else None
    return rc, data, err_path.read_text()


def job(server, body, size="16m", bs="4k"):
    return (
        "[global]\nioengine=nfs\n"
        f"nfs_url={server.url()}\n"
        f"size={size}\nbs={bs}\nverify=crc32c\nverify_fatal=1\n" + body
    )


LAYOUT = "[layout]\nfilename={f}\nrw=write\niodepth=1\ndo_verify=0\n"
MIX = "[mix]\nstonewall\nfilename={f}\nrw=randrw\nrwmixread=50\niodepth=8\nverify_backlog=64\ndo_verify=0\n"
CHECK = "[check]\nstonewall\nfilename={f}\nrw=read\niodepth=1\n"


def test_mixed_random_rw_verifies(server, fio, tmp_path):
    rc, data, err = fio_run(fio, tmp_path, job(server, (LAYOUT + MIX + CHECK).format(f="mix.dat")), "mix")
    assert rc == 0, err
    assert "verify" not in err.lower() and "crc32c" not in err.lower(), err
    jobs = {j["jobname"]: j for j in data["jobs"]}
    for name in ("layout", "mix", "check"):
        assert jobs[name]["error"] == 0, (name, err)
    assert jobs["mix"]["read"]["io_bytes"] > 0 and jobs["mix"]["write"]["io_bytes"] > 0
    # The sequential check pass read (and verified) the whole file. fio 3.33's
    # nfs engine may abandon its last in-flight I/Os when a job ends at
    # iodepth > 1 (its getevents ignores `min`); the check job runs at
    # iodepth 1 so it reads everything.
    assert jobs["check"]["read"]["io_bytes"] == 16 << 20, err
    assert server.metric("chimera_rpc_ops_total", program="nfs3", op="write") >= 4096


def test_large_reads_are_lent_and_verify(server, fio, tmp_path):
    # READs of 16 KiB and more go out zero-copy (memfs buffers lent to the
    # reply, one sendmsg); at 128 KiB with 8 in flight, mixed with writes
    # that hit buffers still lent, every byte read back must verify.
    body = (LAYOUT + MIX + CHECK).format(f="big.dat")
    rc, data, err = fio_run(fio, tmp_path, job(server, body, size="32m", bs="128k"), "big")
    assert rc == 0, err
    assert "verify" not in err.lower() and "crc32c" not in err.lower(), err
    jobs = {j["jobname"]: j for j in data["jobs"]}
    for name in ("layout", "mix", "check"):
        assert jobs[name]["error"] == 0, (name, err)
    assert jobs["check"]["read"]["io_bytes"] == 32 << 20, err
    assert jobs["mix"]["read"]["io_bytes"] > 0 and jobs["mix"]["write"]["io_bytes"] > 0


def test_verification_detects_corruption(server, fio, tmp_path):
    from rpcclient import Client

    rc, _, err = fio_run(fio, tmp_path, job(server, LAYOUT.format(f="victim.dat"), size="1m"), "layout")
    assert rc == 0, err
    c = Client(server.nfs_port)
    _, root = c.mnt(b"/memfs")
    st, fh = c.lookup(root, b"victim.dat")
    assert st == 0
    assert c.write(fh, 64 << 10, b"\xa5" * 4096) == (0, 4096)
    c.close()
    rc, data, err = fio_run(fio, tmp_path, job(server, CHECK.replace("stonewall\n", "").format(f="victim.dat"), size="1m"), "check")
    assert rc != 0 or (data and data["jobs"][0]["error"] != 0), "corruption went unnoticed"
    assert "verify" in err.lower() or "crc32c" in err.lower(), err
