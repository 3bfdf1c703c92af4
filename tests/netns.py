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
