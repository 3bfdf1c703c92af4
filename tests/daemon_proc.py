"""Start a real zerolayerd subprocess on 127.0.0.1 for end-to-end tests, and stop it."""
from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port(kind=socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaemonProc:
    """netns: run the daemon inside that network namespace (`ip netns exec`), listening on
    `host`; its metrics are then fetched from inside the namespace too."""

    def __init__(self, tmp_path, *extra: str, env: dict | None = None, netns: str | None = None,
                 host: str = "127.0.0.1", port: int | None = None, secret: bytes | None = None,
                 wait_ready: bool = True):
        self.keys_file = tmp_path / "keys"
        self.secret = secret or secrets.token_bytes(32)
        self.key_id = 7
        self.keys_file.write_text(f"# test key\n{self.key_id} {self.secret.hex()}\n")
        os.chmod(self.keys_file, 0o600)
        # a fresh namespace has every port free
        self.port = port or (7433 if netns else free_port())
        self.metrics_port = 9433 if netns else free_port(socket.SOCK_STREAM)
        self.netns = netns
        self.addr = (host, self.port)
        cmd = [sys.executable, "-m", "zerolayer.daemon.server",
               "--security-keys-file", str(self.keys_file), "--network-port", str(self.port),
               "--network-host", host,
               "--metrics-port", str(self.metrics_port), "--model-max-seq-len", "2048", *extra]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.cmd = cmd
        self.log: list[str] = []
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env={**os.environ, **(env or {})})
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout: float = 300) -> None:
        # generous: the first start in a fresh environment compiles the kernels
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError("zerolayerd did not become ready:\n" + "".join(self.log))

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            if "ready on" in line:
                self._ready.set()

    def metric(self, name: str, labels: str = "") -> float:
        def fetch() -> str:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            return urllib.request.urlopen(url, timeout=5).read().decode()
        if self.netns:
            from netns import in_netns
            text = in_netns(self.netns, fetch)
        else:
            text = fetch()
        pat = re.escape(name + (("{" + labels + "}") if labels else "")) + r" ([0-9.e+-]+)"
        m = re.search("^" + pat + "$", text, re.M)
        if m is None:
            raise KeyError(name + labels)
        return float(m.group(1))

    def signal(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode

    def wait_for(self, cond, timeout: float = 30, what: str = "condition") -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if cond():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")


class Hooks:
    """The engine test hooks (daemon/test_hooks.py) of one daemon: pass
    env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)} to DaemonProc."""

    def __init__(self, path):
        self.dir = path
        path.mkdir()

    def hold(self, d: DaemonProc) -> None:
        """Hold the engine at its next step boundary and wait until it is there."""
        (self.dir / "hold").touch()
        d.wait_for(lambda: (self.dir / "held").exists(), timeout=120, what="engine held")

    def release(self) -> None:
        (self.dir / "hold").unlink(missing_ok=True)

    def crash(self) -> None:
        (self.dir / "crash").touch()
