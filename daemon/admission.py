"""A verified datagram's answer, on the I/O thread: a new request admitted and handed to an
engine (or refused before it starts), a duplicate attached or replayed, a control message
(PING, RESEND, keepalive, CANCEL) answered from the result cache.

Admission order, each step before the next can cost anything: the result cache first (a
duplicate never runs the model twice), then an entry and its run id, then an engine with
room. Room is two bounds. An engine holds at most max_running + max_waiting requests
(engine_capacity.py), and the in-flight record counts, per engine, every request handed to it
that this thread has not closed: each one the engine holds and has not seen cancelled. So
refusing here when that count reaches the capacity means the engine itself never refuses
for room after the ACK (engine.py, `submit`). Then its hand-off must take it. A request
refused here gets OVERLOADED with no place in a stream (no ACK went out: seq 0xFFFFFFFF,
run id 0, docs/PROTOCOL.md §5.3), and its entry is dropped so a retry is admitted afresh.
"""
from __future__ import annotations

from collections.abc import Callable

from zerolayer.protocol.errors import ErrorCode, OverloadedError
from zerolayer.protocol.wire import NO_SEQ, MsgType, RunState, ServerState

from . import engine_capacity, memory_bounds
from .carriers import Address
from .config import DaemonConfig
from .engines import EngineSlot
from .in_flight import InFlight
from .ingress import ControlRequest, Ingress, InvokeRequest, Rejected
from .ops.metrics import Metrics
from .request import Admitted, CancelReason, Request, Submission
from .result_cache import EntryStatus
from .routing import Router, boundary_hashes
from .streams import Send, Streams, ids

RESEND_LIMIT = 64  # frames per RESEND answer (docs/PROTOCOL.md)


