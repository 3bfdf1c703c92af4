"""The daemon's datagram-to-frame path on a fake clock, through Front alone: admission,
refusal, a client's retry, a duplicate, CANCEL, drain and lease expiry, and the engine's
events, with no socket, no thread and no sleep. The engine is its admissions hand-off, read
here, and events built here; everything else is the daemon's own (ingress, keys, replay
guard, result cache, in-flight record, metrics), fed datagrams signed as a client signs them.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import pytest

from zerolayer.daemon.auth import KeyStore, ReplayConfig, ReplayGuard
from zerolayer.daemon.config import DaemonConfig
from zerolayer.daemon.engines import EngineSlot
from zerolayer.daemon.front import Front
from zerolayer.daemon.handoff import Handoff
from zerolayer.daemon.in_flight import InFlight
from zerolayer.daemon.ingress import Ingress
from zerolayer.daemon.ops.metrics import Metrics
from zerolayer.daemon.reassembly import Reassembler
from zerolayer.daemon.request import AcceptedEvent, Admitted, DoneEvent, TextEvent
from zerolayer.daemon.result_cache import ResultCache
from zerolayer.protocol import wire
from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.sampling_params import SamplingParams
from zerolayer.protocol.wire import (
    NO_SEQ,
    AckFrame,
    DoneFrame,
    ErrorFrame,
    FinishReason,
    MsgType,
    PayloadKind,
    PongFrame,
    Response,
    RunState,
    ServerState,
    Timings,
    TokenFrame,
    Usage,
)

KEY = 7
SECRET = bytes(range(32))
ADDR = ("192.0.2.1", 40000)
WALL0 = 1_800_000_000.0   # the fake wall clock's start (s since the epoch)


@dataclass
class Clock:
    mono: float = 1000.0

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> float:
        return WALL0 + self.mono


@dataclass
class Daemon:
    """Front with what the server would wire around it, and the client's view of replies."""
    clock: Clock
    front: Front
    slot: EngineSlot
    cache: ResultCache
    in_flight: InFlight
    draining: list[bool] = field(default_factory=lambda: [False])

    def send(self, datagrams: list[bytes] | bytes, addr: tuple = ADDR) -> list[Response]:
        out = []
        for dg in [datagrams] if isinstance(datagrams, bytes) else datagrams:
            out += self.front.receive(dg, addr, self.clock.mono)
        assert all(a == addr for _, a in out)
        return [wire.decode_response(f, SECRET) for f, _ in out]

    def engine_takes(self) -> list[Admitted]:
        """What the engine is handed: each admitted request (its body beside it)."""
        return [sub.admitted for sub in self.slot.admissions.drain()]

    def event(self, ev: object) -> list[Response]:
        return [wire.decode_response(f, SECRET)
                for f, _ in self.front.on_event(ev, self.clock.mono)]  # type: ignore[arg-type]


@pytest.fixture
def d() -> Daemon:
    clock = Clock()
    cfg = DaemonConfig()
    cfg.engine.max_running, cfg.engine.max_waiting = 1, 1     # room for two requests
    cfg.cache.lease_s = 5.0
    cache = ResultCache(clock=clock.monotonic)
    in_flight = InFlight(cache, 1)
    slot = EngineSlot(0, None, Handoff(cfg.engine.queue_depth, "admissions"),
                      Handoff(64, "events"))
    draining = [False]
    ingress = Ingress(KeyStore(keys={KEY: SECRET}),
                      ReplayGuard(ReplayConfig(), clock=clock.wall),
                      Reassembler(clock=clock.monotonic),
                      wall_clock=clock.wall, monotonic=clock.monotonic,
                      refuses_new=lambda: draining[0], context_len=lambda: 2048,
                      is_known=lambda key: cache.get(key) is not None)
    front = Front(cfg, ingress, in_flight, [slot], Metrics(),
                  lambda: ServerState.DRAINING if draining[0] else ServerState.READY,
                  wall_us=lambda: int(clock.wall() * 1e6))
    return Daemon(clock, front, slot, cache, in_flight, draining)


