"""The ingress pipeline (daemon/ingress.py): every error code the protocol layer can produce,
each from a real bad input, and the order of checks that keeps strangers from making the
daemon allocate. (CANCELLED and INTERNAL come from the daemon's engine side: lease expiry is
tested in test_result_cache.py, INTERNAL is the daemon's own failure.)
"""
from __future__ import annotations

import hashlib
import random
import secrets

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerolayer.daemon.auth import KeyStore, ReplayConfig, ReplayGuard
from zerolayer.daemon.ingress import ControlRequest, Ingress, InvokeRequest, Pending, Rejected
from zerolayer.daemon.reassembly import Reassembler
from zerolayer.protocol import wire
from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.wire import ChatMessage, MsgType, PayloadKind, SamplingParams

KEY_ID = 3
SECRET = secrets.token_bytes(32)
OTHER = secrets.token_bytes(32)
NOW = 1_700_000_000.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clocks() -> tuple[Clock, Clock]:
    return Clock(NOW), Clock(50.0)


def _ingress(clocks: tuple[Clock, Clock], **kw: object) -> Ingress:
    wall, mono = clocks
    budget = kw.pop("budget", 64 << 20)
    capacity = kw.pop("capacity", 1000)
    # per-key shares: the whole cache/budget unless a test asks for the default (0 = half)
    share = kw.pop("per_key_share", True)
    return Ingress(KeyStore(keys={KEY_ID: SECRET, 4: OTHER}),
                   ReplayGuard(ReplayConfig(capacity=capacity,  # type: ignore[arg-type]
                                            per_key=capacity if share else 0), clock=wall),
                   Reassembler(budget_bytes=budget, timeout_s=5.0,  # type: ignore[arg-type]
                               per_key_bytes=budget if share else 0, clock=mono),
                   wall_clock=wall, monotonic=mono, **kw)  # type: ignore[arg-type]


def _body(prompt: str = "The capital of France is", **params: object) -> bytes:
    return wire.encode_invoke_body(SamplingParams(**params), PayloadKind.PROMPT,  # type: ignore[arg-type]
                                   prompt.encode())


def _invoke(body: bytes | None = None, *, key_id: int = KEY_ID, secret: bytes = SECRET,
            rid: bytes | None = None, ts: float = NOW, nonce: bytes | None = None,
            chunk_len: int = wire.MAX_CHUNK) -> list[bytes]:
    return wire.encode_invoke(key_id, secret, rid or secrets.token_bytes(16), int(ts * 1e6),
                              nonce or secrets.token_bytes(32),
                              _body() if body is None else body, chunk_len)


def _control(mt: MsgType, arg: int = 0, *, rid: bytes = b"r" * 16, ts: float = NOW,
             nonce: bytes | None = None) -> bytes:
    return wire.encode_control(mt, KEY_ID, SECRET, rid, int(ts * 1e6),
                               nonce or secrets.token_bytes(32), arg)


def _rejected(r: object, code: ErrorCode) -> Rejected:
    assert isinstance(r, Rejected), r
    assert r.code is code, (r.code, r.message)
    return r


def _signed_reply(r: Rejected, code: ErrorCode) -> None:
    assert r.reply is not None and r.authenticated
    f = wire.decode_response(r.reply, SECRET)          # verifies the tag
    assert isinstance(f, wire.ErrorFrame) and f.signed and f.code == code
    assert f.request_id == r.request_id


# --- the happy paths -----------------------------------------------------------------------

def test_single_fragment_invoke_is_verified_and_decoded(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    rid = secrets.token_bytes(16)
    body = _body(max_tokens=5, stop=("\n",))
    r = ing.feed(_invoke(body, rid=rid)[0])
    assert isinstance(r, InvokeRequest)
    assert (r.key_id, r.request_id, r.cache_key) == (KEY_ID, rid, (KEY_ID, rid))
    assert r.body.prompt == "The capital of France is" and r.body.params.max_tokens == 5
    assert r.body_sha256 == hashlib.sha256(body).digest() and r.fragments == 1
    assert r.received_at == 50.0
    # The signer answers with the request's key.
    tok = wire.decode_response(r.signer.token(0, 1, "Paris", 1), SECRET)
    assert isinstance(tok, wire.TokenFrame) and tok.text == "Paris" and tok.request_id == rid
    assert ing.stats["invokes"] == 1 and sum(ing.errors.values()) == 0


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.text(min_size=1500, max_size=6000), chunk=st.integers(256, 1252),
       seed=st.integers(0, 2**32))
