"""The error conformance table (docs/PROTOCOL.md §5.3, §7): for every error code and every
point where it can arise, what the client sees and what the daemon counts, checked against a
real zerolayerd in one parametrized test.

Points:
  io      the I/O thread refuses it before admission: no ACK; ERROR seq 0xFFFFFFFF, run 0
  engine  the engine ends it before its first token. Refused before the engine accepted it
          (a text over the context, an id outside the vocabulary): after the ACK, framed as
          never started (seq 0xFFFFFFFF, run 0). Failed after it was accepted (its lease
          ran out while it waited, a forward pass failed): in its stream, seq 0, its run id
  stream  mid-stream, after TOKEN frames: ERROR seq = the frames before it, its run id

Counters: `zerolayer_request_errors_total{code}` moves for every row;
`zerolayer_model_runs_total` only for a request that started (the engine accepted it);
`zerolayer_requests_total{outcome="error"}` only for a request that was admitted (ACKed).

The daemon holds 1 running + 1 waiting request (`--engine-max-*`), and the engine is held at
a step boundary (daemon/test_hooks.py) or made to fail a step (daemon/fault_hooks.py)
wherever a row needs a state: nothing here bets on the machine's speed.
"""
from __future__ import annotations

import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from daemon_proc import DaemonProc, Hooks
from raw_peer import RawPeer
from zerolayer.daemon.ops import control
from zerolayer.protocol import wire
from zerolayer.protocol.constraint import Constraint, ConstraintKind
from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.wire import MsgType, PayloadKind, SamplingParams

LEASE_S = 2.0
VOCAB = 49152  # the bundled model's
COUNT = b"Count: 1, 2, 3,"


