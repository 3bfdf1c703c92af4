"""Wire format v1 codec (protocol/wire.py) and the error table (protocol/errors.py).

Round trips, the fixed offsets the XDP program will rely on, and property tests: the parsers
turn any bytes into either a value or a typed ZerolayerError, never another exception.
"""
from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerolayer.protocol import errors, wire
from zerolayer.protocol.errors import ErrorCode, InvalidSignatureError, MalformedError, ZerolayerError
from zerolayer.protocol.wire import (
    ChatMessage,
    FinishReason,
    MsgType,
    PayloadKind,
    RunState,
    SamplingParams,
    ServerState,
    Timings,
    Usage,
)

SECRET = bytes(range(32))
KEY_ID = 7
RID = bytes.fromhex("00112233445566778899aabbccddeeff")
NONCE = b"\x5a" * 32
TS = 1_700_000_000_000_000


def _invoke(body: bytes, **kw: object) -> list[bytes]:
    return wire.encode_invoke(KEY_ID, SECRET, RID, TS, NONCE, body, **kw)  # type: ignore[arg-type]


def _prompt_body(text: str = "hello", **params: object) -> bytes:
    return wire.encode_invoke_body(SamplingParams(**params), PayloadKind.PROMPT,  # type: ignore[arg-type]
                                   text.encode())


# --- fixed layout -------------------------------------------------------------------------

def test_common_header_is_at_fixed_offsets_little_endian() -> None:
    dg = _invoke(_prompt_body())[0]
    assert dg[0:4] == b"ZLYR"
    assert struct.unpack_from("<I", dg, 0)[0] == wire.MAGIC_U32 == 0x52594C5A
    assert dg[4] == wire.VERSION == 1
    assert dg[5] == MsgType.INVOKE
    assert struct.unpack_from("<H", dg, 6)[0] == wire.HEADER_LEN[MsgType.INVOKE] == 116
    assert struct.unpack_from("<H", dg, 8)[0] == len(dg)
    assert struct.unpack_from("<H", dg, 10)[0] == 0
    assert struct.unpack_from("<I", dg, 12)[0] == KEY_ID
    assert dg[16:32] == RID
    assert struct.unpack_from("<Q", dg, 32)[0] == TS
    assert dg[40:72] == NONCE
    assert dg[72:104] == hashlib.sha256(_prompt_body()).digest()
    total, index, count, chunk = struct.unpack_from("<IHHH", dg, 104)
    assert (total, index, count, chunk) == (len(_prompt_body()), 0, 1, wire.MAX_CHUNK)
    # The tag is HMAC-SHA256 over every byte before it.
    assert dg[-32:] == hmac.digest(SECRET, dg[:-32], "sha256")


def test_header_lengths_and_limits_match_the_document() -> None:
    assert wire.HEADER_LEN == {MsgType.INVOKE: 116, MsgType.CANCEL: 80, MsgType.RESEND: 80,
                               MsgType.PING: 80, MsgType.TOKEN: 44, MsgType.DONE: 128,
                               MsgType.ERROR: 44, MsgType.PONG: 56, MsgType.ACK: 48}
    assert wire.MAX_CHUNK == 1400 - 116 - 32 == 1252
    assert wire.MAX_TEXT == 1400 - 44 - 32 == 1324
    assert wire.PARAMS_LEN == 32
    # Requests have the high type bit clear, responses set.
    assert all(t < 0x80 for t in wire.REQUEST_TYPES)
    assert all(t >= 0x80 for t in MsgType if t not in wire.REQUEST_TYPES)


