"""One request's reliability logic, without any I/O and without a clock: the SDK's protocol
state machine.

The sync Client and the asyncio AsyncClient both drive this same machine, so their
semantics cannot drift apart. It is sans-IO in aioquic's manner: time is an argument, never
read. A driver passes `now` (monotonic seconds) to every call, and the random generator and
the wall clock for signed timestamps at construction; it feeds the machine datagrams
(`receive`) and timer wake-ups (`handle_timer`), sends what they return, and calls
handle_timer no later than `get_timer()`. A test can therefore drive it on a fake clock and
check a 30 s recovery in milliseconds. The rules (docs/PROTOCOL.md §7-§8.6):

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
- Logprobs (asked in the INVOKE body) ride in the TOKEN frames; they are assembled per token
  in sequence order, as the text is, and count as delivered like text (a stream that handed
  some out cannot switch to a new run).
- Frames that fail the HMAC check are dropped. Unsigned ERROR frames are believed only for
  the pre-authentication codes, only if they echo our random request id, and only before
  the daemon has accepted the request.
"""
from __future__ import annotations

import enum
import hashlib
import random
from dataclasses import dataclass

from zerolayer.protocol.errors import (
    ERROR_INFO,
    ErrorCode,
    StreamRestartedError,
    ZerolayerError,
    ZerolayerTimeoutError,
    error_for,
)
from zerolayer.protocol.logprobs import Positions, TokenLogprob
from zerolayer.protocol.wire import (
    NO_SEQ,
    NONCE_LEN,
    AckFrame,
    DoneFrame,
    ErrorFrame,
    MsgType,
    PongFrame,
    Response,
    Timings,
    TokenFrame,
    Usage,
    asks_logprobs,
    decode_invoke_body,
    encode_invoke,
)

from .retry_policy import SYSTEM_RANDOM, RetryPolicy, WallClock, authenticate, unix_us
from .transport import Routed

__all__ = ["InvokeResult", "Phase", "RequestMachine"]


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
    stop_sequence: str | None = None  # the stop string that ended it (finish_reason "stop")
    # one per sampled token (EOS aside), when the request asked for logprobs; else None
    logprobs: tuple[TokenLogprob, ...] | None = None


class Phase(enum.Enum):
    """Where a request stands; `handle_timer` is a dispatch on it.

    AWAITING_ACK  an attempt is out and nothing vouches for it yet: after the ack wait, the
                  next attempt (or, on a fleet, the next node first).
    BACKING_OFF   a signed retryable refusal: the next attempt at a jittered time.
    ACCEPTED      the daemon runs it: resends, keepalives, and after contact_timeout_s of
                  silence the INVOKE again (→ AWAITING_ACK).
    DONE          the DONE frame was handed out in order; `result` is set.
    CLOSED        failed (the error was raised) or closed by the caller.

    Every authenticated frame but an error or a PONG moves AWAITING_ACK / BACKING_OFF to
    ACCEPTED; DONE and CLOSED are final, so no late datagram revives a finished request.
    """
    AWAITING_ACK = "awaiting_ack"
    BACKING_OFF = "backing_off"
    ACCEPTED = "accepted"
    DONE = "done"
    CLOSED = "closed"


FINAL = frozenset({Phase.DONE, Phase.CLOSED})