@dataclass
class Ctx:
    d: DaemonProc
    raw: RawPeer
    hooks: Hooks
    ctl: str
    cleanup: list = field(default_factory=list)   # request ids to cancel after the row
    undo: list = field(default_factory=list)      # calls that put the daemon back
    mark: Callable[[], None] = lambda: None       # the row's counters start from here


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zl-conformance")
    hooks = Hooks(tmp / "hooks")
    ctl = str(tmp / "control.sock")
    d = DaemonProc(tmp, "--engine-max-running", "1", "--engine-max-waiting", "1",
                   "--cache-lease-s", str(LEASE_S), "--control-socket", ctl,
                   env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    raw = RawPeer(d.addr, d.key_id, d.secret)
    try:
        yield Ctx(d, raw, hooks, ctl)
    finally:
        raw.close()
        hooks.release()
        assert d.stop() == 0


def body(kind: PayloadKind, payload: bytes, max_tokens: int = 8) -> bytes:
    return wire.encode_invoke_body(SamplingParams(max_tokens=max_tokens), kind, payload)


def ids(n: int, first: int = 1) -> bytes:
    return wire.encode_token_ids(range(first, first + n))


def first_token(c: Ctx, rid: bytes) -> None:
    c.raw.wait(rid, lambda fs: any(isinstance(f, wire.TokenFrame) for f in fs),
               what="a first token")


# -- the scenarios: each makes one request end with its row's error and returns its id ----
def bad_signature(c: Ctx) -> bytes:
    return c.raw.invoke(body(PayloadKind.PROMPT, b"Hi"), secret=secrets.token_bytes(32))


def old_timestamp(c: Ctx) -> bytes:
    return c.raw.invoke(body(PayloadKind.PROMPT, b"Hi"),
                        timestamp_us=(time.time_ns() // 1000) - 3600 * 10**6)


def replayed(c: Ctx) -> bytes:
    rid = secrets.token_bytes(16)
    dg = c.raw.control(rid, MsgType.PING)
    c.raw.wait(rid, lambda fs: fs, what="the PONG")
    c.raw.send([dg])
    return rid


def unknown_key(c: Ctx) -> bytes:
    return c.raw.invoke(body(PayloadKind.PROMPT, b"Hi"), key_id=99)


def bad_temperature(c: Ctx) -> bytes:
    b = bytearray(body(PayloadKind.PROMPT, b"Hi"))
    struct.pack_into("<f", b, 4, -1.0)
    return c.raw.invoke(bytes(b))


def id_outside_vocab(c: Ctx) -> bytes:
    return c.raw.invoke(body(PayloadKind.TOKEN_IDS, wire.encode_token_ids([1, VOCAB + 7])))


def too_many_messages(c: Ctx) -> bytes:
    chat = (wire.CHAT_MSG_HDR.pack(2, 1) + b"x") * (wire.MAX_CHAT_MESSAGES + 1)
    return c.raw.invoke(body(PayloadKind.CHAT, chat))


def ids_over_context(c: Ctx) -> bytes:
    return c.raw.invoke(body(PayloadKind.TOKEN_IDS, ids(2100), max_tokens=1))


def max_tokens_over_context(c: Ctx) -> bytes:
    return c.raw.invoke(body(PayloadKind.TOKEN_IDS, ids(200), max_tokens=2000))


def short_text_max_tokens_over(c: Ctx) -> bytes:
    return c.raw.invoke(body(PayloadKind.PROMPT, b"Hello", max_tokens=4000))


def long_text(c: Ctx) -> bytes:
    return c.raw.invoke(body(PayloadKind.PROMPT, b"word " * 2500))


def constrained(schema: str) -> Callable[[Ctx], bytes]:
    """A request whose response_format schema the engine refuses before it starts."""
    def make(c: Ctx) -> bytes:
        p = SamplingParams(max_tokens=8, constraint=Constraint(ConstraintKind.JSON_SCHEMA,
                                                               schema))
        return c.raw.invoke(wire.encode_invoke_body(p, PayloadKind.PROMPT, b"Hi"))
    return make


# Valid JSON 1,000 levels deep (json.loads itself overflows the interpreter's stack)
DEEP_SCHEMA = "[" * 1000 + "]" * 1000
# every value would hold itself: no finite one exists
CYCLIC_SCHEMA = '{"type":"object","properties":{"c":{"$ref":"#"}},"required":["c"]}'
# bounds past 64 bits, which the grammar would clamp to 2^63 - 1
HUGE_INTEGER_SCHEMA = ('{"type":"integer","minimum":1e40,'
                       '"maximum":10000000000000000000000000000000000000001}')


def wait_queue_full(c: Ctx) -> bytes:
    """One running + one waiting is all the engine holds: A taken by the held engine, B
    admitted behind it, C refused before admission."""
    runs = _counter(c.d, "zerolayer_model_runs_total")
    (c.hooks.dir / "hold").touch()
    a = c.raw.invoke(body(PayloadKind.PROMPT, COUNT, 64))
    c.raw.keep(a)
    c.hooks.hold(c.d)
    c.d.wait_for(lambda: _counter(c.d, "zerolayer_model_runs_total") == runs + 1,
                 what="A accepted")
    b = c.raw.invoke(body(PayloadKind.PROMPT, COUNT, 64))
    c.raw.keep(b)
    c.raw.wait(b, lambda fs: any(isinstance(f, wire.AckFrame) for f in fs), what="B's ACK")
    c.cleanup += [a, b]
    c.mark()                   # A's run is the setup's, not the row's
    return c.raw.invoke(body(PayloadKind.PROMPT, COUNT, 64))


def draining(c: Ctx) -> bytes:
    assert control.request(c.ctl, "drain")["ok"]
    c.undo.append(lambda: control.request(c.ctl, "undrain"))
    return c.raw.invoke(body(PayloadKind.PROMPT, b"Hi"))


def lease_before_first_token(c: Ctx) -> bytes:
    (c.hooks.dir / "hold").touch()
    a = c.raw.invoke(body(PayloadKind.PROMPT, COUNT, 64))
    c.raw.keep(a)
    c.hooks.hold(c.d)          # accepted, held before its first step
    c.raw.let_go(a)            # the client goes silent
    return a


def lease_mid_stream(c: Ctx) -> bytes:
    a = c.raw.invoke(body(PayloadKind.PROMPT, COUNT, 400))
    c.raw.keep(a)
    first_token(c, a)
    c.hooks.hold(c.d)
    c.raw.let_go(a)
    return a


def step_fails_before_first_token(c: Ctx) -> bytes:
    (c.hooks.dir / "fail-step").touch()
    return c.raw.invoke(body(PayloadKind.PROMPT, COUNT, 64))


def step_fails_mid_stream(c: Ctx) -> bytes:
    a = c.raw.invoke(body(PayloadKind.PROMPT, COUNT, 400))
    c.raw.keep(a)
    first_token(c, a)
    c.hooks.hold(c.d)
    (c.hooks.dir / "fail-step").touch()
    c.hooks.release()
    return a


PRE, STREAM = "pre-stream", "in-stream"


@dataclass(frozen=True)
class Row:
    code: ErrorCode
    point: str                       # io | engine | stream
    make: Callable[[Ctx], bytes]
    frame: str                       # PRE | STREAM
    ack: bool                        # an ACK came before the ERROR
    started: bool                    # a model run: zerolayer_model_runs_total + 1
    signed: bool = True
    more: dict = field(default_factory=dict)   # other counters and their moves
    cached: bool = False             # a duplicate INVOKE gets the same ERROR, nothing new


ROWS = {
    "invalid_signature@io": Row(ErrorCode.INVALID_SIGNATURE, "io", bad_signature, PRE,
                                ack=False, started=False, signed=False),
    "invalid_timestamp@io": Row(ErrorCode.INVALID_TIMESTAMP, "io", old_timestamp, PRE,
                                ack=False, started=False),
    "expired_nonce@io": Row(ErrorCode.EXPIRED_NONCE, "io", replayed, PRE,
                            ack=False, started=False),
    "unknown_key@io": Row(ErrorCode.UNKNOWN_KEY, "io", unknown_key, PRE,
                          ack=False, started=False, signed=False),
    "malformed@io": Row(ErrorCode.MALFORMED, "io", bad_temperature, PRE,
                        ack=False, started=False),
    "malformed@engine": Row(ErrorCode.MALFORMED, "engine", id_outside_vocab, PRE,
                            ack=True, started=False),
    "malformed@engine(deep schema)": Row(ErrorCode.MALFORMED, "engine",
                                         constrained(DEEP_SCHEMA), PRE, ack=True,
                                         started=False, cached=True),
    "malformed@engine(cyclic schema)": Row(ErrorCode.MALFORMED, "engine",
                                           constrained(CYCLIC_SCHEMA), PRE, ack=True,
                                           started=False, cached=True),
    "malformed@engine(huge integer bound)": Row(ErrorCode.MALFORMED, "engine",
                                                constrained(HUGE_INTEGER_SCHEMA), PRE,
                                                ack=True, started=False, cached=True),
    "payload_too_large@io": Row(ErrorCode.PAYLOAD_TOO_LARGE, "io", too_many_messages, PRE,
                                ack=False, started=False),
    "context_overflow@io(ids)": Row(ErrorCode.CONTEXT_OVERFLOW, "io", ids_over_context, PRE,
                                    ack=False, started=False),
    "context_overflow@io(ids, max_tokens)": Row(ErrorCode.CONTEXT_OVERFLOW, "io",
                                                max_tokens_over_context, PRE,
                                                ack=False, started=False),
    "context_overflow@io(text, max_tokens)": Row(ErrorCode.CONTEXT_OVERFLOW, "io",
                                                 short_text_max_tokens_over, PRE,
                                                 ack=False, started=False),
    "context_overflow@engine(text)": Row(ErrorCode.CONTEXT_OVERFLOW, "engine", long_text, PRE,
                                         ack=True, started=False),
    "overloaded@io(wait queue)": Row(ErrorCode.OVERLOADED, "io", wait_queue_full, PRE,
                                     ack=False, started=False,
                                     more={("zerolayer_overloaded_total",
                                            'bound="wait_queue"'): 1}),
    "draining@io": Row(ErrorCode.DRAINING, "io", draining, PRE, ack=False, started=False),
    "cancelled@engine(lease)": Row(ErrorCode.CANCELLED, "engine", lease_before_first_token,
                                   STREAM, ack=True, started=True),
    "cancelled@stream(lease)": Row(ErrorCode.CANCELLED, "stream", lease_mid_stream, STREAM,
                                   ack=True, started=True),
    "internal@engine(step fails)": Row(ErrorCode.INTERNAL, "engine",
                                       step_fails_before_first_token, STREAM,
                                       ack=True, started=True),
    "internal@stream(step fails)": Row(ErrorCode.INTERNAL, "stream", step_fails_mid_stream,
                                       STREAM, ack=True, started=True),
}


def test_every_code_has_a_row():
    """Every error code has a row. The sources left out, with where they are covered: the
    other OVERLOADED bounds (nonce cache, reassembly, result cache, the hand-off) refuse
    through the same pre-admission path as the wait queue (tests/test_dataplane.py has the
    hand-off's); an engine that dies fails its requests INTERNAL in their streams and ends
    the daemon, and a drain timeout cancels what runs and ends it too (both in
    tests/test_dataplane.py): neither leaves a daemon for the next row."""
    assert {r.code for r in ROWS.values()} == set(ErrorCode)


def _counter(d: DaemonProc, name: str, labels: str = "") -> float:
    try:
        return d.metric(name, labels)
    except KeyError:  # a labelled child appears with its first count
        return 0.0


def _counters(d: DaemonProc, row: Row) -> dict:
    keys = {("zerolayer_request_errors_total", f'code="{row.code.name}"'): 1,
            ("zerolayer_model_runs_total", ""): int(row.started),
            ("zerolayer_requests_total", 'outcome="error"'): int(row.ack), **row.more}
    return {k: (_counter(d, *k), move) for k, move in keys.items()}


def _check_frames(frames: list, row: Row) -> None:
    errors = [i for i, f in enumerate(frames) if isinstance(f, wire.ErrorFrame)]
    assert errors, frames
    err, before = frames[errors[0]], frames[:errors[0]]
    assert len(errors) == 1, frames                      # one last frame, never two
    assert err.code == row.code and err.signed == row.signed, err
    acks = [f for f in before if isinstance(f, wire.AckFrame)]
    tokens = [f for f in before if isinstance(f, wire.TokenFrame)]
    assert not any(isinstance(f, wire.DoneFrame) for f in before), frames
    if row.ack:
        assert acks and before[0] is acks[0] and acks[0].state == wire.RunState.QUEUED, frames
    else:
        assert not acks, frames
    if row.frame == PRE:
        assert (err.seq, err.run_id) == (wire.NO_SEQ, 0), err
        assert not tokens, frames
        return
    run = acks[0].run_id
    assert run and err.run_id == run and all(t.run_id == run for t in tokens), frames
    assert err.seq == len(tokens) == len({t.seq for t in tokens}), frames
    assert (len(tokens) > 0) == (row.point == "stream"), frames


def _check_cached(c: Ctx, rid: bytes, frames: list) -> None:
    """The same request again (same id, a fresh nonce, the body of a request that would be
    refused the same way): its stored ERROR comes back, with no ACK and no run."""
    runs = _counter(c.d, "zerolayer_model_runs_total")
    err = frames[-1]
    assert err.message.startswith("response_format: ") and "\n" not in err.message, err
    dgs = c.raw.invoke_datagrams(wire.encode_invoke_body(SamplingParams(max_tokens=8),
                                                         PayloadKind.PROMPT, b"Hi"), rid)[1]
    c.raw.send(dgs)
    again = c.raw.wait(rid, lambda fs: len(fs) > len(frames), what="the stored ERROR")
    time.sleep(0.3)   # anything else it would send has come by now
    new = c.raw.of(rid)[len(frames):]
    assert [type(f) for f in new] == [wire.ErrorFrame], again
    assert (new[0].code, new[0].message, new[0].seq, new[0].run_id) == \
        (err.code, err.message, wire.NO_SEQ, 0), new
    assert _counter(c.d, "zerolayer_model_runs_total") == runs


@pytest.mark.parametrize("name", list(ROWS))
def test_conformance(ctx, name):
    row = ROWS[name]
    c = ctx
    c.cleanup, c.undo = [], []
    before = _counters(c.d, row)
    c.mark = lambda: before.update(_counters(c.d, row))
    try:
        rid = row.make(c)
        frames = c.raw.wait_end(rid)
        want = {k: v + move for k, (v, move) in before.items()}
        # counters move on the daemon's own schedule (housekeeping every 0.25 s): wait for
        # every expected move, then check that none went further
        c.d.wait_for(lambda: all(_counter(c.d, *k) >= v for k, v in want.items()),
                     timeout=30, what=f"the counters of {name}")
        time.sleep(0.3)   # one housekeeping turn: a late move would show now
        got = {k: _counter(c.d, *k) for k in want}
        _check_frames(frames, row)
        assert got == want, (got, want)
        if row.cached:
            _check_cached(c, rid, frames)
    finally:
        (c.hooks.dir / "fail-step").unlink(missing_ok=True)
        c.hooks.release()
        for rid in c.cleanup:
            c.raw.let_go(rid)
            c.raw.control(rid, MsgType.CANCEL)
        for f in c.undo:
            f()
        c.d.wait_for(lambda: c.d.metric("zerolayer_requests_running") == 0
                     and c.d.metric("zerolayer_requests_waiting") == 0,
                     timeout=120, what="an idle engine")
