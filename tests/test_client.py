"""Client SDK mechanics against a tiny in-test UDP responder: retries with backoff (same
request id, fresh nonce), RESEND gap recovery, keepalives, error → exception mapping,
spoof resistance. Every scenario runs twice: with the sync Client and with the asyncio
AsyncClient (through tests/async_driven.py), which must behave the same. The responder uses
the real Ingress and ResultCache; the real daemon and model are exercised by the end-to-end
tests, not here.
"""
from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from async_driven import AsyncDriven
from zerolayer.client import AsyncClient, Client, InvokeResult
from zerolayer.daemon.auth import KeyStore, ReplayGuard
from zerolayer.daemon.ingress import ControlRequest, Ingress, InvokeRequest, Rejected
from zerolayer.daemon.reassembly import Reassembler
from zerolayer.daemon.result_cache import EntryStatus, ResultCache
from zerolayer.protocol import errors, wire
from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.wire import ChatMessage, FinishReason, MsgType, ResponseSigner, RunState, ServerState

KEY_ID = 11
SECRET = secrets.token_bytes(32)
USAGE = wire.Usage(prompt_tokens=7, cached_prompt_tokens=2, completion_tokens=3)
TIMINGS = wire.Timings(queue_us=5, prefill_us=900, decode_per_token_us=300, total_us=2000)


@dataclass
class Script:
    """What the fake daemon does. Defaults: a well-behaved server."""
    chunks: list[str] = field(default_factory=lambda: ["Par", "is", "."])
    # INVOKE attempts (counted per request) to ignore entirely, as if lost.
    drop_invokes: int = 0
    # Answer the first N INVOKE attempts with this signed error instead of running.
    error_code: ErrorCode | None = None
    error_times: int = 0
    # After those errors, say nothing more (a drained daemon that has exited).
    silent_after_errors: bool = False
    # Answer the first PING with this signed error, and later ones not at all.
    ping_error: ErrorCode | None = None
    # Sequence numbers whose first transmission is lost.
    lose_first_send: set[int] = field(default_factory=set)
    send_ack: bool = True
    lease_ms: int = 10_000
    # Hook to send extra datagrams (spoofs) right before the real stream.
    before_stream: Callable[[FakeDaemon, tuple], None] | None = None
    unsigned_error: ErrorCode | None = None
    hold_done: bool = False      # never send DONE until a CANCEL arrives
    resend_limit: int = 64       # frames sent per RESEND
    # With hold_done: after this many keepalives, finish with LENGTH but lose the DONE.
    finish_after_keepalives: int = 0


