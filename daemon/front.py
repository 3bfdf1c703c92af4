"""The daemon's I/O side as one sans-IO object: a datagram, an engine's event or the passing of
time goes in with the time it happened, and the frames that it brings come out, each with the
address its carrier sends it to. Nothing here reads a clock, touches a socket or waits.

Its parts: admission.py answers a datagram (a new request admitted and handed to an engine or
refused, a duplicate attached or replayed, a control message answered), streams.py turns an
engine's events into frames, in_flight.py is the record of the requests between the two.
server.py only moves things: datagrams from the carriers into `receive`, events from the
engines' hand-offs into `on_event`, its loop's clock into `tick`, and what they return out
through the carriers. So the whole datagram-to-frame path runs in a test on a fake clock,
the way the client's request machine does (tests/test_front.py).

Its hand-offs to the engines (each EngineSlot's admissions queue) are the one thing it does
besides returning frames: a request admitted is put there in the same call, before its ACK
is returned, so an ACK never promises a request that no engine holds.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.wire import ServerState

from .admission import Admission
from .carriers import Address, Frames
from .config import DaemonConfig
from .engines import EngineSlot
from .in_flight import InFlight
from .ingress import Ingress
from .lifecycle_events import Publisher
from .ops.metrics import Metrics
from .request import CancelReason, EngineEvent
from .streams import Streams

Log = Callable[[str, int], None]


class Front:
    def __init__(self, cfg: DaemonConfig, ingress: Ingress, in_flight: InFlight,
                 engines: list[EngineSlot], metrics: Metrics, state: Callable[[], ServerState],
                 *, publisher: Publisher | None = None,
                 wall_us: Callable[[], int] = lambda: time.time_ns() // 1000,
                 log: Log = lambda msg, level: None) -> None:
        self._out: Frames = []
        self.ingress = ingress
        self.in_flight = in_flight
        self.metrics = metrics
        self.lease_s = cfg.cache.lease_s
        self._log = log
        self.streams = Streams(in_flight, metrics, self._send, publisher)
        self.admission = Admission(cfg, ingress, in_flight, engines, metrics, self.streams,
                                   self._send, state, wall_us)

    def receive(self, datagram: bytes, addr: Address, now: float) -> Frames:
        """A datagram from a carrier, received at monotonic time `now`."""
        try:
            self.admission.on_datagram(datagram, addr, now)
        except Exception as e:  # noqa: BLE001 - one bad request must not end the daemon
            self.metrics.errors.labels(ErrorCode.INTERNAL.name).inc()
            self._log(f"internal error in request handling: {type(e).__name__}: {e}",
                      logging.ERROR)
        return self._take()

    def on_event(self, ev: EngineEvent, now: float) -> Frames:
        """An engine's event about one of its requests (not EngineDied: see engine_failed)."""
        self.streams.on_event(ev, now)
        return self._take()

    def tick(self, now: float) -> Frames:
        """Time has passed: reassemblies and nonces past their window are dropped, and each
        request whose client stopped renewing its lease is cancelled (ERROR CANCELLED)."""
        self.ingress.tick(now)
        for e in self.in_flight.cache.expired_leases(self.lease_s, now):
            r = self.in_flight.get(e.key)
            if r is not None:
                self.streams.cancel(r, CancelReason.LEASE, now)
        return self._take()

    def engine_failed(self, index: int | None, msg: str) -> Frames:
        """Engine `index` is gone (None: all of them): its requests end with INTERNAL, never
        silence, and it is never routed to again."""
        if index is not None and self.admission.router is not None:
            self.admission.router.forget(index)
        mine = list(self.in_flight) if index is None else self.in_flight.of_engine(index)
        for r in mine:
            self.streams.fail(r, ErrorCode.INTERNAL, f"the engine failed: {msg}")
        return self._take()

    def drain(self, now: float) -> Frames:
        """The daemon stops: every request still in flight is told so (ERROR CANCELLED)."""
        for r in list(self.in_flight):
            self.streams.cancel(r, CancelReason.DRAIN, now)
        return self._take()

    @property
    def tokens_out(self) -> int:
        """Tokens framed so far (systemd's STATUS line's tok/s)."""
        return self.streams.tokens_out

    def _send(self, frame: bytes, addr: Address) -> None:
        self._out.append((frame, addr))

    def _take(self) -> Frames:
        out, self._out = self._out, []
        return out