def test_one_mebibyte_body_fragments_fit_mtu() -> None:
    payload = bytes(wire.MAX_MESSAGE_BYTES - wire.PARAMS_LEN)
    body = wire.encode_invoke_body(SamplingParams(), PayloadKind.PROMPT, payload)
    assert len(body) == wire.MAX_MESSAGE_BYTES
    frags = _invoke(body)
    assert len(frags) == -(-len(body) // wire.MAX_CHUNK) == 838
    assert max(len(f) for f in frags) <= wire.MAX_DATAGRAM
    parsed = [wire.parse_request(f) for f in frags]
    assert b"".join(p.body for p in parsed) == body  # type: ignore[union-attr]
    assert {p.frag_count for p in parsed} == {838}  # type: ignore[union-attr]


# --- INVOKE body round trips -----------------------------------------------------------------

def test_prompt_chat_and_token_id_payloads_round_trip() -> None:
    p = SamplingParams(max_tokens=17, temperature=0.5, top_k=40, top_p=0.75, seed=2**64 - 1,
                       stop=("\n\n", "ß"))
    b = wire.decode_invoke_body(wire.encode_invoke_body(p, PayloadKind.PROMPT, "héllo".encode()))
    assert (b.params, b.prompt, b.kind) == (p, "héllo", PayloadKind.PROMPT)

    msgs = (ChatMessage("system", "be brief"), ChatMessage("user", "capital of France?"),
            ChatMessage("assistant", ""))
    b = wire.decode_invoke_body(wire.encode_invoke_body(p, PayloadKind.CHAT,
                                                        wire.encode_chat(msgs)))
    assert b.messages == msgs

    b = wire.decode_invoke_body(wire.encode_invoke_body(
        SamplingParams(), PayloadKind.TOKEN_IDS, wire.encode_token_ids([1, 2, 0xFFFFFFFF])))
    assert b.token_ids is not None and b.token_ids.tolist() == [1, 2, 0xFFFFFFFF]
    assert b.token_ids.typecode == "I" and b.token_ids.itemsize == 4


def test_penalties_round_trip_and_only_they_extend_the_body() -> None:
    plain = SamplingParams(max_tokens=5, temperature=0.5, seed=7)
    body = wire.encode_invoke_body(plain, PayloadKind.PROMPT, b"hi")
    assert len(body) == wire.PARAMS_LEN + 2  # v1's first layout: no penalty block
    assert wire.PARAMS.unpack_from(body)[7] == wire.PARAM_SEED_SET
    for pen in (dict(repetition_penalty=1.25), dict(presence_penalty=-0.5),
                dict(frequency_penalty=2.0), dict(repetition_penalty=0.25, presence_penalty=1.5,
                                                  frequency_penalty=-2.0)):
        p = SamplingParams(max_tokens=5, temperature=0.5, seed=7, stop=("x",), **pen)
        body = wire.encode_invoke_body(p, PayloadKind.PROMPT, b"hi")
        flags = wire.PARAMS.unpack_from(body)[7]
        assert flags == wire.PARAM_SEED_SET | wire.PARAM_PENALTIES
        assert len(body) == wire.PARAMS_LEN + wire.PENALTIES.size + 3 + 2
        got = wire.decode_invoke_body(body)
        assert got.params == p and got.params.penalized and got.prompt == "hi"


@given(max_tokens=st.integers(1, 2**32 - 1),
       temperature=st.floats(0.0, wire.MAX_TEMPERATURE, width=32),
       top_k=st.integers(0, 2**32 - 1),
       top_p=st.floats(0.0, 1.0, width=32, exclude_min=True),
       seed=st.none() | st.integers(0, 2**64 - 1),
       stop=st.lists(st.text(min_size=1, max_size=20), max_size=wire.MAX_STOP).map(tuple),
       prompt=st.text(max_size=3000))
def test_params_round_trip_property(max_tokens: int, temperature: float, top_k: int,
                                    top_p: float, seed: int | None, stop: tuple[str, ...],
                                    prompt: str) -> None:
    # (20 characters are at most 80 UTF-8 bytes, inside MAX_STOP_BYTES.)
    p = SamplingParams(max_tokens, temperature, top_k, top_p, seed, stop)
    body = wire.encode_invoke_body(p, PayloadKind.PROMPT, prompt.encode())
    got = wire.decode_invoke_body(body)
    assert got.params == p and got.prompt == prompt
    # ... and through fragmentation, in any chunk size.
    frags = _invoke(body, chunk_len=wire.MIN_CHUNK)
    assert b"".join(wire.parse_request(f).body for f in frags) == body  # type: ignore[union-attr]


@pytest.mark.parametrize("params", [
    dict(max_tokens=0), dict(temperature=-0.1), dict(temperature=float("nan")),
    dict(temperature=1e9), dict(top_p=0.0), dict(top_p=1.5), dict(seed=-1), dict(seed=2**64),
    dict(stop=("",)), dict(stop=("x" * 129,)), dict(stop=tuple("abcdefghi")),
    dict(repetition_penalty=0.0), dict(repetition_penalty=-1.0), dict(repetition_penalty=10.5),
    dict(repetition_penalty=float("nan")), dict(presence_penalty=2.5),
    dict(frequency_penalty=-2.01), dict(frequency_penalty=float("inf")),
])
def test_invalid_sampling_params_are_refused_before_encoding(params: dict) -> None:
    with pytest.raises(MalformedError):
        wire.encode_invoke_body(SamplingParams(**params), PayloadKind.PROMPT, b"x")


def _raw_body(max_tokens: int = 1, temperature: float = 0.0, top_p: float = 1.0,
              top_k: int = 0, seed: int = 0, kind: int = 2, n_stop: int = 0, flags: int = 0,
              payload: bytes = b"x", payload_len: int | None = None, stops: bytes = b"") -> bytes:
    return wire.PARAMS.pack(max_tokens, temperature, top_p, top_k, seed, kind, n_stop, flags,
                            len(payload) if payload_len is None else payload_len) + stops + payload


@pytest.mark.parametrize("body", [
    b"", b"\x00" * 31,
    _raw_body(max_tokens=0), _raw_body(top_p=0.0), _raw_body(temperature=float("inf")),
    _raw_body(kind=0), _raw_body(kind=9), _raw_body(flags=4), _raw_body(flags=0x8000),
    _raw_body(flags=2),                                          # no room for the penalties
    _raw_body(flags=2, payload=wire.PENALTIES.pack(1.0, 0.0, 0.0)[:11]),
    _raw_body(flags=2, stops=wire.PENALTIES.pack(0.0, 0.0, 0.0)),  # repetition 0
    _raw_body(flags=2, stops=wire.PENALTIES.pack(1.0, 3.0, 0.0)),  # presence out of range
    _raw_body(flags=2, stops=wire.PENALTIES.pack(1.0, 0.0, float("nan"))),
    _raw_body(payload_len=2), _raw_body(payload_len=0),
    _raw_body(n_stop=1), _raw_body(n_stop=1, stops=b"\x05\x00ab", payload=b""),
    _raw_body(n_stop=1, stops=b"\x00\x00"),                      # empty stop string
    _raw_body(payload=b"\xff\xfe"),                              # prompt not UTF-8
    _raw_body(kind=3, payload=b"\x01\x00\x00"),                  # token ids not 4-aligned
    _raw_body(kind=3, payload=b""),
    _raw_body(kind=1, payload=b""),                              # chat with no message
    _raw_body(kind=1, payload=b"\x09\x00\x00\x00\x00"),          # unknown role
    _raw_body(kind=1, payload=b"\x02\x05\x00\x00\x00ab"),        # content past the end
    _raw_body(kind=1, payload=b"\x02\x00\x00"),                  # truncated message header
])
def test_malformed_bodies_raise_malformed(body: bytes) -> None:
    with pytest.raises(MalformedError):
        wire.decode_invoke_body(body)


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_body_parser_total_on_random_bytes(data: bytes) -> None:
    try:
        wire.decode_invoke_body(data)
    except MalformedError:
        pass


# --- request datagrams ---------------------------------------------------------------------

def _resign(dg: bytearray) -> bytes:
    dg[-32:] = hmac.digest(SECRET, bytes(dg[:-32]), "sha256")
    return bytes(dg)


def _mutate(dg: bytes, off: int, fmt: str, value: int) -> bytes:
    b = bytearray(dg)
    struct.pack_into(fmt, b, off, value)
    return _resign(b)


GOOD = _invoke(_prompt_body("x" * 3000))   # 3 fragments


@pytest.mark.parametrize("dg,why", [
    (b"", "empty"),
    (GOOD[0][:31], "shorter than the common header"),
    (GOOD[0][:-1], "truncated: declared length != datagram length"),
    (b"ZLYX" + GOOD[0][4:], "wrong magic"),
    (_mutate(GOOD[0], 4, "<B", 2), "unsupported version"),
    (_mutate(GOOD[0], 5, "<B", 0x7F), "unknown type"),
    (_mutate(GOOD[0], 5, "<B", MsgType.TOKEN), "a response type sent as a request"),
    (_mutate(GOOD[0], 6, "<H", 115), "header length wrong for the type"),
    (_mutate(GOOD[0], 8, "<H", 9999), "declared length != datagram length"),
    (_mutate(GOOD[0], 10, "<H", 1), "request flags set"),
    (_mutate(GOOD[0], 104, "<I", 10), "total_len below the parameter block"),
    (_mutate(GOOD[0], 104, "<I", 9000), "frag_count inconsistent with total_len"),
    (_mutate(GOOD[0], 108, "<H", 3), "frag_index >= frag_count"),
    (_mutate(GOOD[0], 112, "<H", 100), "chunk_len below MIN_CHUNK"),
    (_mutate(GOOD[0], 112, "<H", 1300), "chunk_len above MAX_CHUNK"),
    (_mutate(GOOD[0], 114, "<H", 1), "reserved field"),
    (_mutate(GOOD[2], 108, "<H", 0), "last fragment's body length at index 0"),
])
def test_structurally_bad_requests_are_malformed(dg: bytes, why: str) -> None:
    with pytest.raises(MalformedError):
        wire.parse_request(dg)


def test_oversize_datagram_is_malformed() -> None:
    big = bytearray(GOOD[0]) + bytes(10)
    struct.pack_into("<H", big, 8, len(big))
    with pytest.raises(MalformedError, match="exceeds"):
        wire.parse_request(bytes(big))


def test_malformed_errors_carry_request_id_once_known() -> None:
    with pytest.raises(MalformedError) as ei:
        wire.parse_request(_mutate(GOOD[0], 108, "<H", 3))
    assert ei.value.request_id == RID and ei.value.key_id == KEY_ID
    with pytest.raises(MalformedError) as ei:
        wire.parse_request(b"nope" + GOOD[0][4:])
    assert ei.value.request_id is None


def test_control_requests_round_trip() -> None:
    for mt, arg in [(MsgType.CANCEL, 0), (MsgType.PING, 0), (MsgType.RESEND, 5),
                    (MsgType.RESEND, wire.NO_SEQ)]:
        dg = wire.encode_control(mt, KEY_ID, SECRET, RID, TS, NONCE, arg)
        assert len(dg) == 112
        m = wire.parse_request(dg)
        assert isinstance(m, wire.ControlMessage)
        assert (m.msg_type, m.key_id, m.request_id, m.timestamp_us, m.nonce, m.arg) == (
            mt, KEY_ID, RID, TS, NONCE, arg)
        wire.verify_tag(dg, SECRET)
    with pytest.raises(MalformedError):
        wire.parse_request(wire.encode_control(MsgType.CANCEL, KEY_ID, SECRET, RID, TS, NONCE, 1))


@given(st.binary(max_size=130), st.binary(max_size=1500))
def test_precomputed_mac_equals_stdlib_hmac(key: bytes, msg: bytes) -> None:
    assert wire.Mac(key).tag(msg) == hmac.digest(key, msg, "sha256")
    assert SECRET.hex() not in repr(wire.Mac(SECRET))


def test_verify_tag_rejects_any_flipped_bit() -> None:
    dg = GOOD[1]
    wire.verify_tag(dg, SECRET)
    for bit in range(0, len(dg) * 8, 97):
        b = bytearray(dg)
        b[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(InvalidSignatureError):
            wire.verify_tag(bytes(b), SECRET)
    with pytest.raises(InvalidSignatureError):
        wire.verify_tag(dg, bytes(32))


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=1500))
def test_request_parser_is_total_on_random_bytes(data: bytes) -> None:
    try:
        r = wire.parse_request(data)
    except ZerolayerError as e:
        assert e.code is ErrorCode.MALFORMED
    else:
        assert isinstance(r, (wire.InvokeFragment, wire.ControlMessage))


