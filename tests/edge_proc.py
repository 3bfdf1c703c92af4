"""Start zerolayer-http as its own process on a loopback port, in front of a DaemonProc, and
stop it: the edge the end-to-end HTTP tests drive with the official SDKs."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from daemon_proc import DaemonProc, free_port
from zerolayer.daemon.programs.http_edge.tokens import digest

MODEL = "smollm2-test"
TOKEN = "zl-test-token-0123456789abcdef"
TOKEN_UNKNOWN_KEY = "zl-test-token-for-a-key-the-daemon-lacks"


class EdgeProc:
    def __init__(self, tmp: Path, d: DaemonProc, *extra: str):
        keys = tmp / "edge-keys"     # the daemon's key 7, and key 9 the daemon never heard of
        keys.write_text(d.keys_file.read_text() + "9 " + "ab" * 32 + "\n")
        os.chmod(keys, 0o600)
        tokens = tmp / "http-tokens"
        tokens.write_text(f"# test tokens\n{d.key_id} sha256:{digest(TOKEN).hex()}\n"
                          f"9 {TOKEN_UNKNOWN_KEY}\n")
        os.chmod(tokens, 0o600)
        self.port = free_port(socket.SOCK_STREAM)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "edge.log"
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zerolayer.daemon.programs.http_edge.app",
             "--daemon", f"{d.addr[0]}:{d.addr[1]}", "--keys", str(keys),
             "--tokens", str(tokens), "--listen", f"127.0.0.1:{self.port}",
             "--model-name", MODEL, "--max-attempts", "1", "--daemon-timeout-s", "30", *extra],
            stdout=self._log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.base + "/metrics", timeout=2).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("edge did not start:\n" + self.log.read_text()) from None
                time.sleep(0.05)

    def metrics_text(self) -> str:
        return urllib.request.urlopen(self.base + "/metrics", timeout=5).read().decode()

    def metric(self, name: str, labels: str = "") -> float:
        pat = re.escape(name + (("{" + labels + "}") if labels else "")) + r" ([0-9.e+-]+)"
        m = re.search("^" + pat + "$", self.metrics_text(), re.M)
        return float(m.group(1)) if m else 0.0

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@contextmanager
def daemon_and_edge(tmp: Path, *daemon_args: str) -> Iterator[tuple[DaemonProc, EdgeProc]]:
    """A daemon and an HTTP edge in front of it, both stopped on the way out."""
    d = DaemonProc(tmp, *daemon_args)
    edge = None
    try:
        edge = EdgeProc(tmp, d)
        yield d, edge
    finally:
        if edge is not None:
            edge.stop()
        d.stop()
