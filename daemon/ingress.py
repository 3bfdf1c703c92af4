"""Ingress pipeline: one received datagram → a verified request, a pending fragment, or a
rejection with the ERROR reply to send (if any).

This is the single entry point the daemon's receive loop calls (Ingress.feed). The order of
checks is the security argument of the protocol (docs/PROTOCOL.md §6), cheapest and
least-trusting first:

  1. structure (wire.parse_request): fixed offsets, lengths, fragment sanity. No key, no
     allocation beyond the parsed fields. The XDP program makes the same checks in the kernel.
  2. key id known (UNKNOWN_KEY), 3. the XDP tag if the datagram has one (or the daemon
     requires one), then the HMAC tag, constant-time (INVALID_SIGNATURE).
     Up to here nothing the sender says is trusted, and errors are answered UNSIGNED, only
     to request-shaped datagrams, and never with more bytes than the datagram had.
  4. timestamp within ±skew (INVALID_TIMESTAMP); DRAINING; total length (PAYLOAD_TOO_LARGE);
     nonce not already used (EXPIRED_NONCE).
  5. only now reassembly buffers anything (bounded: OVERLOADED when full), then the body
     digest, the nonce is burnt, the body decoded (MALFORMED), the context rule on what is
     known of the prompt's length (CONTEXT_OVERFLOW, `prompt_floor`).
From step 4 on the sender is a key holder, and errors are signed with its key.

The result cache (idempotency) comes after this, on the I/O thread; tokenization, and the
context rule on a text prompt's real length, on the engine thread.
"""
from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from zerolayer.gpu.context_rule import check_context
from zerolayer.protocol.errors import (
    DrainingError,
    ErrorCode,
    ExpiredNonceError,
    InvalidSignatureError,
    MalformedError,
    PayloadTooLargeError,
    UnknownKeyError,
    ZerolayerError,
)
from zerolayer.protocol.wire import (
    COMMON_LEN,
    MAGIC,
    MAX_MESSAGE_BYTES,
    REQUEST_TYPES,
    VERSION,
    XDP_TAG,
    ControlMessage,
    InvokeBody,
    InvokeFragment,
    Mac,
    MsgType,
    ResponseSigner,
    decode_invoke_body,
    encode_error,
    parse_request,
)
from zerolayer.protocol.xdp_tag import valid as xdp_tag_valid

from .auth import KeyStore, ReplayGuard
from .reassembly import Reassembler


@dataclass(frozen=True, slots=True)
class InvokeRequest:
    """A complete, authenticated, fresh INVOKE."""
    key_id: int
    request_id: bytes
    timestamp_us: int          # the client's clock, unix µs
    nonce: bytes
    body_sha256: bytes         # what the client's audit_log_hook recorded as the payload hash
    body: InvokeBody           # params + prompt / messages / token_ids
    received_at: float         # monotonic time its first datagram arrived (for ingress_us)
    fragments: int
    signer: ResponseSigner = field(repr=False)

    @property
    def cache_key(self) -> tuple[int, bytes]:
        return (self.key_id, self.request_id)


# Built for every datagram (a PING's whole answer starts here): named tuples, which cost a
# third of a frozen dataclass to make, and are as immutable.
class ControlRequest(NamedTuple):
    """An authenticated, fresh CANCEL, RESEND or PING."""
    msg_type: MsgType
    key_id: int
    request_id: bytes
    timestamp_us: int
    from_seq: int              # RESEND only; wire.NO_SEQ = keepalive (answer with an ACK)
    signer: ResponseSigner

    @property
    def cache_key(self) -> tuple[int, bytes]:
        return (self.key_id, self.request_id)


class Pending(NamedTuple):
    """A verified fragment was buffered; the request is not complete yet. Nothing to send."""
    key_id: int
    request_id: bytes


class Rejected(NamedTuple):
    code: ErrorCode
    message: str
    key_id: int | None
    request_id: bytes | None
    authenticated: bool        # the datagram's tag verified (the reply is signed)
    reply: bytes | None        # the ERROR datagram to send back, or None: stay silent


IngressResult = InvokeRequest | ControlRequest | Pending | Rejected