@settings(max_examples=1000)
@given(st.sampled_from(GOOD + [wire.encode_control(MsgType.RESEND, 1, SECRET, RID, TS, NONCE, 3)]),
       st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
       st.integers(0, 1500))
def test_request_parser_is_total_on_mutated_datagrams(dg: bytes, edits: list[tuple[int, int]],
                                                      cut: int) -> None:
    # Random bytes rarely get past the magic; mutating real datagrams explores the deep paths.
    b = bytearray(dg[:cut] if cut < len(dg) else dg)
    for off, val in edits:
        if off < len(b):
            b[off] = val
    try:
        wire.parse_request(bytes(b))
    except ZerolayerError as e:
        assert e.code is ErrorCode.MALFORMED


# --- responses -----------------------------------------------------------------------------

def test_response_frames_round_trip() -> None:
    signer = wire.ResponseSigner(KEY_ID, SECRET, RID)
    assert SECRET.hex() not in repr(signer)
    t = wire.decode_response(signer.token(3, 99, "Par", 2), SECRET)
    assert t == wire.TokenFrame(RID, 3, 99, 2, "Par")
    timings = Timings(*range(1, 10))
    d = wire.decode_response(signer.done(4, 99, FinishReason.LENGTH, Usage(10, 4, 6), timings),
                             SECRET)
    assert d == wire.DoneFrame(RID, 4, 99, FinishReason.LENGTH, Usage(10, 4, 6), timings)
    s = wire.decode_response(signer.done(5, 99, FinishReason.STOP, Usage(10, 4, 6), timings, 3),
                             SECRET)
    assert s.finish_reason is FinishReason.STOP and s.stop_index == 3
    raw = bytearray(signer.done(5, 99, FinishReason.STOP, Usage(10, 4, 6), timings, 3))
    assert raw[wire.COMMON_LEN + 9] == 3 and raw[wire.COMMON_LEN + 10:wire.COMMON_LEN + 12] == b"\0\0"
    e = wire.decode_response(signer.error(ErrorCode.CONTEXT_OVERFLOW, "too long", 0, 99), SECRET)
    assert e == wire.ErrorFrame(RID, 0, 99, ErrorCode.CONTEXT_OVERFLOW, "too long", True, KEY_ID)
    a = wire.decode_response(signer.ack(5, 99, RunState.RUNNING, 10_000), SECRET)
    assert a == wire.AckFrame(RID, 5, 99, RunState.RUNNING, 10_000)
    p = wire.decode_response(signer.pong(TS, TS + 5, ServerState.DRAINING), SECRET)
    assert p == wire.PongFrame(RID, TS, TS + 5, ServerState.DRAINING)
    assert FinishReason.CANCELLED.label == "cancelled"


