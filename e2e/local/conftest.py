"""Fixtures that start a real chimerad process on 127.0.0.1 for each test
module, with kernel-chosen ports (port 0, read back from its log), and stop it with SIGTERM (a clean exit is
asserted: graceful shutdown is part of what these tests prove)."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHIMERAD = os.environ.get("CHIMERAD", os.path.join(ROOT, "dataplane", "target", "release", "chimerad"))
FIO = os.environ.get("FIO")
TOKEN = "test-token-1234"


def bound_ports(log_path, services, proc, deadline):
    """The ports chimerad bound, read back from its "listening" log lines
    (it binds port 0 and the kernel picks: no port is ever guessed)."""
    want = set(services)
    while True:
        found = {}
        with open(log_path) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("msg") == "listening" and ev.get("service") in want and ev["service"] not in found:
                    found[ev["service"]] = int(ev["addr"].rsplit(":", 1)[1])
        if set(found) == want:
            return found
        assert proc.poll() is None, f"chimerad exited: {open(log_path).read()}"
        assert time.time() < deadline, f"chimerad did not report its ports {sorted(want - set(found))} in 20 s"
        time.sleep(0.05)


class Server:
    def __init__(self, tmp, capacity="256M", extra_server=None):
        server = {
            "bind": "127.0.0.1",
            "nfs_port": 0,
            "mount_port": 0,
            "portmap_port": 0,
            "cores": 2,
            "grace_time_s": 0,
        }
        server.update(extra_server or {})
        self.cfg = {
            "server": server,
            "mounts": {"memfs": {"module": "memfs", "capacity_bytes": capacity}},
            "exports": {"/memfs": {"path": "/memfs"}},
            "admin": {"bind": "127.0.0.1", "port": 0, "token": TOKEN, "tls": False},
            "metrics": {"bind": "127.0.0.1", "port": 0},
        }
        self.dir = tmp
        path = os.path.join(tmp, "chimerad.json")
        with open(path, "w") as f:
            json.dump(self.cfg, f)
        self.log = open(os.path.join(tmp, "chimerad.log"), "w")
        self.proc = subprocess.Popen([CHIMERAD, "--config", path], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        ports = bound_ports(self.log.name, ("nfs", "admin", "metrics"), self.proc, deadline)
        self.nfs_port, self.admin_port, self.metrics_port = ports["nfs"], ports["admin"], ports["metrics"]
        while True:
            assert self.proc.poll() is None, f"chimerad exited: {open(self.log.name).read()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "chimerad did not become ready in 20 s"
            time.sleep(0.05)

    def url(self, path="", version=3):
        # MOUNT is served on the NFS port too, so no portmapper is involved.
        return f"nfs://127.0.0.1/memfs{path}?nfsport={self.nfs_port}&mountport={self.nfs_port}&version={version}"

    def admin(self, method, path, body=None, token=TOKEN):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}", data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        if data:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def metric(self, name, **labels):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and (not want or want in line):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def rss_peak_bytes(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            m = re.search(r"VmHWM:\s+(\d+) kB", f.read())
        return int(m.group(1)) * 1024

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("chimerad did not exit within 15 s of SIGTERM")
        self.log.close()
        assert rc == 0, f"chimerad exited {rc} on SIGTERM: {open(self.log.name).read()[-2000:]}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    assert os.path.exists(CHIMERAD), f"{CHIMERAD} missing: run `make build-dataplane`"
    s = Server(str(tmp_path_factory.mktemp("chimerad")))
    yield s
    s.stop()


@pytest.fixture
def fio():
    path = FIO or shutil.which("fio-libnfs")
    assert path and os.path.exists(path), "fio with the libnfs engine missing: set FIO (make test-e2e-local does)"
    return path