class Ingress:
    """The datagram-to-request parser. What it needs from the rest of the daemon is given at
    construction, as answers it asks for when a datagram needs them (each defaults to the
    answer of a daemon with nothing running):

    - require_xdp_tag: network.xdp_require_tag: a request without the XDP tag is refused here
      as the XDP program refuses it in the kernel (docs/PROTOCOL.md §6.6), on every carrier.
    - xdp_tag_valid(xdp key, datagram): the reference by default; the daemon gives the
      compiled one (daemon/xdp_tag_check.py), the same function at a fraction of the cost.
    - refuses_new(): whether the lifecycle's phase refuses new work (draining, stopping):
      asked of the lifecycle itself, so no copy of the phase can fall out of step with it.
    - context_len(): the model's context once it is loaded (0: not checked here). A request
      that cannot fit is refused before admission, so it never starts (PROTOCOL §4.2).
    - is_known((key id, request id)): is it in the result cache? A retry of a request
      already running or finished is not new work, so draining lets it through to attach
      or replay instead of failing a request that is being served.
    - admitted_mac((key id, request id)): the key a request still running was admitted
      under: a rotation that removes the key must not cut that request's RESEND,
      keepalives and CANCEL (PROTOCOL §6.1). New INVOKEs under a removed key are refused.
    """

    def __init__(self, keys: KeyStore, replay: ReplayGuard, reassembler: Reassembler, *,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 wall_clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 require_xdp_tag: bool = False,
                 xdp_tag_valid: Callable[[bytes, bytes], bool] = xdp_tag_valid,
                 refuses_new: Callable[[], bool] = lambda: False,
                 context_len: Callable[[], int] = lambda: 0,
                 is_known: Callable[[tuple[int, bytes]], bool] = lambda key: False,
                 admitted_mac: Callable[[tuple[int, bytes]], Mac | None] = lambda key: None,
                 ) -> None:
        self.keys = keys
        self.replay = replay
        self.reassembler = reassembler
        self.max_message_bytes = max_message_bytes
        self._require_xdp_tag = require_xdp_tag
        self._xdp_tag_valid = xdp_tag_valid
        self._refuses_new = refuses_new
        self._context_len = context_len
        self._is_known = is_known
        self._admitted_mac = admitted_mac
        self._wall = wall_clock
        self._mono = monotonic
        # One counter per error code (every refusal is counted by its code), plus the outcomes.
        self.errors: dict[ErrorCode, int] = {c: 0 for c in ErrorCode}
        self.stats = {"datagrams": 0, "invokes": 0, "controls": 0, "fragments_buffered": 0,
                      "replies_suppressed": 0, "internal_bugs": 0,
                      "rejected_bytes": 0, "reply_bytes": 0}

    def feed(self, datagram: bytes, now_mono: float | None = None) -> IngressResult:
        """Process one datagram (received at monotonic time now_mono, the clock given at
        construction by default). Never raises: a bug on a hostile input must not take the
        receive loop down (it becomes INTERNAL, counted, with no reply)."""
        self.stats["datagrams"] += 1
        try:
            return self._feed(datagram, self._mono() if now_mono is None else now_mono)
        except Exception as e:  # noqa: BLE001 - the loop's last line of defence
            self.stats["internal_bugs"] += 1
            self.errors[ErrorCode.INTERNAL] += 1
            return Rejected(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}", None, None,
                            False, None)

    def tick(self, now_mono: float | None = None, now_wall: float | None = None) -> int:
        """Housekeeping for the daemon's idle moments: drop timed-out reassemblies and
        forget nonces past their window. Returns the number of incomplete requests dropped."""
        self.replay.purge(self._wall() if now_wall is None else now_wall)
        return self.reassembler.expire(self._mono() if now_mono is None else now_mono)

    # -- internals ------------------------------------------------------------------------

    def _feed(self, dg: bytes, now_mono: float) -> IngressResult:
        try:
            req = parse_request(dg)
            secret = self.keys.mac(req.key_id)
            if (secret is None and isinstance(req, ControlMessage)
                    and req.msg_type in _ABOUT_A_REQUEST):
                secret = self._admitted_mac((req.key_id, req.request_id))
            if secret is None:
                raise UnknownKeyError(f"unknown key id {req.key_id}",
                                      request_id=req.request_id, key_id=req.key_id)
            # The XDP tag before the HMAC, in the kernel's order: a datagram the program
            # drops for its tag is refused here for the same reason.
            if req.flags & XDP_TAG:
                if not self._xdp_tag_valid(secret.xdp_key, dg):
                    raise InvalidSignatureError("XDP tag mismatch", request_id=req.request_id,
                                                key_id=req.key_id)
            elif self._require_xdp_tag:
                raise InvalidSignatureError("this daemon requires the XDP tag (flag XDP_TAG)",
                                            request_id=req.request_id, key_id=req.key_id)
            if not secret.verify(dg):
                raise InvalidSignatureError("tag mismatch", request_id=req.request_id,
                                            key_id=req.key_id)
        except ZerolayerError as e:
            return self._reject(e, dg, e.key_id, e.request_id, None)
        try:
            return self._authenticated(req, secret, now_mono)
        except ZerolayerError as e:
            return self._reject(e, dg, req.key_id, req.request_id, secret)

    def _authenticated(self, req: InvokeFragment | ControlMessage, secret: Mac,
                       now_mono: float) -> IngressResult:
        wall = self._wall()
        signer = ResponseSigner(req.key_id, secret, req.request_id)
        if isinstance(req, ControlMessage):
            self.replay.remember(req.nonce, req.timestamp_us, wall, req.key_id)
            self.stats["controls"] += 1
            return ControlRequest(req.msg_type, req.key_id, req.request_id, req.timestamp_us,
                                  req.arg, signer)
        self.replay.check_timestamp(req.timestamp_us, wall)
        if self._refuses_new() and not self._is_known((req.key_id, req.request_id)):
            raise DrainingError("server is draining; no new requests")
        if req.total_len > self.max_message_bytes:
            raise PayloadTooLargeError(
                f"body of {req.total_len} bytes > {self.max_message_bytes}")
        if req.frag_count == 1:
            body, started = req.body, now_mono
        else:
            # Fragments of a message already accepted (duplicates, replays) must not open a
            # new reassembly buffer.
            if self.replay.seen(req.nonce, wall):
                raise ExpiredNonceError("nonce already used")
            done = self.reassembler.add((req.key_id, req.request_id, req.nonce),
                                        req.frag_index, req.frag_count, req.total_len,
                                        req.chunk_len, req.body,
                                        meta=(req.timestamp_us, req.body_sha256), now=now_mono)
            if done is None:
                self.stats["fragments_buffered"] += 1
                return Pending(req.key_id, req.request_id)
            body, started = done
        if not hmac.compare_digest(hashlib.sha256(body).digest(), req.body_sha256):
            raise MalformedError("body does not match its SHA-256 in the header")
        self.replay.remember(req.nonce, req.timestamp_us, wall, req.key_id)
        ib = decode_invoke_body(body)
        if (limit := self._context_len()):
            n, exact = prompt_floor(ib)   # the runtime's error is the wire's CONTEXT_OVERFLOW
            check_context(n, ib.params.max_tokens, limit, at_least=not exact)
        self.stats["invokes"] += 1
        return InvokeRequest(req.key_id, req.request_id, req.timestamp_us, req.nonce,
                             req.body_sha256, ib, started, req.frag_count, signer)

    def _reject(self, e: ZerolayerError, dg: bytes, key_id: int | None,
                request_id: bytes | None, secret: Mac | None) -> Rejected:
        code = e.code if e.code is not None else ErrorCode.INTERNAL
        self.errors[code] += 1
        reply: bytes | None = None
        if request_id is not None and _request_shaped(dg):
            # Never more bytes than came in, signed or not (docs/PROTOCOL.md §7): the sender
            # may be spoofed (unsigned case), and a captured datagram replayed forever must
            # not buy more bytes back than it costs (a replay is refused with a signed
            # EXPIRED_NONCE or INVALID_TIMESTAMP). The message text is cut to fit; a
            # datagram too short for an empty ERROR gets no answer.
            reply = encode_error(secret, key_id or 0, request_id, code, e.message,
                                 max_len=len(dg))
            if len(reply) > len(dg):
                reply = None
        if reply is None:
            self.stats["replies_suppressed"] += 1
        self.stats["rejected_bytes"] += len(dg)
        self.stats["reply_bytes"] += len(reply or b"")
        return Rejected(code, e.message, key_id, request_id, secret is not None, reply)


def prompt_floor(body: InvokeBody) -> tuple[int, bool]:
    """What the I/O thread knows of a prompt's length in tokens, in O(1): (count, exact).
    Token ids are counted exactly. A text is tokenized only on the engine thread, but a
    non-empty one has at least one token (an empty one is MALFORMED there), so a text whose
    max_tokens alone fills the context is refused here too."""
    if body.token_ids is not None:
        return len(body.token_ids), True
    return (1 if body.payload else 0), False


# Control messages about a request already admitted: verified with the key it was admitted
# under even after a rotation removed that key (docs/PROTOCOL.md §6.1). A PING is about no
# request: under a removed key it is UNKNOWN_KEY, as an INVOKE is.
_ABOUT_A_REQUEST = frozenset({MsgType.CANCEL, MsgType.RESEND})


def _request_shaped(dg: bytes) -> bool:
    """Only answer datagrams that claim to be v1 requests: never a response-typed or
    foreign datagram, or two servers could be made to answer each other forever."""
    return (len(dg) >= COMMON_LEN and dg[:4] == MAGIC and dg[4] == VERSION
            and dg[5] in REQUEST_TYPES)