@pytest.mark.parametrize("state", list(ServerState))
def test_the_signers_pong_is_the_encoders(state: ServerState) -> None:
    """ResponseSigner.pong builds the PONG in one step (the daemon's answer to every PING):
    byte for byte what encode_pong makes, for any key id, clock values and state."""
    for key_id, echo, now in ((KEY_ID, TS, TS + 5), (0xFFFFFFFF, 0, (1 << 64) - 1)):
        signer = wire.ResponseSigner(key_id, SECRET, RID)
        assert signer.pong(echo, now, state) == wire.encode_pong(SECRET, key_id, RID, echo,
                                                                  now, state)
    with pytest.raises(ValueError):
        wire.ResponseSigner(KEY_ID, SECRET, RID[:15])


def test_mac_verify_is_verify_tag() -> None:
    """Mac.verify (ingress's one call per datagram) refuses exactly what verify_tag does."""
    mac = wire.Mac(SECRET)
    good = GOOD[0]
    cases = [good, good[:-1] + bytes([good[-1] ^ 1]), good[:40], b"", good[:32],
             bytes([good[0] ^ 1]) + good[1:], wire.encode_invoke(
                 KEY_ID, bytes(32), RID, TS, NONCE, _prompt_body("y"))[0]]
    for dg in cases:
        try:
            wire.verify_tag(dg, SECRET)
            ok = True
        except InvalidSignatureError:
            ok = False
        assert mac.verify(dg) is ok, dg.hex()
    assert mac.verify(good)


