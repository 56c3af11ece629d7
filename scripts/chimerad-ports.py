#!/usr/bin/env python3
"""Print the ports a starting chimerad bound, read back from its log.

usage: chimerad-ports.py LOG PID SERVICE... [--timeout S]

chimerad logs {"msg":"listening","service":"nfs|mount|portmap|admin|metrics",
"addr":"ip:port"} once per listener; with port 0 in its config the kernel
picks the port, so a harness never guesses one another process may take.
Prints the ports in the order of the services asked, space-separated, once
all are logged; exits 1 if process PID exits first or the timeout (20 s)
passes."""

import json
import os
import sys
import time


def logged_ports(log_path, services):
    """{service: port} of the services `log_path` says are listening so far
    (a missing log is an empty one; lines that are not JSON are skipped)."""
    found = {}
    try:
        with open(log_path) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ev, dict) and ev.get("msg") == "listening" and ev.get("service") in services:
                    found.setdefault(ev["service"], int(str(ev["addr"]).rsplit(":", 1)[1]))
    except FileNotFoundError:
        pass
    return found


def main(argv):
    timeout = 20.0
    if "--timeout" in argv:
        i = argv.index("--timeout")
        timeout = float(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    log, pid, services = argv[0], int(argv[1]), argv[2:]
    deadline = time.monotonic() + timeout
    while True:
        found = logged_ports(log, services)
        if all(s in found for s in services):
            print(" ".join(str(found[s]) for s in services))
            return 0
        try:
            os.kill(pid, 0)
            gone = False
        except ProcessLookupError:
            gone = True
        if gone or os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z":
            print(f"chimerad-ports: process {pid} exited before logging {[s for s in services if s not in found]}", file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            print(f"chimerad-ports: {[s for s in services if s not in found]} not logged within {timeout} s", file=sys.stderr)
            return 1
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
