"""systemd's notification protocol (Type=notify), by hand: one datagram to $NOTIFY_SOCKET.

A dependency would not pay for itself: the protocol is "send `KEY=value` lines to a Unix
datagram socket" (sd_notify(3)); libsystemd's binding needs headers to build, and the pure
Python `sdnotify` package (last released 2017) swallows every error. This one is tested
against a fake NOTIFY_SOCKET (tests/test_systemd.py).

What the daemon sends (docs/OPERATIONS.md "Running under systemd"):
  READY=1 after warm-up; STATUS=... lines (state, running, waiting, tok/s);
  EXTEND_TIMEOUT_USEC while the model loads and kernels compile; STOPPING=1 on SIGTERM;
  RELOADING=1 + MONOTONIC_USEC then READY=1 around a keys reload; WATCHDOG=1 while the
  engine makes progress (Watchdog below).
"""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from .. import test_hooks


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None,
                 log: Callable[[str], None] = print):
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        self.addr = ("\0" + path[1:]) if path.startswith("@") else path
        self.log = log
        usec = int(env.get("WATCHDOG_USEC", "0") or 0)
        pid = env.get("WATCHDOG_PID", "")
        # systemd passes the watchdog to the main process only (WATCHDOG_PID)
        self.watchdog_s = usec / 1e6 if usec and (not pid or int(pid) == os.getpid()) else 0.0
        self.sent: list[bytes] = []  # the last few messages, for logs and tests

    @property
    def enabled(self) -> bool:
        return bool(self.addr)

    def notify(self, *lines: str) -> None:
        if not self.addr:
            return
        msg = "\n".join(lines).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            try:
                s.sendto(msg, self.addr)
            except OSError as e:
                self.log(f"sd_notify failed: {e}")
        self.sent = (self.sent + [msg])[-16:]

    def reloading(self) -> None:
        self.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


class Watchdog:
    """WATCHDOG=1 only while the engine makes progress: the engine thread stamps `beat` at
    every turn of its loop (after each step, and at least every idle wait), and the I/O
    thread pings from its housekeeping only when that stamp is younger than half the
    watchdog interval. A step stuck in a kernel, or a stuck I/O thread, stops the pings and
    systemd restarts the daemon after WatchdogSec=."""

    def __init__(self, notifier: Notifier, beat: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic):
        self.n = notifier
        self.beat = beat              # () -> monotonic time of the engine's last turn
        self.clock = clock
        self.interval = notifier.watchdog_s / 2
        self.last = 0.0
        self.pings = 0
        self.withheld = 0             # pings due but not sent, in a row (a stuck engine)

    def tick(self) -> None:
        if not self.interval:
            return
        now = self.clock()
        if now - self.last < self.interval / 2:
            return                    # the last ping is recent enough
        if now - self.beat() < self.interval:
            self.n.notify("WATCHDOG=1")
            self.last = now
            self.pings += 1
            self.withheld = 0
        else:
            self.withheld += 1
            # a test waits for this decision instead of sleeping through the silence
            test_hooks.watchdog_withheld(self.pings, self.withheld)
