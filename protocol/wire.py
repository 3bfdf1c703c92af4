"""Wire format v1: the byte layout of every datagram, and its encoders and parsers.

This module is pure: bytes in, typed values or a typed error out, no sockets, no clocks, no
key store. docs/PROTOCOL.md is the normative description; the constants here are its
numbers. Everything is little-endian: the hosts we target (x86-64, aarch64) and the GPU are
little-endian, so the daemon, the XDP program and device kernels read fields without
swapping bytes.

Every datagram (request or response) starts with the same 32-byte common header, so the
kernel-side XDP program can validate magic, version, type, declared lengths and fragment
sanity at fixed offsets before the daemon ever sees a packet:

    off size  field
      0   4   magic          b"ZLYR"
      4   1   version        1
      5   1   type           MsgType
      6   2   header_len     bytes before the body; fixed per type in v1
      8   2   datagram_len   whole datagram, tag included; == UDP payload length
     10   2   flags          requests: bit 1 = XDP_TAG; responses: bit 0 = UNSIGNED
     12   4   key_id         u32, 0 = none
     16  16   request_id     chosen by the client
     32   …   type-specific header, then body, then a 32-byte HMAC-SHA256 tag

The tag is HMAC-SHA256(secret of key_id, every byte before the tag), per datagram, so each
fragment of a large request is authenticated on its own and can be verified before anything
is buffered for it.
"""
from __future__ import annotations

import hashlib
import hmac
import operator
import struct
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple, TypedDict

from . import constraint as cst
from . import logprobs as lp
from . import xdp_tag as _xdp
from .errors import ErrorCode, InvalidSignatureError, MalformedError, PayloadTooLargeError
from .sampling_params import MAX_STOP, MAX_STOP_BYTES, MAX_TEMPERATURE, InvalidSamplingParams, SamplingParams  # noqa: F401
from .wire_consts import WIRE

# --- constants (docs/PROTOCOL.md §2) -------------------------------------------------------
# The numbers the XDP program checks too come from protocol/wire_consts.py, the one source; the
# struct formats below must agree with them (checked at import, after the formats).

MAGIC_U32 = WIRE["ZL_MAGIC"]   # 0x52594C5A, what a u32 load at offset 0 sees
MAGIC = MAGIC_U32.to_bytes(4, "little")  # b"ZLYR"
VERSION = WIRE["ZL_VERSION"]
TAG_LEN = WIRE["ZL_TAG_LEN"]   # HMAC-SHA256
NONCE_LEN = 32
REQUEST_ID_LEN = 16
DIGEST_LEN = 32                # SHA-256 of the whole INVOKE body
# 1400 bytes of UDP payload fits an MTU-1500 frame with IPv4 (1472) or IPv6 (1452) and
# leaves room for a VLAN tag or a tunnel header; one datagram = one AF_XDP frame later.
MAX_DATAGRAM = WIRE["ZL_MAX_DATAGRAM"]
MAX_MESSAGE_BYTES = WIRE["ZL_MAX_MESSAGE"]  # an INVOKE body (params + stops + payload), 1 MiB
MAX_CHAT_MESSAGES = 4096       # messages in one chat; more: PAYLOAD_TOO_LARGE (each costs a
                               # template render and >= 2 control tokens: no context holds more)
NO_SEQ = 0xFFFFFFFF            # ERROR outside a stream; RESEND from NO_SEQ = keepalive only
UNSIGNED = 0x0001              # flags bit: response carries a zero tag (see ERROR frames)
XDP_TAG = _xdp.FLAG            # request flags bit: the nonce ends with the XDP tag (xdp_tag.py)

COMMON = struct.Struct("<4sBBHHHI16s")
COMMON_LEN = COMMON.size  # 32


class MsgType(IntEnum):
    # Requests have the high bit clear, responses set: the XDP program and the daemon drop
    # a response-typed datagram arriving at the server with one test.
    INVOKE = WIRE["ZL_TYPE_INVOKE"]
    CANCEL = WIRE["ZL_TYPE_CANCEL"]
    RESEND = WIRE["ZL_TYPE_RESEND"]
    PING = WIRE["ZL_TYPE_PING"]
    TOKEN = 0x81
    DONE = 0x82
    ERROR = 0x83
    PONG = 0x84
    ACK = 0x85


REQUEST_TYPES = frozenset({MsgType.INVOKE, MsgType.CANCEL, MsgType.RESEND, MsgType.PING})
CONTROL_TYPES = frozenset({MsgType.CANCEL, MsgType.RESEND, MsgType.PING})

# Type-specific headers, packed right after COMMON.
INVOKE_HDR = struct.Struct("<Q32s32sIHHHH")   # ts_us, nonce, body_sha256, total_len,
                                               # frag_index, frag_count, chunk_len, reserved
CONTROL_HDR = struct.Struct("<Q32sII")        # ts_us, nonce, arg (RESEND: from_seq), reserved
TOKEN_HDR = struct.Struct("<IIHH")            # seq, run_id, n_tokens, lp_len (logprobs.py)
ERROR_HDR = struct.Struct("<IIHH")            # seq, run_id, code, reserved
ACK_HDR = struct.Struct("<IIBBHI")            # next_seq, run_id, state, reserved, reserved,
                                               # lease_ms