class Admission:
    def __init__(self, cfg: DaemonConfig, ingress: Ingress, in_flight: InFlight,
                 engines: list[EngineSlot], metrics: Metrics, streams: Streams, send: Send,
                 state: Callable[[], ServerState], wall_us: Callable[[], int]) -> None:
        self.cfg = cfg
        self.ingress = ingress
        self.in_flight = in_flight
        self.cache = in_flight.cache
        self.engines = engines
        self.router = Router(len(engines), cfg.engine.route_slack) if len(engines) > 1 else None
        self.metrics = metrics
        self.streams = streams
        self.send = send
        self.state = state       # what PONG says (the lifecycle's phase, as the wire has it)
        self.lease_ms = int(cfg.cache.lease_s * 1000)
        self.wall_us = wall_us   # the PONG's server clock

    def on_datagram(self, data: bytes, addr: Address, now: float) -> None:
        # The datagram and a refusal's code are counted by ingress (plain ints, pulled into
        # zerolayer_ingress_datagrams_total and zerolayer_request_errors_total at scrape).
        r = self.ingress.feed(data, now)
        if type(r) is ControlRequest:   # exact types: cheaper than isinstance, and final
            self._on_control(r, addr, now)
        elif type(r) is Rejected:
            if r.reply is not None:
                self.send(r.reply, addr)
        elif type(r) is InvokeRequest:
            self._on_invoke(r, addr, now)

    def _on_invoke(self, inv: InvokeRequest, addr: Address, now: float) -> None:
        key = inv.cache_key
        e = self.cache.lookup(key)
        if e is not None:  # a duplicate: never run the model twice
            self.cache.touch(key)
            running = self.in_flight.get(key) if e.status is EntryStatus.RUNNING else None
            if running is not None:   # (the cache counted the hit: Metrics.pull_cache)
                running.addr = addr  # the client may have moved (new socket on retry)
                self.send(inv.signer.ack(e.next_seq, e.run_id, RunState.RUNNING,
                                         self.lease_ms), addr)
            for f in e.frames:
                self.send(f, addr)
            return
        try:
            entry = self.cache.start(key)
        except OverloadedError as ex:
            self.metrics.errors.labels(ErrorCode.OVERLOADED.name).inc()
            self.send(inv.signer.error(ErrorCode.OVERLOADED, str(ex)), addr)
            return
        adm = Admitted(key, inv.body.params, inv.received_at,
                       int((now - inv.received_at) * 1e6), memory_bounds.body_bytes(inv.body))
        req = Request(adm, inv.signer, entry.run_id, addr=addr)
        slot = self._route(req, Submission(adm, inv.body))
        if isinstance(slot, str):  # the engine is that far behind: say so, drop nothing
            self.metrics.errors.labels(ErrorCode.OVERLOADED.name).inc()
            self.cache.finish(key, cacheable=False)
            self.send(inv.signer.error(ErrorCode.OVERLOADED, slot), addr)
            return
        self.in_flight.admit(req)
        if self.streams.publisher is not None:
            self.streams.publisher.publish("admitted", **ids(req), fragments=inv.fragments)
        # a model run is counted when the engine accepts it (AcceptedEvent), not here: the
        # engine may still refuse it as never started (a text over the context)
        self.send(inv.signer.ack(0, req.run_id, RunState.QUEUED, self.lease_ms), addr)

    def _route(self, req: Request, sub: Submission) -> EngineSlot | str:
        """Hand the request to an engine: the router's choice (several engines), else the
        next least loaded with room; when every live one is full, why (the OVERLOADED
        message)."""
        e = self.cfg.engine
        cap = engine_capacity.capacity(e.max_running, e.max_waiting)
        if self.router is None:
            slot = self.engines[0]
            if self.in_flight.on_engine(0) >= cap:
                slot.refused_full += 1
                return engine_capacity.full_text(cap, e.max_running, e.max_waiting)
            if not slot.admissions.put(sub):
                return self._handoff_full()
            self.metrics.engine_routed.labels("0", "load").inc()
            return slot
        hashes = boundary_hashes(sub.body.payload)
        load = self.in_flight.load()
        alive = [not s.dead for s in self.engines]
        i, why = self.router.choose(hashes, load, alive)
        order = ([i] if i >= 0 else []) + sorted(
            (s.index for s in self.engines if not s.dead and s.index != i),
            key=lambda j: (load[j], j))
        roomy = [j for j in order if load[j] < cap]
        if order and not roomy:
            self.engines[order[0]].refused_full += 1
            return engine_capacity.full_text(cap, e.max_running, e.max_waiting) + " per engine"
        for j in roomy:
            slot = self.engines[j]
            req.engine = j
            if slot.admissions.put(sub):
                self.router.record(j, hashes)
                self.metrics.engine_routed.labels(str(j), why if j == i else "load").inc()
                return slot
        return self._handoff_full()

    def _handoff_full(self) -> str:
        return (f"admission queue full ({self.engines[0].admissions.capacity} "
                f"requests{' per engine' if self.router else ''})")

    def _on_control(self, c: ControlRequest, addr: Address, now: float) -> None:
        if c.msg_type == MsgType.PING:
            self.send(c.signer.pong(c.timestamp_us, self.wall_us(), self.state()), addr)
            return
        e = self.cache.get(c.cache_key)
        if e is None:
            return  # unknown request: stay silent (docs/PROTOCOL.md)
        self.cache.touch(c.cache_key)
        req = self.in_flight.get(c.cache_key) if e.status is EntryStatus.RUNNING else None
        if req is not None:
            req.addr = addr
        if c.msg_type == MsgType.CANCEL and req is not None:
            self.streams.cancel(req, CancelReason.CLIENT, now)
            return
        # RESEND (or keepalive), or CANCEL of a finished request
        from_seq = c.from_seq if c.msg_type == MsgType.RESEND else NO_SEQ
        frames = e.frames_from(from_seq, RESEND_LIMIT) if from_seq != NO_SEQ else []
        for f in frames:
            self.send(f, addr)
        if not frames:
            state = RunState.RUNNING if e.status is EntryStatus.RUNNING else RunState.FINISHED
            self.send(c.signer.ack(e.next_seq, e.run_id, state, self.lease_ms), addr)