def test_responses_are_authenticated() -> None:
    signer = wire.ResponseSigner(KEY_ID, SECRET, RID)
    forged = wire.encode_token(bytes(32), KEY_ID, RID, 0, 1, "spoof", 1)
    with pytest.raises(InvalidSignatureError):
        wire.decode_response(forged, SECRET)
    # Setting the UNSIGNED flag on anything but an ERROR does not help a spoofer.
    b = bytearray(signer.token(0, 1, "spoof", 1))
    struct.pack_into("<H", b, 10, wire.UNSIGNED)
    with pytest.raises(InvalidSignatureError):
        wire.decode_response(bytes(b), SECRET)
    # A request is not a response.
    with pytest.raises(MalformedError):
        wire.decode_response(GOOD[0], SECRET)


def test_unsigned_error_frame_is_marked_and_bounded() -> None:
    dg = wire.encode_error(None, KEY_ID, RID, ErrorCode.UNKNOWN_KEY, "x" * 1000, max_len=112)
    assert len(dg) <= 112 and dg[-32:] == bytes(32)
    f = wire.decode_response(dg, SECRET)
    assert isinstance(f, wire.ErrorFrame) and not f.signed and f.code == ErrorCode.UNKNOWN_KEY
    long = wire.encode_error(SECRET, KEY_ID, RID, ErrorCode.INTERNAL, "é" * 2000)
    f = wire.decode_response(long, SECRET)
    assert isinstance(f, wire.ErrorFrame)
    assert len(f.message.encode()) <= wire.MAX_ERROR_MESSAGE and set(f.message) == {"é"}