DONE_HDR = struct.Struct("<IIBB2xIII9Q")      # seq, run_id, finish, stop index, pad, usage×3, timings×9
PONG_HDR = struct.Struct("<QQB7x")            # echo ts_us, server ts_us, server state, pad

HEADER_LEN: dict[MsgType, int] = {
    MsgType.INVOKE: COMMON_LEN + INVOKE_HDR.size,    # 116
    MsgType.CANCEL: COMMON_LEN + CONTROL_HDR.size,   # 80
    MsgType.RESEND: COMMON_LEN + CONTROL_HDR.size,
    MsgType.PING: COMMON_LEN + CONTROL_HDR.size,
    MsgType.TOKEN: COMMON_LEN + TOKEN_HDR.size,      # 44
    MsgType.DONE: COMMON_LEN + DONE_HDR.size,        # 128
    MsgType.ERROR: COMMON_LEN + ERROR_HDR.size,      # 44
    MsgType.PONG: COMMON_LEN + PONG_HDR.size,        # 56
    MsgType.ACK: COMMON_LEN + ACK_HDR.size,          # 48
}

MAX_CHUNK = MAX_DATAGRAM - HEADER_LEN[MsgType.INVOKE] - TAG_LEN   # 1252 body bytes/fragment
# A floor on the chunk size caps the fragment count of a 1 MiB request (4096), and so the
# per-request bookkeeping a key holder can make the daemon do.
MIN_CHUNK = WIRE["ZL_MIN_CHUNK"]
MAX_TEXT = MAX_DATAGRAM - HEADER_LEN[MsgType.TOKEN] - TAG_LEN     # 1324 text bytes per TOKEN
MAX_ERROR_MESSAGE = 512

# INVOKE body: fixed sampling-parameter block, then stop strings, then the payload.
PARAMS = struct.Struct("<IffIQBBHI")  # max_tokens, temperature, top_p, top_k, seed,
                                       # payload_kind, n_stop, flags, payload_len
PARAMS_LEN = PARAMS.size  # 32
PARAM_SEED_SET = 0x0001
PARAM_PENALTIES = 0x0002  # a penalty block follows the parameter block
PENALTIES = struct.Struct("<fff")  # repetition, presence, frequency
PARAM_LOGPROBS = 0x0004   # a logprobs block follows (and the penalty block, if any)
PARAM_CONSTRAINT = 0x0008  # a constraint block follows (after the logprobs block, if any)
PARAM_NO_SPECULATION = 0x0010  # decode without drafts (no block follows)
PARAM_FLAGS = (PARAM_SEED_SET | PARAM_PENALTIES | PARAM_LOGPROBS | PARAM_CONSTRAINT
               | PARAM_NO_SPECULATION)
CHAT_MSG_HDR = struct.Struct("<BI")    # role, content length


def _agree_with_the_xdp_program() -> None:
    """The layouts above against protocol/wire_consts.py: a mismatch is a build error."""
    derived = {
        "ZL_COMMON_LEN": COMMON_LEN, "ZL_HLEN_INVOKE": HEADER_LEN[MsgType.INVOKE],
        "ZL_HLEN_CONTROL": HEADER_LEN[MsgType.PING],
        "ZL_CONTROL_DGRAM": HEADER_LEN[MsgType.PING] + TAG_LEN, "ZL_MAX_CHUNK": MAX_CHUNK,
        "ZL_PARAMS_LEN": PARAMS_LEN, "ZL_TYPE_MAX_REQUEST": max(REQUEST_TYPES),
    }
    wrong = {k: (v, WIRE[k]) for k, v in derived.items() if WIRE[k] != v}
    if wrong or len({HEADER_LEN[t] for t in CONTROL_TYPES}) != 1:
        raise RuntimeError(f"protocol/wire.py disagrees with protocol/wire_consts.py: {wrong}")


_agree_with_the_xdp_program()


class PayloadKind(IntEnum):
    CHAT = 1        # chat messages; the daemon applies the model's chat template
    PROMPT = 2      # raw UTF-8 prompt text, tokenized as is
    TOKEN_IDS = 3   # u32 token ids, used as is


class Role(IntEnum):
    SYSTEM = 1
    USER = 2
    ASSISTANT = 3


class FinishReason(IntEnum):
    STOP = 0        # EOS or a stop string (DONE's stop_index says which, if a stop string)
    LENGTH = 1      # max_tokens reached
    CANCELLED = 2   # the client sent CANCEL

    @property
    def label(self) -> str:
        return self.name.lower()


class RunState(IntEnum):
    """ACK's view of a request on the server."""
    QUEUED = 0
    RUNNING = 1
    FINISHED = 2


class ServerState(IntEnum):
    """PONG's view of the daemon."""
    READY = 0
    WARMING = 1
    DRAINING = 2


# --- value types -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str     # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True, slots=True)
class InvokeBody:
    """A decoded INVOKE body. Exactly one of prompt / messages / token_ids is set."""
    params: SamplingParams
    kind: PayloadKind
    payload: bytes                                   # the payload bytes as sent
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    # The ids as u32 (array('I'): a buffer, so np.asarray views it without a copy).
    token_ids: array[int] | None = field(default=None, compare=False)