def invoke(d: Daemon, rid: bytes, prompt: str = "The capital of France is") -> list[bytes]:
    """A client's INVOKE (a retry is the same request id with a fresh nonce)."""
    body = wire.encode_invoke_body(SamplingParams(max_tokens=8), PayloadKind.PROMPT,
                                   prompt.encode())
    return wire.encode_invoke(KEY, SECRET, rid, int(d.clock.wall() * 1e6),
                              secrets.token_bytes(32), body)


def control(d: Daemon, mt: MsgType, rid: bytes, arg: int = 0) -> bytes:
    return wire.encode_control(mt, KEY, SECRET, rid, int(d.clock.wall() * 1e6),
                               secrets.token_bytes(32), arg)


def test_ping_is_answered_with_the_clock_passed_in(d: Daemon) -> None:
    (pong,) = d.send(control(d, MsgType.PING, secrets.token_bytes(16)))
    assert isinstance(pong, PongFrame)
    assert pong.server_time_us == int(d.clock.wall() * 1e6)


def test_an_invoke_is_acked_and_handed_to_the_engine_then_streamed(d: Daemon) -> None:
    rid = secrets.token_bytes(16)
    (ack,) = d.send(invoke(d, rid))
    assert isinstance(ack, AckFrame) and ack.state is RunState.QUEUED and ack.next_seq == 0
    (req,) = d.engine_takes()             # in the hand-off before the ACK came back
    assert req.key == (KEY, rid) and len(d.in_flight) == 1
    d.clock.mono += 0.25
    assert d.event(AcceptedEvent(req, 6, 100)) == []
    (tok,) = d.event(TextEvent(req, " Paris", 1))
    assert isinstance(tok, TokenFrame) and (tok.seq, tok.text) == (0, " Paris")
    d.clock.mono += 0.125
    (done,) = d.event(DoneEvent(req, FinishReason.STOP, Usage(6, 0, 1), Timings()))
    assert isinstance(done, DoneFrame) and done.seq == 1
    assert done.timings.total_us == 375_000         # first datagram -> DONE, on this clock
    assert len(d.in_flight) == 0
    # a RESEND from seq 0 is answered from the result cache, the model never runs again
    assert [f.seq for f in d.send(control(d, MsgType.RESEND, rid, 0))] == [0, 1]  # type: ignore[union-attr]


def test_a_retry_attaches_to_the_running_request_and_a_late_one_replays(d: Daemon) -> None:
    rid = secrets.token_bytes(16)
    d.send(invoke(d, rid))
    (req,) = d.engine_takes()
    d.event(TextEvent(req, " Paris", 1))
    # the client's new socket: the ACK says where the run is, and what was framed follows
    ack, tok = d.send(invoke(d, rid), addr=("192.0.2.1", 40001))
    assert isinstance(ack, AckFrame) and ack.state is RunState.RUNNING and ack.next_seq == 1
    assert isinstance(tok, TokenFrame) and tok.seq == 0
    assert d.engine_takes() == []                                  # not run twice
    out = d.front.on_event(TextEvent(req, ".", 1), d.clock.mono)
    assert [a for _, a in out] == [("192.0.2.1", 40001)]           # frames follow the client
    d.event(DoneEvent(req, FinishReason.STOP, Usage(6, 0, 2), Timings()))
    replay = d.send(invoke(d, rid))
    assert [type(f) for f in replay] == [TokenFrame, TokenFrame, DoneFrame]
    assert d.engine_takes() == []


def test_a_full_engine_refuses_with_overloaded_and_a_retry_is_admitted_afresh(d: Daemon) -> None:
    held = [secrets.token_bytes(16) for _ in range(2)]
    for rid in held:
        d.send(invoke(d, rid))
    reqs = d.engine_takes()
    assert len(reqs) == 2
    rid = secrets.token_bytes(16)
    (err,) = d.send(invoke(d, rid))
    assert isinstance(err, ErrorFrame) and err.code == ErrorCode.OVERLOADED
    assert (err.seq, err.run_id) == (NO_SEQ, 0)      # refused before it started
    d.event(DoneEvent(reqs[0], FinishReason.STOP, Usage(6, 0, 0), Timings()))
    (ack,) = d.send(invoke(d, rid))                  # room again: the retry runs
    assert isinstance(ack, AckFrame) and ack.state is RunState.QUEUED
    assert [r.key[1] for r in d.engine_takes()] == [rid]