class ScriptedDaemon:
    """The fake daemon's logic without a socket: `handle` takes one datagram, `send` is how
    an answer leaves (a UDP socket in FakeDaemon, a list on the fake clock of
    tests/test_recovery_clock.py). Its time comes from `clock` (monotonic) and `wall`."""

    def __init__(self, script: Script, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.script = script
        self._clock = clock
        self._wall = wall
        self.ingress = self._ingress()
        self.cache = ResultCache(clock=clock)
        self.signers: dict[tuple, ResponseSigner] = {}  # per request: what signs its frames
        self.invokes: list[InvokeRequest] = []
        self.controls: list[ControlRequest] = []
        self.rejected: list[Rejected] = []
        self.runs = 0                      # times the "model" ran
        self.sent_once: set[int] = set()
        self.down = threading.Event()      # set: dead, every datagram is lost
        self.invoke_times: list[float] = []  # arrivals of INVOKE datagrams, dead or alive

    def _ingress(self) -> Ingress:
        return Ingress(KeyStore(keys={KEY_ID: SECRET}), ReplayGuard(clock=self._wall),
                       Reassembler(clock=self._clock), wall_clock=self._wall,
                       monotonic=self._clock)

    def restart(self, script: Script) -> None:
        """Come back as a fresh process: the result cache and the nonces are gone."""
        self.script = script
        self.ingress = self._ingress()
        self.cache = ResultCache(clock=self._clock)
        self.down.clear()

    def send(self, dg: bytes, addr: tuple) -> None:
        raise NotImplementedError

    def handle(self, dg: bytes, addr: tuple) -> None:
        if dg[5:6] == bytes([MsgType.INVOKE]):
            self.invoke_times.append(self._clock())
        if self.down.is_set():
            return
        r = self.ingress.feed(dg)
        if isinstance(r, Rejected):
            self.rejected.append(r)
            if r.reply:
                self.send(r.reply, addr)
        elif isinstance(r, InvokeRequest):
            self.invokes.append(r)
            self.on_invoke(r, addr)
        elif isinstance(r, ControlRequest):
            self.controls.append(r)
            self.on_control(r, addr)

    def on_invoke(self, r: InvokeRequest, addr: tuple) -> None:
        s = self.script
        if s.unsigned_error is not None:
            self.send(wire.encode_error(None, KEY_ID, r.request_id, s.unsigned_error, "no"),
                      addr)
            return
        if len(self.invokes) <= s.drop_invokes:
            return
        if s.error_code is not None and len(self.invokes) <= s.drop_invokes + s.error_times:
            self.send(r.signer.error(s.error_code, "scripted"), addr)
            return
        if s.silent_after_errors:
            return
        e = self.cache.lookup(r.cache_key)
        if e is not None:                  # duplicate: attach / replay, never run again
            self.cache.touch(r.cache_key)
            if s.send_ack:
                self.send(r.signer.ack(e.next_seq, e.run_id, RunState.RUNNING, s.lease_ms), addr)
            for f in e.frames:
                self.send(f, addr)
            return
        e = self.cache.start(r.cache_key)
        self.signers[r.cache_key] = r.signer
        self.runs += 1
        if s.send_ack:
            self.send(r.signer.ack(0, e.run_id, RunState.QUEUED, s.lease_ms), addr)
        if s.before_stream:
            s.before_stream(self, addr)
        for i, text in enumerate(s.chunks):
            self._emit(r.cache_key, r.signer.token(i, e.run_id, text, 1), i, addr)
        if not s.hold_done:
            self._finish(r.cache_key, FinishReason.STOP, addr)

    def _finish(self, key: tuple, reason: FinishReason, addr: tuple) -> None:
        e = self.cache.get(key)
        assert e is not None
        seq = e.next_seq
        signer = self.signers[key]
        self._emit(key, signer.done(seq, e.run_id, reason, USAGE, TIMINGS), seq, addr)
        self.cache.finish(key)

    def _emit(self, key: tuple, frame: bytes, seq: int, addr: tuple) -> None:
        self.cache.append(key, frame)
        if seq in self.script.lose_first_send and seq not in self.sent_once:
            self.sent_once.add(seq)
            return
        self.send(frame, addr)

    def on_control(self, r: ControlRequest, addr: tuple) -> None:
        if r.msg_type is MsgType.PING and self.script.ping_error is not None:
            if sum(c.msg_type is MsgType.PING for c in self.controls) == 1:
                self.send(r.signer.error(self.script.ping_error, "scripted"), addr)
            return
        if r.msg_type is MsgType.PING:
            self.send(r.signer.pong(r.timestamp_us, r.timestamp_us + 1, ServerState.READY), addr)
            return
        e = self.cache.get(r.cache_key)
        if e is None:
            return                         # unknown request: silence, the client re-sends
        self.cache.touch(r.cache_key)
        keepalives = sum(c.from_seq == wire.NO_SEQ for c in self.controls
                         if c.msg_type is MsgType.RESEND)
        if (self.script.finish_after_keepalives and e.status is EntryStatus.RUNNING
                and keepalives >= self.script.finish_after_keepalives):
            self.script.lose_first_send.add(e.next_seq)
            self._finish(r.cache_key, FinishReason.LENGTH, addr)
        if r.msg_type is MsgType.CANCEL:
            if e.status is EntryStatus.RUNNING:
                self._finish(r.cache_key, FinishReason.CANCELLED, addr)
            return
        frames = (e.frames_from(r.from_seq, limit=self.script.resend_limit)
                  if r.from_seq != wire.NO_SEQ else [])
        if frames:
            for f in frames:
                self.send(f, addr)
        else:
            state = RunState.RUNNING if e.status is EntryStatus.RUNNING else RunState.FINISHED
            self.send(r.signer.ack(e.next_seq, e.run_id, state, self.script.lease_ms), addr)


class FakeDaemon(ScriptedDaemon, threading.Thread):
    """ScriptedDaemon on a loopback UDP socket, in a thread of its own."""

    def __init__(self, script: Script) -> None:
        threading.Thread.__init__(self, daemon=True)
        ScriptedDaemon.__init__(self, script)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        # Like the real daemon: room for a whole 1 MiB request in the socket buffer.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.02)
        self.address = self.sock.getsockname()
        self._halt = threading.Event()

    def __enter__(self) -> FakeDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self.join(2)
        self.sock.close()

    def send(self, dg: bytes, addr: tuple) -> None:
        self.sock.sendto(dg, addr)

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                dg, addr = self.sock.recvfrom(2048)
            except (TimeoutError, OSError):
                continue
            self.handle(dg, addr)


FLAVOUR = ["sync"]


@pytest.fixture(autouse=True, params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> None:
    """Which SDK _client() builds for this run of a scenario."""
    FLAVOUR[0] = request.param


def _client(d: FakeDaemon, **kw: object) -> Client:
    opts = dict(timeout=5.0, ack_timeout_s=0.05, backoff_initial_s=0.01, backoff_max_s=0.2,
                probe_interval_s=0.05, contact_timeout_s=1.0)
    opts.update(kw)
    if FLAVOUR[0] == "async":
        return AsyncDriven(AsyncClient(d.address, KEY_ID, SECRET.hex(),  # type: ignore[return-value]
                                       **opts))  # type: ignore[arg-type]
    return Client(d.address, KEY_ID, SECRET.hex(), **opts)  # type: ignore[arg-type]


def test_invoke_returns_text_usage_timings() -> None:
    with FakeDaemon(Script()) as d:
        res = _client(d).invoke(prompt="The capital of France is", max_tokens=3)
    assert isinstance(res, InvokeResult)
    assert res.text == "Paris." and res.finish_reason == "stop"
    assert res.usage == USAGE and res.timings == TIMINGS
    assert res.attempts == 1 and d.runs == 1 and res.ttft_s is not None
    inv = d.invokes[0]
    assert inv.body.prompt == "The capital of France is" and inv.body.params.max_tokens == 3


def test_stream_yields_chunks_in_order_then_result() -> None:
    with FakeDaemon(Script(chunks=["a", "b", "", "c"])) as d:
        with _client(d).stream(messages=[ChatMessage("user", "hi")]) as s:
            chunks = list(s)
    assert chunks == ["a", "b", "c"]              # empty chunks are not yielded
    assert s.result is not None and s.result.text == "abc"
    assert d.invokes[0].body.messages == (ChatMessage("user", "hi"),)


def test_lost_invoke_is_retried_with_same_request_id_and_fresh_nonce() -> None:
    audit: list[tuple[bytes, bytes, int]] = []
    with FakeDaemon(Script(drop_invokes=2)) as d:
        res = _client(d, audit_log_hook=lambda p, s, t: audit.append((p, s, t))).invoke(
            prompt="x")
    assert res.text == "Paris." and res.attempts == 3
    assert len({i.request_id for i in d.invokes}) == 1
    assert len({i.nonce for i in d.invokes}) == 3
    # The hook ran before each attempt: same payload hash, a new signature each time.
    assert len(audit) == 3 and len({a[0] for a in audit}) == 1 and len({a[1] for a in audit}) == 3
    assert audit[0][0] == d.invokes[0].body_sha256
    assert all(len(a[0]) == 32 and len(a[1]) == 32 for a in audit)


def test_retry_of_running_request_attaches_instead_of_rerunning() -> None:
    # The ACK and the first frames are lost: the client retries, and the daemon's cache
    # replays the stream rather than running the model again.
    with FakeDaemon(Script(send_ack=False, lose_first_send={0, 1, 2, 3})) as d:
        res = _client(d).invoke(prompt="x")
    assert res.text == "Paris." and d.runs == 1 and len(d.invokes) >= 2


@pytest.mark.parametrize("resend_limit,expect", [(64, [1]), (1, [1, 4, 5])])
def test_lost_token_frames_are_recovered_with_resend(resend_limit: int,
                                                     expect: list[int]) -> None:
    # With a generous limit one RESEND(1) brings back everything from 1 on; with a limit of
    # one frame per RESEND each hole is asked for in turn.
    script = Script(chunks=list("abcdefgh"), lose_first_send={1, 4, 5},
                    resend_limit=resend_limit)
    with FakeDaemon(script) as d:
        res = _client(d).invoke(prompt="x")
    assert res.text == "abcdefgh" and d.runs == 1 and len(d.invokes) == 1
    resends = sorted({c.from_seq for c in d.controls if c.msg_type is MsgType.RESEND
                      and c.from_seq != wire.NO_SEQ})
    assert resends == expect


def test_lost_done_is_recovered_by_keepalive_probe() -> None:
    with FakeDaemon(Script(chunks=["a", "b"], lose_first_send={2})) as d:
        res = _client(d).invoke(prompt="x")
    assert res.text == "ab" and res.finish_reason == "stop"
    kinds = [(c.msg_type, c.from_seq) for c in d.controls]
    assert (MsgType.RESEND, wire.NO_SEQ) in kinds     # the probe, answered by ACK(next_seq=3)
    assert (MsgType.RESEND, 2) in kinds               # then the gap fill


def test_forged_frames_are_ignored() -> None:
    def spoof(d: FakeDaemon, addr: tuple) -> None:
        rid = d.invokes[-1].request_id
        d.send(wire.encode_token(secrets.token_bytes(32), KEY_ID, rid, 0, 1, "EVIL", 1), addr)
        d.send(wire.encode_error(None, KEY_ID, rid, ErrorCode.OVERLOADED, "spoof"), addr)
        d.send(wire.encode_error(None, KEY_ID, rid, ErrorCode.UNKNOWN_KEY, "spoof"), addr)
    with FakeDaemon(Script(before_stream=spoof)) as d:
        res = _client(d).invoke(prompt="x")
    assert res.text == "Paris."


@pytest.mark.parametrize("code", [c for c in ErrorCode if not errors.ERROR_INFO[c].retryable])
def test_each_final_error_code_raises_its_exception(code: ErrorCode) -> None:
    with FakeDaemon(Script(error_code=code, error_times=99)) as d:
        with pytest.raises(errors.EXCEPTION_FOR_CODE[code]) as ei:
            _client(d).invoke(prompt="x")
    assert ei.value.code is code and ei.value.request_id == d.invokes[0].request_id
    assert len(d.invokes) == 1                         # not retried


@pytest.mark.parametrize("code", [c for c in ErrorCode if errors.ERROR_INFO[c].retryable])
def test_retryable_errors_back_off_then_succeed_or_raise(code: ErrorCode) -> None:
    with FakeDaemon(Script(error_code=code, error_times=2)) as d:
        res = _client(d).invoke(prompt="x")
    assert res.text == "Paris." and res.attempts == 3
    assert len({i.request_id for i in d.invokes}) == 1
    with FakeDaemon(Script(error_code=code, error_times=99)) as d:
        with pytest.raises(errors.EXCEPTION_FOR_CODE[code]):
            _client(d, max_attempts=3).invoke(prompt="x")
    assert len(d.invokes) == 3


def test_a_refusal_followed_by_silence_raises_the_refusal_not_a_timeout() -> None:
    """DRAINING, then the daemon exits: the caller learns it was draining."""
    with FakeDaemon(Script(error_code=ErrorCode.DRAINING, error_times=1,
                           silent_after_errors=True)) as d:
        with pytest.raises(errors.DrainingError):
            _client(d, timeout=0.5).invoke(prompt="x")
        assert len(d.invokes) >= 2  # it did retry, and nothing answered
    with FakeDaemon(Script(ping_error=ErrorCode.DRAINING)) as d:
        with pytest.raises(errors.DrainingError):
            _client(d, timeout=0.5).ping()
        assert sum(c.msg_type is MsgType.PING for c in d.controls) >= 2


@pytest.mark.parametrize("code", sorted(errors.EXCEPTION_FOR_CODE))
def test_unsigned_errors_are_believed_only_for_pre_auth_codes(code: ErrorCode) -> None:
    with FakeDaemon(Script(unsigned_error=code)) as d:
        c = _client(d, timeout=0.6, max_attempts=2)
        if code in (ErrorCode.UNKNOWN_KEY, ErrorCode.INVALID_SIGNATURE, ErrorCode.MALFORMED):
            with pytest.raises(errors.EXCEPTION_FOR_CODE[code]):
                c.invoke(prompt="x")
        else:
            with pytest.raises(errors.ZerolayerTimeoutError):
                c.invoke(prompt="x")


def test_wrong_secret_gets_invalid_signature() -> None:
    with FakeDaemon(Script()) as d:
        c = Client(d.address, KEY_ID, secrets.token_bytes(32), timeout=2.0)
        with pytest.raises(errors.InvalidSignatureError):
            c.invoke(prompt="x")
        c = Client(d.address, KEY_ID + 1, SECRET, timeout=2.0)
        with pytest.raises(errors.UnknownKeyError):
            c.invoke(prompt="x")


def test_silent_server_times_out() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    try:
        c = Client(s.getsockname(), KEY_ID, SECRET, timeout=0.3, ack_timeout_s=0.02)
        with pytest.raises(errors.ZerolayerTimeoutError):
            c.invoke(prompt="x")
        with pytest.raises(TimeoutError):             # also a builtin TimeoutError
            c.ping()
    finally:
        s.close()


def test_new_run_after_text_was_delivered_raises_stream_restarted() -> None:
    # The daemon "restarts" mid-stream: the rest of the frames and the DONE are lost, the
    # cache entry is gone, and the client's re-sent INVOKE starts a different run.
    script = Script(chunks=["a", "b"], lose_first_send={1, 2})
    with FakeDaemon(script) as d:
        c = _client(d, contact_timeout_s=0.2)
        s = c.stream(prompt="x")
        assert next(s) == "a"
        old = d.cache
        for _ in range(500):                           # let the first run finish there
            if old.stats["finished"]:
                break
            threading.Event().wait(0.01)
        d.cache = ResultCache()                        # the restart: state lost
        script.lose_first_send = set()
        d.controls.clear()
        with pytest.raises(errors.StreamRestartedError):
            list(s)
    assert d.runs == 2


def test_cancel_ends_with_done_cancelled() -> None:
    with FakeDaemon(Script(chunks=["a"], hold_done=True)) as d:
        s = _client(d).stream(prompt="x")
        assert next(s) == "a"
        res = s.cancel()
    assert res is not None and res.finish_reason == "cancelled" and res.text == "a"
    assert any(c.msg_type is MsgType.CANCEL for c in d.controls)


def test_leaving_a_stream_early_sends_cancel() -> None:
    with FakeDaemon(Script(chunks=["a", "b"], hold_done=True)) as d:
        with _client(d).stream(prompt="x") as s:
            next(s)
        for _ in range(100):
            if any(c.msg_type is MsgType.CANCEL for c in d.controls):
                break
            threading.Event().wait(0.01)
    assert any(c.msg_type is MsgType.CANCEL for c in d.controls)


def test_keepalives_renew_the_lease_while_waiting() -> None:
    # A run that outlasts several lease quarters with no output: the client must keep
    # renewing its lease; when DONE then gets lost, the next keepalive's ACK reveals it.
    script = Script(chunks=[], hold_done=True, lease_ms=200, finish_after_keepalives=3)
    with FakeDaemon(script) as d:
        res = _client(d, probe_interval_s=10.0).invoke(prompt="x")   # lease-driven only
    keepalives = [c for c in d.controls if c.from_seq == wire.NO_SEQ]
    assert len(keepalives) >= 3
    assert res.finish_reason == "length" and d.runs == 1


def test_timeout_is_inactivity_not_total_time() -> None:
    # The run lasts many times `timeout`, but the daemon answers every keepalive.
    script = Script(chunks=["a"], hold_done=True, lease_ms=100, finish_after_keepalives=12)
    with FakeDaemon(script) as d:
        res = _client(d, timeout=0.15, probe_interval_s=10.0).invoke(prompt="x")
    assert res.text == "a" and res.finish_reason == "length"
    with FakeDaemon(Script(chunks=["a"], hold_done=True, lease_ms=100)) as d:
        with pytest.raises(errors.ZerolayerTimeoutError, match="total_timeout"):
            _client(d, timeout=5.0, total_timeout=0.3).invoke(prompt="x")


def test_ping_measures_a_round_trip() -> None:
    with FakeDaemon(Script()) as d:
        rtt = _client(d).ping()
    assert isinstance(rtt, float) and rtt > 0
    assert d.controls[0].msg_type is MsgType.PING


def test_local_validation_before_sending() -> None:
    with FakeDaemon(Script()) as d:
        c = _client(d)
        with pytest.raises(errors.PayloadTooLargeError):
            c.invoke(prompt="x" * (wire.MAX_MESSAGE_BYTES + 1))
        with pytest.raises(errors.MalformedError):
            c.invoke(prompt="x", top_p=0.0)
        with pytest.raises(ValueError):
            c.invoke(prompt="x", messages=[ChatMessage("user", "y")])
        with pytest.raises(ValueError):
            c.invoke(prompt="x", request_id=b"short")
        assert "secret" not in repr(c) and SECRET.hex() not in repr(c)
    assert d.ingress.stats["datagrams"] == 0


def test_large_prompt_travels_in_fragments() -> None:
    prompt = "é" * 100_000                               # 200 kB: ~160 fragments
    with FakeDaemon(Script()) as d:
        res = _client(d).invoke(prompt=prompt, request_id="00" * 16)
    assert res.text == "Paris." and d.invokes[0].body.prompt == prompt
    assert d.invokes[0].fragments > 100 and res.request_id == bytes(16)


def test_audit_hook_failure_sends_nothing() -> None:
    def refuse(payload: bytes, signature: bytes, timestamp: int) -> None:
        raise RuntimeError("audit log unavailable")
    with FakeDaemon(Script()) as d:
        with pytest.raises(RuntimeError, match="audit log"):
            _client(d, audit_log_hook=refuse).invoke(prompt="x")
        threading.Event().wait(0.05)
    assert d.ingress.stats["datagrams"] == 0