# The two parsed request shapes are named tuples, not frozen dataclasses: one is built for
# every datagram that reaches the daemon, and a frozen dataclass's __init__ (one
# object.__setattr__ per field) cost three times a tuple's. Immutable all the same.
class InvokeFragment(NamedTuple):
    """One INVOKE datagram, structurally valid, not yet authenticated."""
    key_id: int
    request_id: bytes
    timestamp_us: int
    nonce: bytes
    body_sha256: bytes
    total_len: int
    frag_index: int
    frag_count: int
    chunk_len: int
    body: bytes
    tag: bytes
    flags: int = 0    # XDP_TAG or 0


class ControlMessage(NamedTuple):
    """CANCEL, RESEND or PING, structurally valid, not yet authenticated."""
    msg_type: MsgType
    key_id: int
    request_id: bytes
    timestamp_us: int
    nonce: bytes
    arg: int          # RESEND: from_seq (NO_SEQ = keepalive only); others: 0
    tag: bytes
    flags: int = 0    # XDP_TAG or 0


Request = InvokeFragment | ControlMessage


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Timings:
    """Per-request latency breakdown in microseconds, as the daemon measured it."""
    queue_us: int = 0              # admitted → first scheduled, tokenization excluded
    prefill_us: int = 0            # prompt forward pass
    decode_per_token_us: int = 0   # mean decode step per generated token
    total_us: int = 0              # first datagram received → DONE sent
    ingress_us: int = 0            # first datagram received → last (reassembly; 0: one datagram)
    tokenize_us: int = 0           # chat template + tokenizer
    decode_us: int = 0             # all decode steps
    decode_step_max_us: int = 0    # slowest decode step (jitter)
    response_us: int = 0           # detokenize + frame + send, summed

    def as_tuple(self) -> tuple[int, ...]:
        return (self.queue_us, self.prefill_us, self.decode_per_token_us, self.total_us,
                self.ingress_us, self.tokenize_us, self.decode_us, self.decode_step_max_us,
                self.response_us)