@settings(max_examples=1000)
@given(st.binary(max_size=1500))
def test_response_parser_is_total_on_random_bytes(data: bytes) -> None:
    try:
        wire.decode_response(data, SECRET)
    except ZerolayerError:
        pass


@settings(max_examples=500)
@given(st.text(max_size=4000), st.integers(4, 64))
def test_split_utf8_never_cuts_a_character(text: str, limit: int) -> None:
    parts = wire.split_utf8(text.encode(), limit)
    assert all(len(p) <= limit for p in parts)
    assert "".join(p.decode() for p in parts) == text


def test_token_text_limit_enforced() -> None:
    with pytest.raises(ValueError):
        wire.encode_token(SECRET, KEY_ID, RID, 0, 1, "x" * (wire.MAX_TEXT + 1), 1)
    assert len(wire.encode_token(SECRET, KEY_ID, RID, 0, 1, "x" * wire.MAX_TEXT, 1)) == 1400


# --- the error table -----------------------------------------------------------------------

def test_error_table_is_closed_and_complete() -> None:
    assert [c.value for c in ErrorCode] == list(range(1, 12))
    assert set(errors.ERROR_INFO) == set(ErrorCode)
    assert set(errors.EXCEPTION_FOR_CODE) == set(ErrorCode)
    classes = set(errors.EXCEPTION_FOR_CODE.values())
    assert len(classes) == len(ErrorCode)       # one distinct exception class per code
    for code, cls in errors.EXCEPTION_FOR_CODE.items():
        assert issubclass(cls, ZerolayerError) and cls.code is code
        e = errors.error_for(int(code), "m", request_id=RID)
        assert type(e) is cls and e.request_id == RID and e.message == "m"
        info = errors.ERROR_INFO[code]
        assert info.meaning and info.client_action
    assert isinstance(errors.error_for(999), MalformedError)
    assert issubclass(errors.ZerolayerTimeoutError, TimeoutError)


def test_protocol_doc_lists_every_code_and_type() -> None:
    from pathlib import Path
    doc = (Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md").read_text()
    for code in ErrorCode:
        assert f"| {code.value} | `{code.name}`" in doc, code
    for mt in MsgType:
        assert f"`{mt.name}`" in doc and f"0x{mt.value:02X}" in doc, mt


def test_a_chat_has_at_most_max_chat_messages():
    from zerolayer.protocol.errors import PayloadTooLargeError
    ok = [wire.ChatMessage("user", "x")] * wire.MAX_CHAT_MESSAGES
    assert len(wire._decode_chat(wire.encode_chat(ok))) == wire.MAX_CHAT_MESSAGES
    with pytest.raises(PayloadTooLargeError):
        wire.encode_chat(ok + [wire.ChatMessage("user", "x")])
    raw = (wire.CHAT_MSG_HDR.pack(2, 1) + b"x") * (wire.MAX_CHAT_MESSAGES + 1)
    with pytest.raises(PayloadTooLargeError):
        wire._decode_chat(raw)
