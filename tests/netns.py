"""Network namespaces for tests: run code inside one, and the two-namespace XDP testbed.

Traffic in these tests only ever goes to addresses inside namespaces the test made itself,
and the namespaces (with their veth pairs and any XDP program on them) are deleted in
teardown, even when the test fails.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import threading
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTBED = ROOT / "scripts" / "xdp-testbed.sh"
_CLONE_NEWNET = 0x40000000

SRV_IF, CLI_IF = "zl-s", "zl-c"
SRV_V4, CLI_V4 = "10.201.0.1", "10.201.0.2"
SRV_V6, CLI_V6 = "fd7a:6c00::1", "fd7a:6c00::2"


def in_netns(name: str, fn):
    """Run fn() on a thread that has joined network namespace `name` (setns is per thread).
    Sockets made there stay in that namespace, whichever thread uses them later."""
    out: dict = {}

    def body() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            out["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


@contextlib.contextmanager
def xdp_testbed(queues: int = 1):
    """(server namespace, client namespace) joined by a veth pair (scripts/xdp-testbed.sh)."""
    name = f"zlt{uuid.uuid4().hex[:8]}"
    subprocess.run(["bash", str(TESTBED), "up", name, str(queues)], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        yield f"{name}-srv", f"{name}-cli"
    finally:
        subprocess.run(["bash", str(TESTBED), "down", name], check=False)


FLEET_NET = "10.202.0"           # node i at 10.202.0.i, the client at .254; inside namespaces


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def fleet_testbed(nodes: int):
    """A client namespace with a bridge, and `nodes` node namespaces each joined to it by a
    veth pair: (client namespace, [node namespaces], [node addresses]). Everything lives in
    namespaces this creates, and deleting them (always, in teardown) removes the veths."""
    tag = uuid.uuid4().hex[:6]
    cli = f"zlf{tag}-cli"
    made: list[str] = []
    try:
        _ip("netns", "add", cli)
        made.append(cli)
        _ip("-n", cli, "link", "set", "lo", "up")
        _ip("-n", cli, "link", "add", "br0", "type", "bridge")
        _ip("-n", cli, "addr", "add", f"{FLEET_NET}.254/24", "dev", "br0")
        _ip("-n", cli, "link", "set", "br0", "up")
        names, addrs = [], []
        for i in range(1, nodes + 1):
            ns = f"zlf{tag}-n{i}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            a, b = f"zf{tag}a{i}", f"zf{tag}b{i}"       # <= 15 characters
            _ip("-n", cli, "link", "add", a, "type", "veth", "peer", "name", b, "netns", ns)
            _ip("-n", cli, "link", "set", a, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{FLEET_NET}.{i}/24", "dev", b)
            _ip("-n", ns, "link", "set", b, "up")
            names.append(ns)
            addrs.append(f"{FLEET_NET}.{i}")
        yield cli, names, addrs
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], check=False)