@dataclass(frozen=True, slots=True)
class TokenFrame:
    request_id: bytes
    seq: int
    run_id: int
    n_tokens: int
    text: str
    # logprob entries (protocol/logprobs.py), only in a stream that asked for them
    logprobs: tuple[lp.LogprobEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class DoneFrame:
    request_id: bytes
    seq: int
    run_id: int
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    stop_index: int = 0  # 0: not a stop string (EOS, length, cancel); k: the request's k-th stop


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    request_id: bytes
    seq: int
    run_id: int
    code: int
    message: str
    signed: bool      # False: an UNSIGNED pre-authentication error, see PROTOCOL.md §6
    key_id: int = 0


@dataclass(frozen=True, slots=True)
class AckFrame:
    request_id: bytes
    next_seq: int
    run_id: int
    state: RunState
    lease_ms: int


@dataclass(frozen=True, slots=True)
class PongFrame:
    request_id: bytes
    echo_timestamp_us: int
    server_time_us: int
    state: ServerState


Response = TokenFrame | DoneFrame | ErrorFrame | AckFrame | PongFrame


# --- signing -----------------------------------------------------------------------------------

_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


class Mac:
    """HMAC-SHA256 under one secret, with the keyed inner/outer SHA-256 states computed once.

    Every datagram is signed or verified, so this is on the per-token path: with OpenSSL 3,
    hmac.digest() re-derives the key state on each call (~5.7 µs for a 100-byte frame here);
    copying precomputed states costs ~1.7 µs. Same output as hmac.digest(secret, m, sha256).
    """

    __slots__ = ("_inner", "_outer", "xdp_key")

    def __init__(self, secret: bytes) -> None:
        # The key id's SipHash key for the XDP tag (xdp_tag.py), derived once with the rest.
        self.xdp_key = _xdp.derive_key(secret)
        key = hashlib.sha256(secret).digest() if len(secret) > 64 else secret
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(key.translate(_IPAD))
        self._outer = hashlib.sha256(key.translate(_OPAD))

    def __repr__(self) -> str:  # never print key material
        return "Mac(<secret>)"

    def tag(self, data: bytes | bytearray | memoryview) -> bytes:
        inner = self._inner.copy()
        inner.update(data)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def verify(self, datagram: bytes) -> bool:
        """Whether the trailing tag is right, compared in constant time. The daemon calls
        this once per datagram: one call, where verify_tag's checks cost three more."""
        n = len(datagram) - TAG_LEN
        return n >= 0 and hmac.compare_digest(self.tag(memoryview(datagram)[:n]), datagram[n:])


Secret = bytes | Mac


def as_mac(secret: Secret) -> Mac:
    return secret if isinstance(secret, Mac) else Mac(secret)


def sign(secret: Secret, data: bytes | bytearray | memoryview) -> bytes:
    return as_mac(secret).tag(data)


def verify_tag(datagram: bytes, secret: Secret, *, request_id: bytes | None = None,
               key_id: int | None = None) -> None:
    """Constant-time check of the trailing tag; raises InvalidSignatureError."""
    if not as_mac(secret).verify(datagram):
        raise InvalidSignatureError("tag mismatch", request_id=request_id, key_id=key_id)


def verify_xdp_tag(datagram: bytes, secret: Secret, *, request_id: bytes | None = None,
                   key_id: int | None = None) -> None:
    """The XDP tag of a request that set XDP_TAG, under its key id's derived key; raises
    InvalidSignatureError, the class the XDP program's drop of a wrong tag stands for."""
    if not _xdp.valid(as_mac(secret).xdp_key, datagram):
        raise InvalidSignatureError("XDP tag mismatch", request_id=request_id, key_id=key_id)


def _with_xdp_tag(prefix: bytearray, nonce: bytes, mac: Mac) -> bytes:
    """The nonce to send when tagging: its first 24 bytes, then the tag over `prefix` (the
    datagram's first 64 bytes, which end with those 24 bytes)."""
    return nonce[:_xdp.OFFSET - 40] + _xdp.compute(mac.xdp_key, prefix)


def _finish(buf: bytearray, secret: Secret | None) -> bytes:
    """Append the tag (or a zero tag when unsigned) to a datagram whose header already
    declares its final length."""
    buf += sign(secret, buf) if secret is not None else bytes(TAG_LEN)
    if len(buf) > MAX_DATAGRAM:
        raise ValueError(f"datagram of {len(buf)} bytes exceeds {MAX_DATAGRAM}")
    return bytes(buf)


def _common(msg_type: MsgType, body_len: int, key_id: int, request_id: bytes,
            flags: int = 0) -> bytearray:
    if len(request_id) != REQUEST_ID_LEN:
        raise ValueError("request_id must be 16 bytes")
    hlen = HEADER_LEN[msg_type]
    return bytearray(COMMON.pack(MAGIC, VERSION, msg_type, hlen, hlen + body_len + TAG_LEN,
                                 flags, key_id, request_id))


# --- INVOKE body -----------------------------------------------------------------------------

_ROLE_BY_NAME = {r.name.lower(): r for r in Role}
_ROLE_NAME = {r.value: r.name.lower() for r in Role}


def encode_chat(messages: list[ChatMessage] | tuple[ChatMessage, ...]) -> bytes:
    if len(messages) > MAX_CHAT_MESSAGES:
        raise PayloadTooLargeError(f"{len(messages)} chat messages; at most {MAX_CHAT_MESSAGES}")
    out = bytearray()
    for m in messages:
        role = _ROLE_BY_NAME.get(m.role)
        if role is None:
            raise MalformedError(f"unknown chat role {m.role!r}")
        content = m.content.encode("utf-8")
        out += CHAT_MSG_HDR.pack(role, len(content)) + content
    if not out:
        raise MalformedError("a chat payload needs at least one message")
    return bytes(out)


def encode_token_ids(ids: Iterable[int]) -> bytes:
    """Little-endian u32s. Any iterable of integers (a list, a 1-D numpy array); floats and
    nested sequences are refused rather than truncated."""
    try:
        vals = [operator.index(i) for i in ids]
    except TypeError:
        raise MalformedError("token_ids must be a non-empty 1-D sequence of integers") from None
    if not vals:
        raise MalformedError("token_ids must be a non-empty 1-D sequence")
    if min(vals) < 0 or max(vals) > 0xFFFFFFFF:
        raise MalformedError("token ids must be integers in 0..2^32-1")
    arr = array("I", vals)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def validate_params(params: SamplingParams) -> None:
    """SamplingParams.validate, as the wire's MALFORMED error (the SDK refuses before
    sending, the parser after decoding, with one rule set)."""
    try:
        params.validate()
    except InvalidSamplingParams as e:
        raise MalformedError(str(e)) from None


def encode_invoke_body(params: SamplingParams, kind: PayloadKind, payload: bytes) -> bytes:
    validate_params(params)
    flags = 0
    seed = 0
    if params.seed is not None:
        flags |= PARAM_SEED_SET
        seed = params.seed
    if params.penalized:  # only then: a request without penalties is v1's first layout
        flags |= PARAM_PENALTIES
    if params.logprobs:
        flags |= PARAM_LOGPROBS
    if params.constraint is not None:
        flags |= PARAM_CONSTRAINT
    if not params.speculative:
        flags |= PARAM_NO_SPECULATION
    out = bytearray(PARAMS.pack(params.max_tokens, params.temperature, params.top_p,
                                params.top_k, seed, int(kind), len(params.stop), flags,
                                len(payload)))
    if params.penalized:
        out += PENALTIES.pack(params.repetition_penalty, params.presence_penalty,
                              params.frequency_penalty)
    if params.logprobs:
        out += lp.encode_block(params.top_logprobs)
    if params.constraint is not None:
        out += cst.encode_block(params.constraint)
    for s in params.stop:
        b = s.encode("utf-8")
        out += struct.pack("<H", len(b)) + b
    out += payload
    return bytes(out)


def asks_logprobs(body: bytes) -> bool:
    """Whether an INVOKE body sets the LOGPROBS flag (the SDK's question, without parsing
    the rest of a body that may be a megabyte)."""
    return len(body) >= PARAMS_LEN and bool(PARAMS.unpack_from(body, 0)[7] & PARAM_LOGPROBS)


def decode_invoke_body(body: bytes) -> InvokeBody:
    """Parse a reassembled INVOKE body; any defect raises MalformedError."""
    if len(body) < PARAMS_LEN:
        raise MalformedError("body shorter than the parameter block")
    (max_tokens, temperature, top_p, top_k, seed, kind, n_stop, flags,
     payload_len) = PARAMS.unpack_from(body, 0)
    if flags & ~PARAM_FLAGS:
        raise MalformedError("unknown parameter flags")
    try:
        pkind = PayloadKind(kind)
    except ValueError:
        raise MalformedError(f"unknown payload kind {kind}") from None
    off = PARAMS_LEN
    penalties = (1.0, 0.0, 0.0)
    if flags & PARAM_PENALTIES:
        if off + PENALTIES.size > len(body):
            raise MalformedError("body shorter than the penalty block")
        penalties = PENALTIES.unpack_from(body, off)
        off += PENALTIES.size
    top_logprobs = lp.decode_block(body, off) if flags & PARAM_LOGPROBS else 0
    if flags & PARAM_LOGPROBS:
        off += lp.LOGPROBS_BLOCK.size
    constraint = None
    if flags & PARAM_CONSTRAINT:
        constraint, off = cst.decode_block(body, off)
    stops: list[str] = []
    for _ in range(n_stop):
        if off + 2 > len(body):
            raise MalformedError("stop strings run past the body")
        (n,) = struct.unpack_from("<H", body, off)
        off += 2
        if off + n > len(body):
            raise MalformedError("stop string runs past the body")
        stops.append(_utf8(body[off:off + n], "stop string"))
        off += n
    if off + payload_len != len(body):
        raise MalformedError("payload_len does not match the body length")
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed if flags & PARAM_SEED_SET else None,
                            stop=tuple(stops), repetition_penalty=penalties[0],
                            presence_penalty=penalties[1], frequency_penalty=penalties[2],
                            logprobs=bool(flags & PARAM_LOGPROBS), top_logprobs=top_logprobs,
                            constraint=constraint,
                            speculative=not flags & PARAM_NO_SPECULATION)
    validate_params(params)
    payload = bytes(body[off:])
    if pkind is PayloadKind.PROMPT:
        return InvokeBody(params, pkind, payload, prompt=_utf8(payload, "prompt"))
    if pkind is PayloadKind.TOKEN_IDS:
        if not payload or len(payload) % 4:
            raise MalformedError("token id payload must be a non-empty multiple of 4 bytes")
        ids = array("I", payload)
        if sys.byteorder == "big":
            ids.byteswap()
        return InvokeBody(params, pkind, payload, token_ids=ids)
    return InvokeBody(params, pkind, payload, messages=_decode_chat(payload))