def test_fragments_in_any_order_with_duplicates_give_one_request(
        clocks: tuple[Clock, Clock], prompt: str, chunk: int, seed: int) -> None:
    ing = _ingress(clocks)
    frags = _invoke(_body(prompt), chunk_len=chunk)
    rng = random.Random(seed)
    order = frags[:] + rng.sample(frags[:-1], k=min(3, len(frags) - 1))
    rng.shuffle(order)
    results = [ing.feed(f) for f in order]
    done = [r for r in results if isinstance(r, InvokeRequest)]
    assert len(done) == 1 and done[0].body.prompt == prompt
    assert done[0].fragments == len(frags)
    # Everything before completion is Pending; duplicates after it are refused as replays.
    first = results.index(done[0])
    assert all(isinstance(r, Pending) for r in results[:first])
    for r in results[first + 1:]:
        _rejected(r, ErrorCode.EXPIRED_NONCE)
    assert ing.reassembler.reserved_bytes == 0


def test_chat_and_token_id_payloads(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    msgs = [ChatMessage("user", "What is the capital of France?")]
    r = ing.feed(_invoke(wire.encode_invoke_body(SamplingParams(), PayloadKind.CHAT,
                                                 wire.encode_chat(msgs)))[0])
    assert isinstance(r, InvokeRequest) and r.body.messages == tuple(msgs)
    r = ing.feed(_invoke(wire.encode_invoke_body(SamplingParams(max_tokens=10),
                                                 PayloadKind.TOKEN_IDS,
                                                 wire.encode_token_ids([1, 2, 3])))[0])
    assert isinstance(r, InvokeRequest) and r.body.token_ids is not None
    assert r.body.token_ids.tolist() == [1, 2, 3]


def test_control_requests(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    for mt, arg in [(MsgType.CANCEL, 0), (MsgType.RESEND, 4), (MsgType.RESEND, wire.NO_SEQ),
                    (MsgType.PING, 0)]:
        r = ing.feed(_control(mt, arg))
        assert isinstance(r, ControlRequest) and r.msg_type is mt and r.from_seq == arg
    assert ing.stats["controls"] == 4


# --- every protocol-layer error from a real bad input ---------------------------------------

def test_truncated_datagram_is_malformed(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    dg = _invoke()[0]
    r = _rejected(ing.feed(dg[:-5]), ErrorCode.MALFORMED)
    assert not r.authenticated
    # The request id was readable, so a reply goes back: unsigned and no larger.
    assert r.reply is not None and len(r.reply) <= len(dg) - 5
    f = wire.decode_response(r.reply, SECRET)
    assert isinstance(f, wire.ErrorFrame) and not f.signed
    # Too short to carry a request id: silence.
    r = _rejected(ing.feed(dg[:20]), ErrorCode.MALFORMED)
    assert r.reply is None and r.request_id is None
    # A request id but fewer bytes than the smallest ERROR frame (76): silence too, or the
    # daemon would amplify spoofed traffic.
    r = _rejected(ing.feed(dg[:40]), ErrorCode.MALFORMED)
    assert r.request_id is not None and r.reply is None


def test_wrong_magic_is_malformed_and_unanswered(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    r = _rejected(ing.feed(b"HTTP" + _invoke()[0][4:]), ErrorCode.MALFORMED)
    assert r.reply is None and ing.stats["replies_suppressed"] == 1


def test_response_typed_datagram_is_never_answered(clocks: tuple[Clock, Clock]) -> None:
    # Two servers must not be made to answer each other's ERRORs forever.
    ing = _ingress(clocks)
    err = wire.encode_error(SECRET, KEY_ID, b"r" * 16, ErrorCode.INTERNAL, "x")
    r = _rejected(ing.feed(err), ErrorCode.MALFORMED)
    assert r.reply is None


@pytest.mark.parametrize("where", ["tag", "header", "body"])
def test_flipped_bit_is_invalid_signature(clocks: tuple[Clock, Clock], where: str) -> None:
    ing = _ingress(clocks)
    dg = bytearray(_invoke()[0])
    off = {"tag": len(dg) - 1, "header": 40, "body": 120}[where]   # 40: inside the nonce
    dg[off] ^= 0x01
    r = _rejected(ing.feed(bytes(dg)), ErrorCode.INVALID_SIGNATURE)
    assert not r.authenticated
    assert r.reply is not None and len(r.reply) <= len(dg)
    f = wire.decode_response(r.reply, SECRET)
    assert isinstance(f, wire.ErrorFrame) and not f.signed


def test_wrong_secret_is_invalid_signature(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    _rejected(ing.feed(_invoke(secret=OTHER)[0]), ErrorCode.INVALID_SIGNATURE)
    # Key 4's secret under key id 3 is still wrong: tags bind the key id.
    _rejected(ing.feed(_invoke(key_id=KEY_ID, secret=OTHER)[0]), ErrorCode.INVALID_SIGNATURE)


def test_unknown_key(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    r = _rejected(ing.feed(_invoke(key_id=99)[0]), ErrorCode.UNKNOWN_KEY)
    assert r.key_id == 99 and r.reply is not None and not r.authenticated


def test_replayed_nonce_is_expired_nonce(clocks: tuple[Clock, Clock]) -> None:
    wall, _ = clocks
    ing = _ingress(clocks)
    dg = _invoke()[0]
    assert isinstance(ing.feed(dg), InvokeRequest)
    wall.t += 30
    r = _rejected(ing.feed(dg), ErrorCode.EXPIRED_NONCE)
    _signed_reply(r, ErrorCode.EXPIRED_NONCE)
    # Control requests burn nonces too (a replayed RESEND must not re-send a stream).
    ctl = _control(MsgType.RESEND, 0)
    assert isinstance(ing.feed(ctl), ControlRequest)
    _rejected(ing.feed(ctl), ErrorCode.EXPIRED_NONCE)


def test_a_replayed_ping_never_gets_more_bytes_back_than_it_sent(
        clocks: tuple[Clock, Clock]) -> None:
    """A captured PING replayed forever. Each replay is refused with a signed
    ERROR (EXPIRED_NONCE while the nonce is remembered, INVALID_TIMESTAMP after), never
    larger than the 112-byte datagram, and the bytes in and out are counted."""
    wall, _ = clocks
    ing = _ingress(clocks)
    ping = _control(MsgType.PING)
    assert len(ping) == 112 and isinstance(ing.feed(ping), ControlRequest)
    for dt, code in ((1, ErrorCode.EXPIRED_NONCE), (400, ErrorCode.INVALID_TIMESTAMP),
                     (86400, ErrorCode.INVALID_TIMESTAMP)):
        wall.t = NOW + dt
        for _ in range(3):
            r = _rejected(ing.feed(ping), code)
            _signed_reply(r, code)
            assert r.reply is not None and len(r.reply) <= len(ping)
    assert ing.stats["rejected_bytes"] == 9 * 112
    assert 0 < ing.stats["reply_bytes"] <= ing.stats["rejected_bytes"]


@pytest.mark.parametrize("offset", [-301.0, 301.0, -86400.0])
def test_stale_or_future_timestamp(clocks: tuple[Clock, Clock], offset: float) -> None:
    ing = _ingress(clocks)
    r = _rejected(ing.feed(_invoke(ts=NOW + offset)[0]), ErrorCode.INVALID_TIMESTAMP)
    _signed_reply(r, ErrorCode.INVALID_TIMESTAMP)
    _rejected(ing.feed(_control(MsgType.PING, ts=NOW + offset)), ErrorCode.INVALID_TIMESTAMP)
    assert isinstance(ing.feed(_invoke(ts=NOW + offset / abs(offset) * 299)[0]), InvokeRequest)


def test_oversize_payload_is_refused_at_its_first_fragment(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    body = wire.encode_invoke_body(SamplingParams(), PayloadKind.PROMPT,
                                   bytes(wire.MAX_MESSAGE_BYTES))   # 1 MiB + 32
    frags = _invoke(body)
    r = _rejected(ing.feed(frags[0]), ErrorCode.PAYLOAD_TOO_LARGE)
    _signed_reply(r, ErrorCode.PAYLOAD_TOO_LARGE)
    # Nothing was buffered for it.
    assert len(ing.reassembler) == 0 and ing.reassembler.reserved_bytes == 0


def test_missing_fragments_time_out_and_are_counted(clocks: tuple[Clock, Clock]) -> None:
    _, mono = clocks
    ing = _ingress(clocks)
    frags = _invoke(_body("x" * 5000))
    for f in frags[:-1]:
        assert isinstance(ing.feed(f), Pending)
    assert ing.reassembler.reserved_bytes > 0
    mono.t += 6
    assert ing.tick() == 1
    assert ing.reassembler.stats["expired"] == 1 and ing.reassembler.reserved_bytes == 0
    # The last fragment alone now opens a new, never-completing reassembly, not a request.
    assert isinstance(ing.feed(frags[-1]), Pending)
    # The client's retry (fresh nonce, same request id) goes through.
    retry = _invoke(_body("x" * 5000))
    assert isinstance([ing.feed(f) for f in retry][-1], InvokeRequest)


def test_reassembly_budget_full_is_overloaded(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks, budget=8000)
    a = _invoke(_body("a" * 6000))
    b = _invoke(_body("b" * 6000))
    assert isinstance(ing.feed(a[0]), Pending)
    r = _rejected(ing.feed(b[0]), ErrorCode.OVERLOADED)
    _signed_reply(r, ErrorCode.OVERLOADED)


def test_one_key_holder_cannot_crowd_out_the_others(clocks: tuple[Clock, Clock]) -> None:
    """Default shares (half the nonce cache, half the reassembly budget per key): key 7 is
    refused OVERLOADED past its share, key 4 still gets in on both."""
    ing = _ingress(clocks, capacity=4, budget=8000, per_key_share=False)
    assert isinstance(ing.feed(_invoke()[0]), InvokeRequest)
    assert isinstance(ing.feed(_invoke()[0]), InvokeRequest)
    _rejected(ing.feed(_invoke()[0]), ErrorCode.OVERLOADED)              # nonce share
    assert isinstance(ing.feed(_invoke(key_id=4, secret=OTHER)[0]), InvokeRequest)
    big = _invoke(_body("a" * 4500), key_id=4, secret=OTHER)             # > 4000: its share
    _rejected(ing.feed(big[0]), ErrorCode.OVERLOADED)


def test_nonce_cache_full_is_overloaded(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks, capacity=2)
    ing.feed(_control(MsgType.PING))
    ing.feed(_control(MsgType.PING))
    _rejected(ing.feed(_invoke()[0]), ErrorCode.OVERLOADED)


def test_draining_refuses_new_invokes_but_serves_controls(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks, refuses_new=lambda: True)
    r = _rejected(ing.feed(_invoke()[0]), ErrorCode.DRAINING)
    _signed_reply(r, ErrorCode.DRAINING)
    assert isinstance(ing.feed(_control(MsgType.RESEND, 0)), ControlRequest)


def test_prompt_over_the_context_is_context_overflow_answered_signed(
        clocks: tuple[Clock, Clock]) -> None:
    """The runtime's context rule decides, and its error is the wire's CONTEXT_OVERFLOW as it
    is: the message says how many tokens were needed, and that a text's count is a floor."""
    ing = _ingress(clocks, context_len=lambda: 16)
    ids = wire.encode_invoke_body(SamplingParams(max_tokens=8), PayloadKind.TOKEN_IDS,
                                  wire.encode_token_ids(list(range(10))))
    r = _rejected(ing.feed(_invoke(ids)[0]), ErrorCode.CONTEXT_OVERFLOW)
    _signed_reply(r, ErrorCode.CONTEXT_OVERFLOW)
    assert r.message == "context overflow: 18 tokens needed, limit is 16"
    r = _rejected(ing.feed(_invoke(_body(max_tokens=16))[0]), ErrorCode.CONTEXT_OVERFLOW)
    assert r.message == "context overflow: at least 17 tokens needed, limit is 16"
    assert ing.errors[ErrorCode.CONTEXT_OVERFLOW] == 2
    assert isinstance(ing.feed(_invoke(_body(max_tokens=15))[0]), InvokeRequest)


def test_signed_but_bad_body_is_malformed_and_answered_signed(
        clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    bad = wire.PARAMS.pack(1, 0.0, 0.0, 0, 0, 2, 0, 0, 1) + b"x"        # top_p = 0
    r = _rejected(ing.feed(_invoke(bad)[0]), ErrorCode.MALFORMED)
    _signed_reply(r, ErrorCode.MALFORMED)


def test_body_digest_mismatch_is_malformed(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    dg = bytearray(_invoke()[0])
    dg[72] ^= 0xFF                                     # the body SHA-256 field
    dg[-32:] = wire.sign(SECRET, bytes(dg[:-32]))      # correctly signed by the key holder
    _rejected(ing.feed(bytes(dg)), ErrorCode.MALFORMED)


def test_verification_comes_before_any_buffering(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    frags = _invoke(_body("x" * 5000), secret=OTHER)   # a stranger's fragments
    for f in frags:
        _rejected(ing.feed(f), ErrorCode.INVALID_SIGNATURE)
    assert len(ing.reassembler) == 0 and ing.reassembler.stats["started"] == 0
    assert len(ing.replay) == 0                        # nor a nonce cache entry


# --- properties --------------------------------------------------------------------------

@settings(max_examples=1000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=1500))
def test_random_bytes_never_crash_ingress(clocks: tuple[Clock, Clock], data: bytes) -> None:
    r = _ingress(clocks).feed(data)
    assert isinstance(r, Rejected) and r.code is not ErrorCode.INTERNAL


VALID = _invoke(ts=NOW)[0]


@settings(max_examples=500, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bit=st.integers(0, len(VALID) * 8 - 1))
def test_any_single_bit_flip_is_rejected(clocks: tuple[Clock, Clock], bit: int) -> None:
    b = bytearray(VALID)
    b[bit // 8] ^= 1 << (bit % 8)
    r = _ingress(clocks).feed(bytes(b))
    assert isinstance(r, Rejected) and r.code in (
        ErrorCode.MALFORMED, ErrorCode.INVALID_SIGNATURE, ErrorCode.UNKNOWN_KEY)
    # Never an amplifier: an unauthenticated sender gets at most as many bytes back.
    assert r.reply is None or len(r.reply) <= len(b)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 140), st.integers(0, 255)), min_size=1,
                      max_size=4))
def test_mutated_headers_resigned_never_crash(clocks: tuple[Clock, Clock],
                                              edits: list[tuple[int, int]]) -> None:
    # A key holder sending nonsense (correct tag over a garbled header) still only gets
    # typed rejections.
    b = bytearray(_invoke(_body("y" * 3000))[1])
    for off, val in edits:
        b[off] = val
    b[-32:] = wire.sign(SECRET, bytes(b[:-32]))
    r = _ingress(clocks).feed(bytes(b))
    assert not (isinstance(r, Rejected) and r.code is ErrorCode.INTERNAL), r


def test_error_counters_per_code(clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    ing.feed(b"junk")
    ing.feed(_invoke(key_id=77)[0])
    ing.feed(_invoke(ts=NOW - 1000)[0])
    assert ing.errors[ErrorCode.MALFORMED] == 1
    assert ing.errors[ErrorCode.UNKNOWN_KEY] == 1
    assert ing.errors[ErrorCode.INVALID_TIMESTAMP] == 1
    assert set(ing.errors) == set(ErrorCode)
    assert ing.stats["datagrams"] == 3


def test_signer_keeps_the_admission_secret_across_key_rotation(
        clocks: tuple[Clock, Clock]) -> None:
    ing = _ingress(clocks)
    r = ing.feed(_invoke()[0])
    assert isinstance(r, InvokeRequest)
    ing.keys._keys = {}          # the key was rotated out mid-stream
    f = wire.decode_response(r.signer.done(0, 1, wire.FinishReason.STOP, wire.Usage(),
                                           wire.Timings()), SECRET)
    assert isinstance(f, wire.DoneFrame)
