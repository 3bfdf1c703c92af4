"""One request's reliability logic, without any I/O: the SDK's protocol state machine.

The sync Client and the asyncio AsyncClient both drive this same machine, so their
semantics cannot drift apart. A driver feeds it datagrams (`on_datagram`) and timer wake-ups
(`on_timer`), sends what it returns, and waits at most `wait_s()` between calls. Time comes
from an injectable clock. The rules (docs/PROTOCOL.md §7-§8.6):

- An attempt = one signed INVOKE with a fresh 32-byte nonce and the current timestamp. The
  request id stays the same across attempts, so the daemon's result cache makes a retry
  attach to (or replay) the first run instead of running the model again.
- No ACK or frame within ack_timeout_s → a new attempt, the wait doubling each time (up to
  backoff_max_s, 2 s). Retryable errors (OVERLOADED, DRAINING, INTERNAL, EXPIRED_NONCE
  before acceptance) → a new attempt after an exponential, jittered backoff (also ≤ 2 s).
- The recovery window is `timeout` (45 s): attempts go on, at most 2 s apart, until `timeout`
  seconds pass without any authenticated datagram from the daemon for this request; then
  the call fails with the last retryable refusal, or ZerolayerTimeoutError. `max_attempts`
  optionally caps the attempts by count; `total_timeout` caps a whole call.
- A restartable request (invoke(): the caller sees no text until the end) starts over when a
  restarted daemon runs it again (a new run id); a stream that already handed out text
  raises StreamRestartedError.
- TOKEN/DONE frames carry sequence numbers; a hole is filled with RESEND(first missing seq).
- While waiting, a keepalive (RESEND from NO_SEQ, answered by ACK) renews the lease every
  lease/4, and after probe_interval_s of silence. If the daemon stays silent for
  contact_timeout_s the INVOKE is re-sent (the daemon may have restarted).
- Frames that fail the HMAC check are dropped. Unsigned ERROR frames are believed only for
  the pre-authentication codes, only if they echo our random request id, and only before
  the daemon has accepted the request.
"""
from __future__ import annotations

import hashlib
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import (ERROR_INFO, ErrorCode, StreamRestartedError, ZerolayerError,
                     ZerolayerTimeoutError, error_for)
from .transport import Routed
from .wire import (MAX_CHUNK, NO_SEQ, NONCE_LEN, REQUEST_ID_LEN, AckFrame, DoneFrame, ErrorFrame, Mac,
                   MsgType, PongFrame, Response, Timings, TokenFrame, Usage, decode_response,
                   encode_control, encode_invoke)

AuditHook = Callable[[bytes, bytes, int], None]
Clock = Callable[[], float]

# Pre-authentication errors the daemon can only send unsigned (it could not, or did not yet,
# verify us); any other unsigned frame is a spoof.
UNSIGNED_OK = frozenset({ErrorCode.UNKNOWN_KEY, ErrorCode.INVALID_SIGNATURE,
                         ErrorCode.MALFORMED})