def _decode_chat(payload: bytes) -> tuple[ChatMessage, ...]:
    msgs: list[ChatMessage] = []
    off = 0
    end = len(payload)
    while off < end:
        if len(msgs) == MAX_CHAT_MESSAGES:  # checked as it goes: the cost stays bounded
            raise PayloadTooLargeError(f"more than {MAX_CHAT_MESSAGES} chat messages")
        if off + CHAT_MSG_HDR.size > end:
            raise MalformedError("truncated chat message header")
        role, n = CHAT_MSG_HDR.unpack_from(payload, off)
        off += CHAT_MSG_HDR.size
        if off + n > end:
            raise MalformedError("chat message runs past the payload")
        rname = _ROLE_NAME.get(role)
        if rname is None:
            raise MalformedError(f"unknown chat role {role}")
        msgs.append(ChatMessage(rname, _utf8(payload[off:off + n], "chat message")))
        off += n
    if not msgs:
        raise MalformedError("a chat payload needs at least one message")
    return tuple(msgs)


def _utf8(b: bytes, what: str) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedError(f"{what} is not valid UTF-8") from None


# --- requests ---------------------------------------------------------------------------------

def fragment_count(total_len: int, chunk_len: int) -> int:
    return max(1, -(-total_len // chunk_len))


def encode_invoke(key_id: int, secret: Secret, request_id: bytes, timestamp_us: int,
                  nonce: bytes, body: bytes, chunk_len: int = MAX_CHUNK, *,
                  xdp_tag: bool = False) -> list[bytes]:
    """Split an INVOKE body into signed fragments. Fragment i carries body bytes
    [i*chunk_len, min((i+1)*chunk_len, total)); every fragment repeats the whole-request
    header (timestamp, nonce, body digest, total length, count) so that any one of them can be
    checked on its own and arrival order does not matter. With xdp_tag the nonce's last 8
    bytes are replaced by the XDP tag (the same in every fragment)."""
    if not MIN_CHUNK <= chunk_len <= MAX_CHUNK:
        raise ValueError(f"chunk_len must be in {MIN_CHUNK}..{MAX_CHUNK}")
    if len(nonce) != NONCE_LEN:
        raise ValueError("nonce must be 32 bytes")
    secret = as_mac(secret)  # once for all fragments
    digest = hashlib.sha256(body).digest()
    count = fragment_count(len(body), chunk_len)
    if count > 0xFFFF:
        raise ValueError("too many fragments")
    flags = XDP_TAG if xdp_tag else 0
    if flags:
        nonce = _with_xdp_tag(_common(MsgType.INVOKE, 0, key_id, request_id, flags)
                              + struct.pack("<Q", timestamp_us) + nonce[:24], nonce, secret)
    out = []
    for i in range(count):
        chunk = body[i * chunk_len:(i + 1) * chunk_len]
        buf = _common(MsgType.INVOKE, len(chunk), key_id, request_id, flags)
        buf += INVOKE_HDR.pack(timestamp_us, nonce, digest, len(body), i, count, chunk_len, 0)
        buf += chunk
        out.append(_finish(buf, secret))
    return out


def encode_control(msg_type: MsgType, key_id: int, secret: Secret, request_id: bytes,
                   timestamp_us: int, nonce: bytes, arg: int = 0, *,
                   xdp_tag: bool = False) -> bytes:
    if msg_type not in CONTROL_TYPES:
        raise ValueError(f"{msg_type!r} is not a control request")
    if len(nonce) != NONCE_LEN:
        raise ValueError("nonce must be 32 bytes")
    flags = XDP_TAG if xdp_tag else 0
    buf = _common(msg_type, 0, key_id, request_id, flags)
    if flags:
        secret = as_mac(secret)
        nonce = _with_xdp_tag(buf + struct.pack("<Q", timestamp_us) + nonce[:24], nonce, secret)
    buf += CONTROL_HDR.pack(timestamp_us, nonce, arg, 0)
    return _finish(buf, secret)


class _ErrCtx(TypedDict, total=False):
    """What a parse error knows about the request so far (the ERROR reply echoes it)."""
    request_id: bytes
    key_id: int


def _parse_common(datagram: bytes) -> tuple[MsgType, int, int, bytes]:
    """The fixed 32-byte header checks, in the order the XDP program does them.
    Returns (type, flags, key_id, request_id)."""
    n = len(datagram)
    if n < COMMON_LEN:
        raise MalformedError(f"datagram of {n} bytes is shorter than the common header")
    magic, version, mtype, hlen, dlen, flags, key_id, rid = COMMON.unpack_from(datagram, 0)
    if magic != MAGIC:
        raise MalformedError("bad magic")
    # From here the request id is known, so errors can be addressed to it.
    mt = _MSG_TYPES.get(mtype)   # MsgType(mtype) costs ~20x a dict lookup
    if (version != VERSION or mt is None or dlen != n or n > MAX_DATAGRAM
            or hlen != HEADER_LEN[mt] or hlen + TAG_LEN > n):
        _common_error(version, mtype, mt, hlen, dlen, n, key_id, rid)
    return mt, flags, key_id, rid  # type: ignore[return-value]


_MSG_TYPES: dict[int, MsgType] = {int(m): m for m in MsgType}


def _common_error(version: int, mtype: int, mt: MsgType | None, hlen: int, dlen: int, n: int,
                  key_id: int, rid: bytes) -> None:
    """Raise the first of _parse_common's checks that fails, in the XDP program's order
    (kept out of the accepted datagram's path)."""
    ctx: _ErrCtx = {"request_id": rid, "key_id": key_id}
    if version != VERSION:
        raise MalformedError(f"unsupported version {version}", **ctx)
    if mt is None:
        raise MalformedError(f"unknown message type {mtype:#x}", **ctx)
    if dlen != n:
        raise MalformedError(f"declared length {dlen} != datagram length {n}", **ctx)
    if n > MAX_DATAGRAM:
        raise MalformedError(f"datagram of {n} bytes exceeds {MAX_DATAGRAM}", **ctx)
    raise MalformedError(f"bad header length {hlen} for {mt.name}", **ctx)


def parse_request(datagram: bytes) -> Request:
    """Structural parse of a request datagram, no key needed (cheap, and the same checks the
    XDP program makes). Raises MalformedError, with request_id/key_id set once known."""
    mt, flags, key_id, rid = _parse_common(datagram)
    ctx: _ErrCtx = {"request_id": rid, "key_id": key_id}
    if mt not in REQUEST_TYPES:
        raise MalformedError(f"{mt.name} is not a request", **ctx)
    if flags & ~XDP_TAG:
        raise MalformedError("unknown request flags", **ctx)
    hlen = HEADER_LEN[mt]
    body_len = len(datagram) - hlen - TAG_LEN
    tag = datagram[-TAG_LEN:]
    if type(tag) is not bytes:
        tag = bytes(tag)
    if mt is MsgType.INVOKE:
        (ts, nonce, digest, total, index, count, chunk,
         reserved) = INVOKE_HDR.unpack_from(datagram, COMMON_LEN)
        if reserved:
            raise MalformedError("reserved field must be zero", **ctx)
        if not MIN_CHUNK <= chunk <= MAX_CHUNK:
            raise MalformedError(f"chunk_len {chunk} outside {MIN_CHUNK}..{MAX_CHUNK}", **ctx)
        if total < PARAMS_LEN:
            raise MalformedError("total_len shorter than the parameter block", **ctx)
        # (count-1)*chunk < total <= count*chunk, written without division for BPF.
        if count == 0 or not (count - 1) * chunk < total <= count * chunk:
            raise MalformedError("frag_count does not match total_len/chunk_len", **ctx)
        if index >= count:
            raise MalformedError("frag_index >= frag_count", **ctx)
        expect = min(chunk, total - index * chunk)
        if body_len != expect:
            raise MalformedError(f"fragment body {body_len} bytes, expected {expect}", **ctx)
        return InvokeFragment(key_id, rid, ts, nonce, digest, total, index, count, chunk,
                              bytes(datagram[hlen:hlen + body_len]), tag, flags)
    ts, nonce, arg, reserved = CONTROL_HDR.unpack_from(datagram, COMMON_LEN)
    if reserved or body_len:
        raise MalformedError("control request with reserved bits or a body", **ctx)
    if mt is not MsgType.RESEND and arg:
        raise MalformedError(f"{mt.name} arg must be zero", **ctx)
    return ControlMessage(mt, key_id, rid, ts, nonce, arg, tag, flags)


# --- responses --------------------------------------------------------------------------------

def split_utf8(data: bytes, limit: int = MAX_TEXT) -> list[bytes]:
    """Split UTF-8 text into pieces of at most `limit` bytes without cutting a character,
    so that each TOKEN frame's text is valid UTF-8 on its own."""
    out = []
    while len(data) > limit:
        cut = limit
        while cut > 0 and (data[cut] & 0xC0) == 0x80:  # continuation byte: back up
            cut -= 1
        if cut == 0:
            raise ValueError("limit smaller than one character")
        out.append(data[:cut])
        data = data[cut:]
    out.append(data)
    return out


def encode_token(secret: Secret, key_id: int, request_id: bytes, seq: int, run_id: int,
                 text: str | bytes, n_tokens: int, logprobs: bytes = b"") -> bytes:
    """A TOKEN frame; `logprobs`, the encoded entries (protocol/logprobs.py), follow the
    text, and the header's lp_len says how many bytes they take (0: none, v1's frame)."""
    b = text.encode("utf-8") if isinstance(text, str) else text
    if len(b) + len(logprobs) > MAX_TEXT:
        raise ValueError(f"TOKEN text and logprobs of {len(b) + len(logprobs)} bytes > "
                         f"{MAX_TEXT}; use split_utf8 / logprobs.pack_frames")
    buf = _common(MsgType.TOKEN, len(b) + len(logprobs), key_id, request_id)
    buf += TOKEN_HDR.pack(seq, run_id, n_tokens, len(logprobs)) + b + logprobs
    return _finish(buf, secret)


def encode_done(secret: Secret, key_id: int, request_id: bytes, seq: int, run_id: int,
                finish_reason: FinishReason, usage: Usage, timings: Timings,
                stop_index: int = 0) -> bytes:
    buf = _common(MsgType.DONE, 0, key_id, request_id)
    buf += DONE_HDR.pack(seq, run_id, int(finish_reason), stop_index, usage.prompt_tokens,
                         usage.cached_prompt_tokens, usage.completion_tokens,
                         *(min(max(int(t), 0), (1 << 64) - 1) for t in timings.as_tuple()))
    return _finish(buf, secret)


def truncate_utf8(s: str, limit: int) -> bytes:
    b = s.encode("utf-8", "replace")
    return split_utf8(b, limit)[0] if len(b) > limit else b


def encode_error(secret: Secret | None, key_id: int, request_id: bytes, code: ErrorCode,
                 message: str = "", seq: int = NO_SEQ, run_id: int = 0,
                 max_len: int = MAX_DATAGRAM) -> bytes:
    """An ERROR frame; secret=None makes it UNSIGNED (zero tag, flag bit set), which v1
    allows only before authentication succeeded (UNKNOWN_KEY, INVALID_SIGNATURE, a MALFORMED
    header). `max_len` truncates the message so the reply can be kept no larger than the
    datagram it answers (no amplification)."""
    room = max(0, min(MAX_ERROR_MESSAGE, max_len - HEADER_LEN[MsgType.ERROR] - TAG_LEN))
    msg = truncate_utf8(message, room) if room else b""
    buf = _common(MsgType.ERROR, len(msg), key_id, request_id,
                  flags=UNSIGNED if secret is None else 0)
    buf += ERROR_HDR.pack(seq, run_id, int(code), 0) + msg
    return _finish(buf, secret)


def encode_ack(secret: Secret, key_id: int, request_id: bytes, next_seq: int, run_id: int,
               state: RunState, lease_ms: int) -> bytes:
    buf = _common(MsgType.ACK, 0, key_id, request_id)
    buf += ACK_HDR.pack(next_seq, run_id, int(state), 0, 0, lease_ms)
    return _finish(buf, secret)


def encode_pong(secret: Secret, key_id: int, request_id: bytes, echo_timestamp_us: int,
                server_time_us: int, state: ServerState) -> bytes:
    buf = _common(MsgType.PONG, 0, key_id, request_id)
    buf += PONG_HDR.pack(echo_timestamp_us, server_time_us, int(state))
    return _finish(buf, secret)


def decode_response(datagram: bytes, secret: Secret) -> Response:
    """Parse and authenticate a response. A bad tag raises InvalidSignatureError (the
    client drops the datagram: it may be spoofed); an UNSIGNED frame is returned only when it
    is an ERROR (ErrorFrame.signed=False) and the caller decides how far to trust it."""
    mt, flags, key_id, rid = _parse_common(datagram)
    if mt in REQUEST_TYPES:
        raise MalformedError(f"{mt.name} is not a response", request_id=rid)
    if flags & ~UNSIGNED:
        raise MalformedError("unknown response flags", request_id=rid)
    unsigned = bool(flags & UNSIGNED)
    if unsigned:
        if mt is not MsgType.ERROR:
            raise InvalidSignatureError("only ERROR frames may be unsigned", request_id=rid)
    else:
        verify_tag(datagram, secret, request_id=rid)
    hlen = HEADER_LEN[mt]
    body = bytes(datagram[hlen:len(datagram) - TAG_LEN])
    if mt is MsgType.TOKEN:
        seq, run_id, n_tok, lp_len = TOKEN_HDR.unpack_from(datagram, COMMON_LEN)
        if lp_len > len(body):
            raise MalformedError("TOKEN lp_len past the body", request_id=rid)
        cut = len(body) - lp_len
        return TokenFrame(rid, seq, run_id, n_tok, _utf8(body[:cut], "TOKEN text"),
                          lp.decode_entries(body[cut:]) if lp_len else ())
    if mt is MsgType.ERROR:
        seq, run_id, code, _ = ERROR_HDR.unpack_from(datagram, COMMON_LEN)
        return ErrorFrame(rid, seq, run_id, code, body.decode("utf-8", "replace"),
                          signed=not unsigned, key_id=key_id)
    if body:
        raise MalformedError(f"{mt.name} carries no body", request_id=rid)
    if mt is MsgType.DONE:
        seq, run_id, finish, stop_index, p, c, g, *t = DONE_HDR.unpack_from(datagram, COMMON_LEN)
        try:
            fr = FinishReason(finish)
        except ValueError:
            raise MalformedError(f"unknown finish reason {finish}", request_id=rid) from None
        return DoneFrame(rid, seq, run_id, fr, Usage(p, c, g), Timings(*t), stop_index)
    if mt is MsgType.ACK:
        nseq, run_id, state, _, _, lease_ms = ACK_HDR.unpack_from(datagram, COMMON_LEN)
        try:
            st = RunState(state)
        except ValueError:
            raise MalformedError(f"unknown run state {state}", request_id=rid) from None
        return AckFrame(rid, nseq, run_id, st, lease_ms)
    echo, server_ts, state = PONG_HDR.unpack_from(datagram, COMMON_LEN)
    try:
        sst = ServerState(state)
    except ValueError:
        raise MalformedError(f"unknown server state {state}", request_id=rid) from None
    return PongFrame(rid, echo, server_ts, sst)


# A PONG's header in one struct: COMMON then PONG_HDR, both little-endian and unpadded.
_PONG_COMMON = struct.Struct("<" + COMMON.format.lstrip("<") + PONG_HDR.format.lstrip("<"))
_PONG_LEN = HEADER_LEN[MsgType.PONG] + TAG_LEN


class ResponseSigner:
    """Builds the signed frames of one request: the daemon gets one from each verified
    request, holding the secret that was current when the request was admitted, so a key
    rotation mid-stream does not cut a running answer."""

    __slots__ = ("key_id", "_secret", "request_id")

    def __init__(self, key_id: int, secret: Secret, request_id: bytes) -> None:
        if len(request_id) != REQUEST_ID_LEN:
            raise ValueError("request_id must be 16 bytes")
        self.key_id = key_id
        self._secret = as_mac(secret)
        self.request_id = request_id

    def __repr__(self) -> str:  # never print the secret
        return f"ResponseSigner(key_id={self.key_id}, request_id={self.request_id.hex()})"

    @property
    def mac(self) -> Mac:
        """The key this request was admitted under (verifies its later control messages
        after a rotation removed the key)."""
        return self._secret

    def token(self, seq: int, run_id: int, text: str | bytes, n_tokens: int,
              logprobs: bytes = b"") -> bytes:
        return encode_token(self._secret, self.key_id, self.request_id, seq, run_id, text,
                            n_tokens, logprobs)

    def done(self, seq: int, run_id: int, finish_reason: FinishReason, usage: Usage,
             timings: Timings, stop_index: int = 0) -> bytes:
        return encode_done(self._secret, self.key_id, self.request_id, seq, run_id,
                           finish_reason, usage, timings, stop_index)

    def error(self, code: ErrorCode, message: str = "", seq: int = NO_SEQ,
              run_id: int = 0) -> bytes:
        return encode_error(self._secret, self.key_id, self.request_id, code, message, seq,
                            run_id)

    def ack(self, next_seq: int, run_id: int, state: RunState, lease_ms: int) -> bytes:
        return encode_ack(self._secret, self.key_id, self.request_id, next_seq, run_id, state,
                          lease_ms)

    def pong(self, echo_timestamp_us: int, server_time_us: int, state: ServerState) -> bytes:
        # encode_pong's bytes, built in one step: a PONG is the daemon's whole answer to a
        # PING, and the general encoder's layers (a bytearray grown twice, the length check
        # a fixed-size frame cannot fail, the key's type check) are most of its cost.
        head = _PONG_COMMON.pack(MAGIC, VERSION, MsgType.PONG, HEADER_LEN[MsgType.PONG],
                                 _PONG_LEN, 0, self.key_id, self.request_id,
                                 echo_timestamp_us, server_time_us, int(state))
        return head + self._secret.tag(head)