class RequestMachine:
    """The state of one INVOKE in flight. Methods that return list[bytes] return datagrams
    the driver must send now, in order (pacing them with policy.pause_before). Methods raise
    ZerolayerError when the request has failed; the machine is then CLOSED."""

    def __init__(self, policy: RetryPolicy, body: bytes, request_id: bytes, now: float, *,
                 rng: random.Random = SYSTEM_RANDOM, wall_us: WallClock = unix_us,
                 route: Routed | None = None) -> None:
        self._p = policy
        self._rng = rng
        self._wall_us = wall_us
        self._route = route            # a fleet channel: the request may move to the next node
        self._body = body
        self._digest = hashlib.sha256(body).digest()
        self.request_id = request_id
        self.result: InvokeResult | None = None
        self.phase = Phase.AWAITING_ACK
        self.restartable = False       # set by invoke(): a new run may replace an old one
        self._t0 = now
        # Inactivity deadline, pushed forward by every authenticated datagram; the hard one
        # (total_timeout) never moves.
        self._hard_deadline = (now + policy.total_timeout
                               if policy.total_timeout is not None else float("inf"))
        self._deadline = min(now + policy.timeout, self._hard_deadline)
        self.attempts = 0
        self._attempt_sent = 0.0
        self._next_attempt_at = 0.0    # BACKING_OFF: when the retry goes out
        # The last retryable refusal (OVERLOADED, DRAINING, ...): if the retries after it go
        # unanswered (a drained daemon has exited), that refusal is what the caller is told.
        self._last_refusal: ZerolayerError | None = None
        self._run_id: int | None = None
        self._frames: dict[int, TokenFrame | DoneFrame] = {}
        self._next_seq = 0             # next sequence number to hand out
        self._known_end = 0            # frames known to exist (from ACK / later frames)
        self._chunks: list[str] = []
        self._positions = Positions() if asks_logprobs(body) else None
        self._delivered = False
        self._ttft: float | None = None
        self._last_heard = now
        self._last_sent = now
        self._last_resend = -1.0
        self._lease_s = 10.0
        self._cancel_sent_at: float | None = None
        self._node_since = now         # when the request moved to its current node
        self.restarts = 0
        self.failovers = 0

    # -- what the driver calls ------------------------------------------------------------

    def start(self, now: float) -> list[bytes]:
        """The first attempt. The audit hook runs here: if it raises, nothing is sent."""
        return self._attempt(now)

    def pop_ready(self, now: float) -> str | None:
        """The next text chunk in sequence order, or None. A DONE at the head sets result."""
        while self._next_seq in self._frames:
            f = self._frames.pop(self._next_seq)
            self._next_seq += 1
            if isinstance(f, DoneFrame):
                self._finish(f, now)
                return None
            if f.logprobs and self._positions is not None:
                self._positions.feed(f.logprobs)
                self._delivered = True
            if f.text:
                self._chunks.append(f.text)
                if self._ttft is None:
                    self._ttft = now - self._t0
                self._delivered = True
                return f.text
        return None

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """The tokens' logprobs handed out so far (empty when not asked)."""
        return self._positions.done if self._positions is not None else []

    def get_timer(self) -> float:
        """The time at which the driver must call handle_timer if no datagram came first;
        never later than the deadline, so handle_timer is where the request times out."""
        return min(self._next_timer(), self._deadline)

    def receive(self, datagram: bytes, now: float) -> list[bytes]:
        frame = authenticate(datagram, self._p.mac, self.request_id)
        if frame is None:
            return []
        return self._on_frame(frame, now)

    def handle_timer(self, now: float) -> list[bytes]:
        """What is due at `now`. Raises the final error once the recovery window (or
        total_timeout) has run out."""
        if now >= self._deadline:
            self._time_out(now)
        if self.phase is Phase.BACKING_OFF:
            return self._backoff_timer(now)
        if self.phase is Phase.AWAITING_ACK:
            return self._ack_timer(now)
        if self.phase is Phase.ACCEPTED:
            return self._accepted_timer(now)
        return []

    def cancel(self, now: float) -> list[bytes]:
        """A CANCEL to send; the machine keeps re-sending it until the final DONE."""
        self._cancel_sent_at = now
        return [self._control(MsgType.CANCEL, now)]

    def close(self, now: float) -> list[bytes]:
        """Mark closed; a best-effort CANCEL to send if the request is unfinished."""
        if self.phase in FINAL:
            return []
        self.phase = Phase.CLOSED
        return [self._control(MsgType.CANCEL, now)]

    @property
    def finished(self) -> bool:
        return self.phase in FINAL

    # -- the timer, per phase ------------------------------------------------------------

    def _backoff_timer(self, now: float) -> list[bytes]:
        return self._attempt(now) if now >= self._next_attempt_at else []

    def _ack_timer(self, now: float) -> list[bytes]:
        p = self._p
        if now < self._attempt_sent + p.ack_wait(self.attempts - 1):
            return []
        if now - max(self._last_heard, self._node_since) >= p.failover_after_s:
            self._failover(now)            # this node is silent: the next one, if any
        return self._retry_or_wait(now)

    def _accepted_timer(self, now: float) -> list[bytes]:
        p = self._p
        if now - self._last_heard >= p.contact_timeout_s:
            # The daemon stopped answering even keepalives: re-send the request. Same
            # request id: if it is still running there, this attaches to it.
            self._last_heard = now
            self.phase = Phase.AWAITING_ACK
            return self._retry_or_wait(now)
        if self._cancel_sent_at is not None and now - self._cancel_sent_at >= p.probe_interval_s:
            return self.cancel(now)
        if self._gap() and now - self._last_resend >= p.resend_interval_s:
            self._last_resend = now
            return [self._control(MsgType.RESEND, now, self._next_seq)]
        if (now - self._last_sent >= self._lease_s / 4
                or now - max(self._last_heard, self._last_sent) >= p.probe_interval_s):
            return [self._control(MsgType.RESEND, now, NO_SEQ)]   # keepalive / status probe
        return []

    def _next_timer(self) -> float:
        p = self._p
        if self.phase is Phase.BACKING_OFF:
            return self._next_attempt_at
        if self.phase is not Phase.ACCEPTED:
            return self._attempt_sent + p.ack_wait(self.attempts - 1)
        t = min(self._last_heard + p.contact_timeout_s,
                self._last_sent + self._lease_s / 4,
                max(self._last_heard, self._last_sent) + p.probe_interval_s)
        if self._gap():
            t = min(t, self._last_resend + p.resend_interval_s)
        if self._cancel_sent_at is not None:
            t = min(t, self._cancel_sent_at + p.probe_interval_s)
        return t

    # -- internals -----------------------------------------------------------------------

    def _time_out(self, now: float) -> None:
        if self._last_refusal is not None and self.phase is not Phase.ACCEPTED:
            self._fail(self._last_refusal)
        what = ("total_timeout" if now >= self._hard_deadline
                else f"{self._p.timeout} s without an answer")
        self._fail(ZerolayerTimeoutError(
            f"gave up: {what}, after {self.attempts} attempt(s)", request_id=self.request_id))

    def _finish(self, d: DoneFrame, now: float) -> None:
        self.result = InvokeResult("".join(self._chunks), d.usage, d.timings,
                                   d.finish_reason.label, self.request_id, self._ttft,
                                   now - self._t0, self.attempts, self.restarts,
                                   self._route.node if self._route is not None else None,
                                   self._stop_sequence(d.stop_index),
                                   tuple(self._positions.done)
                                   if self._positions is not None else None)
        self.phase = Phase.DONE

    def _stop_sequence(self, k: int) -> str | None:
        """The request's k-th stop string (1-based; 0: none), from its own INVOKE body."""
        if k <= 0:
            return None
        stops = decode_invoke_body(self._body).params.stop
        return stops[k - 1] if k <= len(stops) else None

    def _failover(self, now: float) -> bool:
        """Move the request to the next node of its rendezvous order (fleet channels only).
        Every later attempt goes there; its result cache is empty for this request, so it
        runs it afresh, under a new run id the client notices."""
        if self._route is None or self._route.failover() is None:
            return False
        self.failovers += 1
        self._node_since = now
        return True

    def _gap(self) -> bool:
        return self._next_seq < self._known_end and self._next_seq not in self._frames

    def _retry_or_wait(self, now: float) -> list[bytes]:
        if self._p.may_retry(self.attempts):
            return self._attempt(now)
        # Out of attempts: keep listening (a late answer still counts) until the deadline.
        self._attempt_sent = self._deadline
        return []

    def _on_frame(self, f: Response, now: float) -> list[bytes]:
        if isinstance(f, ErrorFrame) and not f.signed:
            self._on_error(f, now)  # believed or not, it is no sign of a live daemon
            return []
        self._last_heard = now
        self._deadline = min(now + self._p.timeout, self._hard_deadline)
        if isinstance(f, ErrorFrame):
            self._on_error(f, now)
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
                    if self._positions is not None:
                        self._positions.clear()
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
        if self.phase not in FINAL:
            self.phase = Phase.ACCEPTED
        if isinstance(f, AckFrame):
            self._lease_s = max(f.lease_ms / 1000.0, 0.1) if f.lease_ms else self._lease_s
            self._known_end = max(self._known_end, f.next_seq)
            return []
        if f.seq >= self._next_seq:
            self._frames[f.seq] = f
        self._known_end = max(self._known_end, f.seq + 1)
        return []

    def _on_error(self, f: ErrorFrame, now: float) -> None:
        try:
            code: ErrorCode | None = ErrorCode(f.code)
        except ValueError:
            code = None
        exc = error_for(f.code, f.message, request_id=self.request_id)
        accepted = self.phase is Phase.ACCEPTED
        if not f.signed and accepted:
            return                      # the daemon verified us already: this is a spoof
        if code is ErrorCode.EXPIRED_NONCE and accepted:
            return                      # a duplicated datagram of an accepted attempt
        if (f.signed and code is not None and ERROR_INFO[code].retryable
                and not self._delivered and self._p.may_retry(self.attempts)):
            # Retry the same request id later with a fresh nonce.
            self._last_refusal = exc
            self._frames.clear()
            self._known_end = 0
            self._run_id = None
            self.phase = Phase.BACKING_OFF
            if code is ErrorCode.DRAINING and self._failover(now):
                self._next_attempt_at = now    # the next node, at once
                return
            self._next_attempt_at = now + self._p.backoff(self.attempts - 1, self._rng)
            return
        self._fail(exc)

    def _fail(self, exc: ZerolayerError) -> None:
        self.phase = Phase.CLOSED
        raise exc

    def _attempt(self, now: float) -> list[bytes]:
        p = self._p
        ts = self._wall_us()
        frags = encode_invoke(p.key_id, p.mac, self.request_id, ts,
                              self._rng.randbytes(NONCE_LEN), self._body, p.chunk_len,
                              xdp_tag=p.xdp_tag)
        if p.audit_log_hook is not None:
            p.audit_log_hook(self._digest, frags[0][-32:], ts)
        self.attempts += 1
        self.phase = Phase.AWAITING_ACK
        # The driver sends these right away: the timers count from now.
        self._attempt_sent = self._last_sent = now
        return list(frags)

    def _control(self, mt: MsgType, now: float, arg: int = 0) -> bytes:
        self._last_sent = now
        return self._p.control(mt, self.request_id, arg, ts_us=self._wall_us(), rng=self._rng)
