"""systemd integration under a fake NOTIFY_SOCKET (a Unix datagram socket of the test's):
READY after warm-up, STATUS lines, WATCHDOG=1 from the engine's progress (they stop while a
step is stuck, held by daemon/test_hooks.py, and come back after it), RELOADING around a
keys reload, STOPPING on SIGTERM. (tests/test_deploy.py runs `systemd-analyze verify` on the
shipped unit.)"""
from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

from daemon_proc import DaemonProc
from test_dataplane import COUNT, Hooks
from zerolayer.client import Client
from zerolayer.daemon.ops.sd_notify import Notifier, Watchdog


class FakeSystemd:
    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.path = path
        self.msgs: list[tuple[float, str]] = []
        self._halt = threading.Event()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        while not self._halt.is_set():
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, OSError):
                continue
            for line in data.decode().splitlines():
                self.msgs.append((time.monotonic(), line))

    def lines(self, prefix: str, since: float = 0.0) -> list[str]:
        return [m for t, m in list(self.msgs) if m.startswith(prefix) and t >= since]

    def close(self) -> None:
        self._halt.set()
        self.t.join(1)
        self.sock.close()


def test_notify_lifecycle_and_a_watchdog_that_follows_the_engine(tmp_path):
    fake = FakeSystemd(tmp_path / "notify.sock")
    hooks = Hooks(tmp_path / "hooks")
    # WatchdogSec=2: pings when the engine's last turn is younger than 1 s, ~every 0.5 s
    d = DaemonProc(tmp_path, env={"NOTIFY_SOCKET": str(fake.path), "WATCHDOG_USEC": "2000000",
                                  "ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    try:
        d.wait_for(lambda: fake.lines("READY=1"), what="READY=1")
        assert fake.lines("STATUS=warming") and fake.lines("STATUS=ready")
        d.wait_for(lambda: len(fake.lines("WATCHDOG=1")) >= 3, what="watchdog pings")
        # a stuck step: the engine is held inside a step for as long as the test likes
        (hooks.dir / "hold").touch()
        s = Client(d.addr, d.key_id, d.secret, timeout=120).stream(COUNT, max_tokens=8)
        d.wait_for(lambda: (hooks.dir / "held").exists(), timeout=120, what="engine held")
        # The engine's last turn is now frozen; 1 s later it is too old to vouch for it, and
        # every ping that falls due is withheld (the watchdog says so through the hook).
        withheld = hooks.dir / "watchdog-withheld"
        withheld.unlink(missing_ok=True)
        d.wait_for(lambda: _withheld(withheld)[1] >= 3, what="three pings withheld in a row")
        pings, _ = _withheld(withheld)
        d.wait_for(lambda: len(fake.lines("WATCHDOG=1")) >= pings, what="the pings sent")
        assert len(fake.lines("WATCHDOG=1")) == pings   # none since: systemd would restart it
        hooks.release()
        assert "".join(s) is not None and s.result is not None
        d.wait_for(lambda: fake.lines("WATCHDOG=1", since=time.monotonic() - 1.0),
                   what="pings again after the step")
        # a keys reload is announced around the reload
        d.signal(signal.SIGHUP)
        d.wait_for(lambda: fake.lines("RELOADING=1"), what="RELOADING=1")
        d.wait_for(lambda: len(fake.lines("READY=1")) >= 2, what="READY=1 after the reload")
        assert fake.lines("MONOTONIC_USEC=")
        d.wait_for(lambda: any("running" in m and "tok/s" in m for m in fake.lines("STATUS=")),
                   timeout=30, what="a STATUS line with the load")
    finally:
        hooks.release()
        code = d.stop()
        fake.close()
    assert code == 0 and fake.lines("STOPPING=1")


def _withheld(path: Path) -> tuple[int, int]:
    """(pings sent, pings withheld in a row) as the daemon's watchdog last wrote them."""
    try:
        pings, in_a_row = path.read_text().split()
    except (FileNotFoundError, ValueError):
        return 0, 0
    return int(pings), int(in_a_row)


def test_watchdog_logic_with_an_injected_clock():
    sent: list[str] = []
    n = Notifier(environ={"NOTIFY_SOCKET": "", "WATCHDOG_USEC": "10000000"})
    n.notify = lambda *lines: sent.extend(lines)  # type: ignore[method-assign]
    now = [100.0]
    beat = [100.0]
    w = Watchdog(n, lambda: beat[0], clock=lambda: now[0])
    assert w.interval == 5.0
    w.tick()
    assert sent == ["WATCHDOG=1"]
    now[0] += 1.0
    w.tick()                       # too soon after the last ping
    assert len(sent) == 1
    now[0] += 2.0                  # 3 s since the engine's last turn: still fresh
    w.tick()
    assert len(sent) == 2
    now[0] += 3.0                  # 6 s: a stuck step, no ping
    w.tick()
    assert len(sent) == 2 and w.withheld == 1
    now[0] += 1.0
    w.tick()
    assert len(sent) == 2 and w.withheld == 2
    beat[0] = now[0]               # the step ended
    w.tick()
    assert len(sent) == 3 and w.withheld == 0
    other = Notifier(environ={"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "10000000",
                              "WATCHDOG_PID": "1"})
    assert other.watchdog_s == 0.0  # meant for another process


def test_a_stop_at_the_moment_of_ready_drains_and_exits_0(tmp_path):
    """Scripts and systemd act the instant the daemon says it is ready (the "ready on" line,
    READY=1): a SIGTERM then (`systemctl start; systemctl stop`, a rollout) must meet the
    daemon's drain, not the default action."""
    fake = FakeSystemd(tmp_path / "notify.sock")
    d = DaemonProc(tmp_path, env={"NOTIFY_SOCKET": str(fake.path)}, wait_ready=False)
    try:
        d.wait_ready()             # returns on the "ready on" line
        d.signal(signal.SIGTERM)
        code = d.wait(60)
    finally:
        d.stop()
        fake.close()
    assert code == 0, "".join(d.log[-10:])
    d.wait_for(lambda: fake.lines("STOPPING=1"), what="STOPPING=1")