def test_cancel_ends_the_stream_at_once_and_drops_the_engines_late_tokens(d: Daemon) -> None:
    rid = secrets.token_bytes(16)
    d.send(invoke(d, rid))
    (req,) = d.engine_takes()
    d.event(AcceptedEvent(req, 6, 100))
    d.event(TextEvent(req, " Paris", 1))
    (done,) = d.send(control(d, MsgType.CANCEL, rid))
    assert isinstance(done, DoneFrame) and done.finish_reason is FinishReason.CANCELLED
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (6, 1)
    assert req.cancel.reason is not None              # the engine frees it at its next step
    assert d.event(TextEvent(req, ".", 1)) == []     # a step in flight: never sent
    assert d.event(DoneEvent(req, FinishReason.STOP, Usage(6, 0, 2), Timings())) == []


def test_drain_refuses_new_work_serves_retries_and_tells_the_rest(d: Daemon) -> None:
    rid = secrets.token_bytes(16)
    d.send(invoke(d, rid))
    (req,) = d.engine_takes()
    d.draining[0] = True
    (err,) = d.send(invoke(d, secrets.token_bytes(16)))
    assert isinstance(err, ErrorFrame) and err.code == ErrorCode.DRAINING
    (ack,) = d.send(invoke(d, rid))                  # being served: not new work
    assert isinstance(ack, AckFrame) and ack.state is RunState.RUNNING
    (pong,) = d.send(control(d, MsgType.PING, secrets.token_bytes(16)))
    assert isinstance(pong, PongFrame) and pong.state is ServerState.DRAINING
    (last,) = [wire.decode_response(f, SECRET) for f, _ in d.front.drain(d.clock.mono)]
    assert isinstance(last, ErrorFrame) and last.code == ErrorCode.CANCELLED
    assert len(d.in_flight) == 0 and req.cancel.reason is not None


def test_a_silent_clients_lease_expires_and_a_keepalive_renews_it(d: Daemon) -> None:
    quiet, talking = secrets.token_bytes(16), secrets.token_bytes(16)
    d.send(invoke(d, quiet))
    d.send(invoke(d, talking))
    d.engine_takes()
    d.clock.mono += 4.0
    (ack,) = d.send(control(d, MsgType.RESEND, talking, NO_SEQ))   # keepalive
    assert isinstance(ack, AckFrame) and ack.state is RunState.RUNNING
    assert d.front.tick(d.clock.mono) == []          # 4 s: both within the 5 s lease
    d.clock.mono += 2.0
    out = d.front.tick(d.clock.mono)                 # 6 s for one, 2 s for the other
    (err,) = [wire.decode_response(f, SECRET) for f, _ in out]
    assert isinstance(err, ErrorFrame) and err.code == ErrorCode.CANCELLED
    assert err.request_id == quiet
    assert [r.key[1] for r in d.in_flight] == [talking]


def test_a_fragmented_invoke_is_admitted_when_its_last_fragment_arrives(d: Daemon) -> None:
    """ingress_us is reassembly: first datagram received -> the one that completed the body."""
    rid = secrets.token_bytes(16)
    body = wire.encode_invoke_body(SamplingParams(max_tokens=8), PayloadKind.PROMPT,
                                   ("Once upon a time " * 40).encode())
    frags = wire.encode_invoke(KEY, SECRET, rid, int(d.clock.wall() * 1e6),
                               secrets.token_bytes(32), body, wire.MIN_CHUNK)
    assert len(frags) >= 3
    assert d.send(frags[:-1]) == [] and d.engine_takes() == []     # buffered, not admitted
    d.clock.mono += 0.25
    (ack,) = d.send(frags[-1])
    assert isinstance(ack, AckFrame) and ack.state is RunState.QUEUED
    (req,) = d.engine_takes()
    (done,) = d.event(DoneEvent(req, FinishReason.LENGTH, Usage(80, 0, 8), Timings()))
    assert isinstance(done, DoneFrame) and done.timings.ingress_us == 250_000
