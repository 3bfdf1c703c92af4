"""Overload relative to the machine: measure what the daemon sustains here, then offer a
multiple of it, open loop, so that its queues fill on a slow host as on a fast one.

A fixed offered rate says nothing portable: ten times what a fast host serves is a real
overload there and a trickle on one three times slower, whose wait queue
(max_running + max_waiting per engine) then never fills, and whose OVERLOADED path then goes
unexercised. So:

  measure_capacity  closed loop, `concurrency` SDK clients back to back for `seconds`:
                    finished requests per second (the sustained rate of this request kind);
  OpenLoop          signed INVOKEs of the same kind at `rate` per second, sent on schedule
                    whatever the daemon answers (open loop: a slow daemon gets more queued,
                    not fewer sent), each admitted one kept alive with keepalives until its
                    DONE or ERROR, so it waits in the queue instead of losing its lease, and
                    every answer counted by kind.
"""
from __future__ import annotations

import secrets
import socket
import threading
import time
from collections import Counter

from zerolayer.client import Client
from zerolayer.protocol import wire
from zerolayer.protocol.errors import ErrorCode, ZerolayerError
from zerolayer.protocol.wire import ChatMessage, MsgType, PayloadKind, SamplingParams

PROMPT = "Write about the sea."
MAX_TOKENS = 16
TICK_S = 0.005


def measure_capacity(addr, key_id: int, secret: bytes, seconds: float,
                     concurrency: int) -> float:
    """Requests of OpenLoop's kind finished per second, `concurrency` at a time."""
    done, stop = [0], threading.Event()

    def client() -> None:
        c = Client(addr, key_id, secret, timeout=60)
        while not stop.is_set():
            try:
                c.invoke(messages=[ChatMessage("user", PROMPT)], max_tokens=MAX_TOKENS)
                done[0] += 1
            except ZerolayerError:
                pass
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    time.sleep(seconds / 4)        # a ramp: the first requests pay for empty caches
    n0, t0 = done[0], time.monotonic()
    time.sleep(seconds * 3 / 4)
    rate = (done[0] - n0) / (time.monotonic() - t0)
    stop.set()
    for t in threads:
        t.join(120)
    return rate


class OpenLoop:
    def __init__(self, addr, key_id: int, secret: bytes, rate: float, lease_s: float = 10.0):
        self.addr, self.key_id, self.secret, self.rate = addr, key_id, secret, rate
        self.keep_every = lease_s / 4
        self.counts: Counter[str] = Counter()
        self.live: dict[bytes, float] = {}   # admitted, not ended: rid -> last keepalive
        self.body = wire.encode_invoke_body(SamplingParams(max_tokens=MAX_TOKENS),
                                            PayloadKind.CHAT,
                                            wire.encode_chat([ChatMessage("user", PROMPT)]))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(0.1)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._send, self._read, self._keepalives)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> dict:
        self.stop.set()
        for t in self.threads:
            t.join(10)
        self.sock.close()
        return dict(self.counts)

    def _send(self) -> None:
        t0 = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - t0) * self.rate) - self.counts["sent"]
            for _ in range(min(due, 500)):
                rid = secrets.token_bytes(16)
                for dg in wire.encode_invoke(self.key_id, self.secret, rid,
                                             time.time_ns() // 1000, secrets.token_bytes(32),
                                             self.body):
                    self.sock.sendto(dg, self.addr)
                self.counts["sent"] += 1
            time.sleep(TICK_S)

    def _read(self) -> None:
        while not self.stop.is_set():
            try:
                f = wire.decode_response(self.sock.recv(4096), self.secret)
            except (OSError, ValueError, ZerolayerError):
                continue
            rid = f.request_id
            if isinstance(f, wire.AckFrame) and f.state is wire.RunState.QUEUED:
                self.counts["admitted"] += 1
                self.live.setdefault(rid, time.monotonic())
            elif isinstance(f, wire.DoneFrame):
                self.counts["done"] += 1
                self.live.pop(rid, None)
            elif isinstance(f, wire.ErrorFrame):
                try:
                    code = ErrorCode(f.code).name
                except ValueError:
                    code = str(f.code)
                self.counts[f"refused:{code}" if f.seq == wire.NO_SEQ else f"failed:{code}"] += 1
                self.live.pop(rid, None)

    def _keepalives(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for rid, last in list(self.live.items()):
                if now - last >= self.keep_every:
                    self.sock.sendto(wire.encode_control(
                        MsgType.RESEND, self.key_id, self.secret, rid, time.time_ns() // 1000,
                        secrets.token_bytes(32), wire.NO_SEQ), self.addr)
                    self.live[rid] = now
            time.sleep(0.1)