@dataclass(frozen=True, slots=True)
class InvokeResult:
    text: str
    usage: Usage
    timings: Timings                 # measured by the daemon, µs
    finish_reason: str               # "stop" | "length" | "cancelled"
    request_id: bytes
    ttft_s: float | None             # client-measured: first send → first text chunk
    elapsed_s: float                 # client-measured: first send → DONE
    attempts: int                    # INVOKE attempts sent (1 = no retry)
    restarts: int = 0                # times a new run replaced one (a restarted or other node)
    node: str | None = None          # the fleet node that answered (None: a single daemon)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The SDK's timers (docs/PROTOCOL.md §8.6) and the identity that signs requests."""
    key_id: int
    mac: Mac
    timeout: float = 45.0
    total_timeout: float | None = None
    max_attempts: int | None = None
    ack_timeout_s: float = 0.2
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0
    resend_interval_s: float = 0.03
    probe_interval_s: float = 0.25
    contact_timeout_s: float = 2.0
    chunk_len: int = MAX_CHUNK
    pace_burst: int = 64
    pace_gap_s: float = 0.0002
    audit_log_hook: AuditHook | None = None
    failover_after_s: float = 1.0    # a fleet node silent this long: try the next one

    def may_retry(self, attempts: int) -> bool:
        """Whether another attempt may follow `attempts` sent (the window is the caller's)."""
        return self.max_attempts is None or attempts < self.max_attempts

    def ack_wait(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.ack_timeout_s * (2.0 ** attempt))

    def backoff(self, attempt: int) -> float:
        base = min(self.backoff_max_s, self.backoff_initial_s * (2.0 ** attempt))
        return base * (0.5 + random.random() / 2)   # jitter: no synchronised retry storms

    def pause_before(self, i: int) -> float:
        """Seconds to pause before sending fragment i of an attempt. Small requests go out
        at once; past the first burst, fragments are paced so a large request does not
        overrun the daemon's socket buffer in one blast (a lost fragment costs the whole
        request a retry: v1 has no per-fragment NACK)."""
        burst = self.pace_burst
        if i >= burst and i % (burst // 4 or 1) == 0 and self.pace_gap_s > 0:
            return self.pace_gap_s
        return 0.0

    def control(self, mt: MsgType, request_id: bytes, arg: int = 0) -> bytes:
        return encode_control(mt, self.key_id, self.mac, request_id, now_us(),
                              secrets.token_bytes(NONCE_LEN), arg)


def now_us() -> int:
    return time.time_ns() // 1000


def authenticate(datagram: bytes, mac: Mac, request_id: bytes) -> Response | None:
    """The datagram as a frame for this request, or None (forged, corrupted, foreign,
    or an unsigned error of a kind the daemon never sends unsigned)."""
    try:
        frame = decode_response(datagram, mac)
    except ZerolayerError:
        return None
    if frame.request_id != request_id:
        return None
    if isinstance(frame, ErrorFrame) and not frame.signed:
        try:
            if ErrorCode(frame.code) not in UNSIGNED_OK:
                return None
        except ValueError:
            return None
    return frame


class PingAttempts:
    """Client.ping()'s rule, for both drivers: attempts at the ack-wait intervals within the
    recovery window; a PONG ends it with the round trip, a final error raises, a retryable
    one (signed) is remembered and raised if nothing better follows."""

    def __init__(self, policy: RetryPolicy, clock: Clock = time.monotonic) -> None:
        self._p = policy
        self._clock = clock
        self.request_id = secrets.token_bytes(REQUEST_ID_LEN)
        self._deadline = clock() + policy.timeout
        self._refusal: ZerolayerError | None = None
        self._attempt = 0
        self._sent = 0.0

    def next(self) -> tuple[bytes, float] | None:
        """The next PING to send and when to stop waiting for its answer; None: give up."""
        now = self._clock()
        if not self._p.may_retry(self._attempt) or (self._attempt and now >= self._deadline):
            return None
        self._attempt += 1
        self._sent = now
        return (self._p.control(MsgType.PING, self.request_id),
                min(self._deadline, now + self._p.ack_wait(self._attempt - 1)))

    def on_datagram(self, datagram: bytes) -> float | None:
        """The round trip in seconds if this is our PONG; raises a final error."""
        frame = authenticate(datagram, self._p.mac, self.request_id)
        if isinstance(frame, PongFrame):
            return self._clock() - self._sent
        if isinstance(frame, ErrorFrame):
            exc = error_for(frame.code, frame.message, request_id=self.request_id)
            assert exc.code is not None
            if not (frame.signed and ERROR_INFO[exc.code].retryable):
                raise exc
            self._refusal = exc
        return None

    def give_up(self) -> ZerolayerError:
        return self._refusal or ZerolayerTimeoutError("no PONG", request_id=self.request_id)


class RequestMachine:
    """The state of one INVOKE in flight. Methods that return list[bytes] return datagrams
    the driver must send now, in order (pacing them with policy.pause_before). Methods raise
    ZerolayerError when the request has failed; the machine is then closed."""

    def __init__(self, policy: RetryPolicy, body: bytes, request_id: bytes,
                 clock: Clock = time.monotonic, route: Routed | None = None) -> None:
        self._p = policy
        self._route = route            # a fleet channel: the request may move to the next node
        self._clock = clock
        self._body = body
        self._digest = hashlib.sha256(body).digest()
        self.request_id = request_id
        self.result: InvokeResult | None = None
        self.closed = False
        self.restartable = False       # set by invoke(): a new run may replace an old one
        self._t0 = clock()
        # Inactivity deadline, pushed forward by every authenticated datagram; the hard one
        # (total_timeout) never moves.
        self._hard_deadline = (self._t0 + policy.total_timeout
                               if policy.total_timeout is not None else float("inf"))
        self._deadline = min(self._t0 + policy.timeout, self._hard_deadline)
        self.attempts = 0
        self._attempt_sent = 0.0
        self._next_attempt_at: float | None = None   # a backoff-delayed retry
        # The last retryable refusal (OVERLOADED, DRAINING, ...): if the retries after it go
        # unanswered (a drained daemon has exited), that refusal is what the caller is told.
        self._last_refusal: ZerolayerError | None = None
        self._accepted = False
        self._run_id: int | None = None
        self._frames: dict[int, TokenFrame | DoneFrame] = {}
        self._next_seq = 0             # next sequence number to hand out
        self._known_end = 0            # frames known to exist (from ACK / later frames)
        self._chunks: list[str] = []
        self._delivered = False
        self._ttft: float | None = None
        self._last_heard = self._t0
        self._last_sent = self._t0
        self._last_resend = -1.0
        self._lease_s = 10.0
        self._cancel_sent_at: float | None = None
        self._node_since = self._t0    # when the request moved to its current node
        self.restarts = 0
        self.failovers = 0

    # -- what the driver calls ------------------------------------------------------------

    def start(self) -> list[bytes]:
        """The first attempt. The audit hook runs here: if it raises, nothing is sent."""
        return self._attempt()

    def pop_ready(self) -> str | None:
        """The next text chunk in sequence order, or None. A DONE at the head sets result."""
        while self._next_seq in self._frames:
            f = self._frames.pop(self._next_seq)
            self._next_seq += 1
            if isinstance(f, DoneFrame):
                self._finish(f)
                return None
            if f.text:
                self._chunks.append(f.text)
                if self._ttft is None:
                    self._ttft = self._clock() - self._t0
                self._delivered = True
                return f.text
        return None

    def wait_s(self) -> float:
        """How long the driver may wait for a datagram before calling on_timer. Raises the
        final error once the recovery window (or total_timeout) has run out."""
        now = self._clock()
        if now >= self._deadline:
            if self._last_refusal is not None and not self._accepted:
                self._fail(self._last_refusal)
            what = ("total_timeout" if now >= self._hard_deadline
                    else f"{self._p.timeout} s without an answer")
            self._fail(ZerolayerTimeoutError(
                f"gave up: {what}, after {self.attempts} attempt(s)",
                request_id=self.request_id))
        return max(0.0, min(self._next_timer(), self._deadline) - now)

    def on_datagram(self, datagram: bytes) -> list[bytes]:
        frame = authenticate(datagram, self._p.mac, self.request_id)
        if frame is None:
            return []
        return self._on_frame(frame)

    def on_timer(self) -> list[bytes]:
        p, now = self._p, self._clock()
        if self._next_attempt_at is not None:
            if now >= self._next_attempt_at:
                self._next_attempt_at = None
                return self._attempt()
            return []
        if not self._accepted:
            if now >= self._attempt_sent + p.ack_wait(self.attempts - 1):
                if now - max(self._last_heard, self._node_since) >= p.failover_after_s:
                    self._failover()           # this node is silent: the next one, if any
                return self._retry_or_wait()
            return []
        if now - self._last_heard >= p.contact_timeout_s:
            # The daemon stopped answering even keepalives: re-send the request. Same
            # request id: if it is still running there, this attaches to it.
            self._last_heard = now
            self._accepted = False
            return self._retry_or_wait()
        if self._cancel_sent_at is not None and now - self._cancel_sent_at >= p.probe_interval_s:
            return self.cancel()
        if self._gap() and now - self._last_resend >= p.resend_interval_s:
            self._last_resend = now
            return [self._control(MsgType.RESEND, self._next_seq)]
        if (now - self._last_sent >= self._lease_s / 4
                or now - max(self._last_heard, self._last_sent) >= p.probe_interval_s):
            return [self._control(MsgType.RESEND, NO_SEQ)]   # keepalive / status probe
        return []

    def cancel(self) -> list[bytes]:
        """A CANCEL to send; the machine keeps re-sending it until the final DONE."""
        self._cancel_sent_at = self._clock()
        return [self._control(MsgType.CANCEL)]

    def close(self) -> list[bytes]:
        """Mark closed; a best-effort CANCEL to send if the request is unfinished."""
        unfinished = self.result is None and not self.closed
        self.closed = True
        return [self._control(MsgType.CANCEL)] if unfinished else []

    @property
    def finished(self) -> bool:
        return self.result is not None or self.closed

    # -- internals -----------------------------------------------------------------------

    def _finish(self, d: DoneFrame) -> None:
        self.result = InvokeResult("".join(self._chunks), d.usage, d.timings,
                                   d.finish_reason.label, self.request_id, self._ttft,
                                   self._clock() - self._t0, self.attempts, self.restarts,
                                   self._route.node if self._route is not None else None)

    def _failover(self) -> bool:
        """Move the request to the next node of its rendezvous order (fleet channels only).
        Every later attempt goes there; its result cache is empty for this request, so it
        runs it afresh, under a new run id the client notices."""
        if self._route is None or self._route.failover() is None:
            return False
        self.failovers += 1
        self._node_since = self._clock()
        return True

    def _gap(self) -> bool:
        return self._next_seq < self._known_end and self._next_seq not in self._frames

    def _next_timer(self) -> float:
        p = self._p
        if self._next_attempt_at is not None:
            return self._next_attempt_at
        if not self._accepted:
            return self._attempt_sent + p.ack_wait(self.attempts - 1)
        t = min(self._last_heard + p.contact_timeout_s,
                self._last_sent + self._lease_s / 4,
                max(self._last_heard, self._last_sent) + p.probe_interval_s)
        if self._gap():
            t = min(t, self._last_resend + p.resend_interval_s)
        if self._cancel_sent_at is not None:
            t = min(t, self._cancel_sent_at + p.probe_interval_s)
        return t

    def _retry_or_wait(self) -> list[bytes]:
        if self._p.may_retry(self.attempts):
            return self._attempt()
        # Out of attempts: keep listening (a late answer still counts) until the deadline.
        self._attempt_sent = self._deadline
        return []

    def _on_frame(self, f: Response) -> list[bytes]:
        if isinstance(f, ErrorFrame) and not f.signed:
            self._on_error(f)       # believed or not, it is no sign of a live daemon
            return []
        now = self._clock()
        self._last_heard = now
        self._deadline = min(now + self._p.timeout, self._hard_deadline)
        if isinstance(f, ErrorFrame):
            self._on_error(f)
            return []
        if isinstance(f, PongFrame):
            return []
        run_id = f.run_id
        if run_id:
            if self._run_id is None:
                self._run_id = run_id
            elif run_id != self._run_id:
                self.restarts += 1
                if self._delivered and self.restartable:
                    # invoke(): nothing reached the caller, start over on the new run
                    self._chunks.clear()
                    self._next_seq = 0
                    self._delivered = False
                    self._ttft = None
                elif self._delivered:
                    self._fail(StreamRestartedError(
                        "the daemon started a new run for this request after text was "
                        "delivered; retry with a new request id", request_id=self.request_id))
                # Nothing delivered yet: adopt the new run and forget the old one's frames.
                self._run_id = run_id
                self._frames.clear()
                self._known_end = 0
        self._accepted = True
        self._next_attempt_at = None
        if isinstance(f, AckFrame):
            self._lease_s = max(f.lease_ms / 1000.0, 0.1) if f.lease_ms else self._lease_s
            self._known_end = max(self._known_end, f.next_seq)
            return []
        if f.seq >= self._next_seq:
            self._frames[f.seq] = f
        self._known_end = max(self._known_end, f.seq + 1)
        return []

    def _on_error(self, f: ErrorFrame) -> None:
        try:
            code: ErrorCode | None = ErrorCode(f.code)
        except ValueError:
            code = None
        exc = error_for(f.code, f.message, request_id=self.request_id)
        if not f.signed and self._accepted:
            return                      # the daemon verified us already: this is a spoof
        if code is ErrorCode.EXPIRED_NONCE and self._accepted:
            return                      # a duplicated datagram of an accepted attempt
        if (f.signed and code is not None and ERROR_INFO[code].retryable
                and not self._delivered and self._p.may_retry(self.attempts)):
            # Retry the same request id later with a fresh nonce.
            self._last_refusal = exc
            self._accepted = False
            self._frames.clear()
            self._known_end = 0
            self._run_id = None
            if code is ErrorCode.DRAINING and self._failover():
                self._next_attempt_at = self._clock()   # the next node, at once
                return
            self._next_attempt_at = self._clock() + self._p.backoff(self.attempts - 1)
            return
        self._fail(exc)

    def _fail(self, exc: ZerolayerError) -> None:
        self.closed = True
        raise exc

    def _attempt(self) -> list[bytes]:
        p = self._p
        ts = now_us()
        frags = encode_invoke(p.key_id, p.mac, self.request_id, ts,
                              secrets.token_bytes(NONCE_LEN), self._body, p.chunk_len)
        if p.audit_log_hook is not None:
            p.audit_log_hook(self._digest, frags[0][-32:], ts)
        self.attempts += 1
        # The driver sends these right away: the timers count from now.
        self._attempt_sent = self._last_sent = self._clock()
        return list(frags)

    def _control(self, mt: MsgType, arg: int = 0) -> bytes:
        self._last_sent = self._clock()
        return self._p.control(mt, self.request_id, arg)
