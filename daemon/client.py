"""Client SDK: `Client.invoke()`, `Client.stream()` and `Client.ping()` over UDP.

    from zerolayer.daemon.client import Client
    c = Client(("127.0.0.1", 7700), key_id=1, secret="…hex…", timeout=30)
    print(c.invoke(prompt="The capital of France is", max_tokens=8).text)

    with c.stream(messages=[ChatMessage("user", "Hi")]) as s:
        for chunk in s:          # str chunks, in order, each valid text
            print(chunk, end="")
    print(s.result.usage)        # InvokeResult, set once the iteration ended

Reliability over UDP (docs/PROTOCOL.md §7), all inside the SDK:
- An attempt = one signed INVOKE with a fresh 32-byte nonce and the current timestamp. The
  request id stays the same across attempts, so the daemon's result cache makes a retry
  attach to (or replay) the first run instead of running the model again.
- No ACK or frame within ack_timeout_s → a new attempt, the wait doubling each time (up to
  backoff_max_s, 2 s). Retryable errors (OVERLOADED, DRAINING, INTERNAL, EXPIRED_NONCE
  before acceptance) → a new attempt after an exponential, jittered backoff (also ≤ 2 s).
- The recovery window is `timeout` (45 s): attempts go on, at most 2 s apart, until `timeout`
  seconds pass without any authenticated datagram from the daemon for this request; then
  the call fails with the last retryable refusal, or ZerolayerTimeoutError. So a daemon that
  dies and is serving again within 30 s (a restart) still gets the request. `max_attempts`
  optionally caps the attempts by count as well. `timeout` does not cap a long generation
  (a live daemon answers keepalives); `total_timeout` does, if set.
- invoke() hands the caller no text until the end, so when a restarted daemon runs the
  request again (a new run id) it starts over on the new run; a stream() that already
  handed out text raises StreamRestartedError instead.
- TOKEN/DONE frames carry sequence numbers; a hole (a later frame, or an ACK/DONE saying more
  exist) is filled with RESEND(first missing seq).
- While waiting, a keepalive (RESEND from NO_SEQ, answered by ACK) renews the request's lease
  every lease/4, and after probe_interval_s of silence. If the server stays silent for
  contact_timeout_s the INVOKE is re-sent (the daemon may have restarted).
- Frames that fail the HMAC check are dropped: a spoofer cannot inject text. Unsigned ERROR
  frames are believed only for the pre-authentication codes (UNKNOWN_KEY,
  INVALID_SIGNATURE, MALFORMED), only if they echo our random request id, and only before
  the daemon has accepted the request.
- Once text was handed to the caller, the SDK never retries into a different generation run:
  a new run id raises StreamRestartedError.

audit_log_hook(payload, signature, timestamp) is called before every INVOKE attempt is sent:
payload = SHA-256 (32 bytes) of the signed INVOKE body (sampling parameters, stop strings and
payload, exactly as sent), signature = the HMAC-SHA256 tag of fragment 0 (which covers the
timestamp, the nonce and that SHA-256), timestamp = the request timestamp in unix µs. If the
hook raises, nothing is sent and the exception propagates: no audit record, no request.
"""
from __future__ import annotations

import hashlib
import random
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from .errors import (ERROR_INFO, ErrorCode, PayloadTooLargeError,
                     StreamRestartedError, ZerolayerError, ZerolayerTimeoutError, error_for)
from .wire import (MAX_CHUNK, MAX_MESSAGE_BYTES, NO_SEQ, NONCE_LEN, REQUEST_ID_LEN,
                   AckFrame, ChatMessage, DoneFrame, ErrorFrame, Mac, MsgType, PayloadKind,
                   PongFrame, Response, RunState, SamplingParams, Timings, TokenFrame, Usage,
                   decode_response, encode_chat, encode_control, encode_invoke,
                   encode_invoke_body, encode_token_ids)

AuditHook = Callable[[bytes, bytes, int], None]

# Pre-authentication errors the daemon can only send unsigned (it could not, or did not yet,
# verify us); any other unsigned frame is a spoof.
UNSIGNED_OK = frozenset({ErrorCode.UNKNOWN_KEY, ErrorCode.INVALID_SIGNATURE,
                         ErrorCode.MALFORMED})
RECV_BUF = 2048


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


def _now_us() -> int:
    return time.time_ns() // 1000


class Client:
    """A client of one daemon address. Thread-safe: each call uses its own UDP socket, so
    concurrent calls from threads do not see each other's datagrams.

    address: (host, port) of zerolayerd. key_id / secret: an entry of the daemon's keys
    file (secret as bytes or hex). timeout: the recovery window, seconds without any
    authenticated answer before a call fails (see the module docstring); total_timeout:
    optional cap on a whole call; max_attempts: optional cap on INVOKE/PING attempts (None:
    as many as fit in the window). The remaining knobs are the retry timers of
    docs/PROTOCOL.md §8.6.
    """

    def __init__(self, address: tuple[str, int], key_id: int, secret: bytes | str,
                 timeout: float = 45.0, *, audit_log_hook: AuditHook | None = None,
                 max_attempts: int | None = None, ack_timeout_s: float = 0.2,
                 backoff_initial_s: float = 0.05, backoff_max_s: float = 2.0,
                 resend_interval_s: float = 0.03, probe_interval_s: float = 0.25,
                 contact_timeout_s: float = 2.0, total_timeout: float | None = None,
                 chunk_len: int = MAX_CHUNK,
                 pace_burst: int = 64, pace_gap_s: float = 0.0002) -> None:
        if not 1 <= key_id <= 0xFFFFFFFF:
            raise ValueError("key_id must be in 1..2^32-1")
        self.address = address
        self.key_id = key_id
        raw = bytes.fromhex(secret) if isinstance(secret, str) else bytes(secret)
        self._secret = Mac(raw)      # the raw secret is not kept
        self.timeout = timeout
        self.audit_log_hook = audit_log_hook
        self.max_attempts = None if max_attempts is None else max(1, max_attempts)
        self.ack_timeout_s = ack_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.resend_interval_s = resend_interval_s
        self.probe_interval_s = probe_interval_s
        self.contact_timeout_s = contact_timeout_s
        self.total_timeout = total_timeout
        self.chunk_len = chunk_len
        self.pace_burst = pace_burst
        self.pace_gap_s = pace_gap_s

    def __repr__(self) -> str:  # never print the secret
        return f"Client(address={self.address!r}, key_id={self.key_id})"

    # -- public API -----------------------------------------------------------------------

    def invoke(self, prompt: str | None = None, messages: Sequence[ChatMessage] | None = None,
               token_ids: Sequence[int] | np.ndarray | None = None, *, max_tokens: int = 256,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, stop: Sequence[str] = (),
               request_id: bytes | str | None = None) -> InvokeResult:
        """Run one request to completion and return its text, usage and timings."""
        with self.stream(prompt, messages, token_ids, max_tokens=max_tokens,
                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                         stop=stop, request_id=request_id) as s:
            s._restartable = True  # the caller sees no text until the end
            for _ in s:
                pass
        assert s.result is not None
        return s.result

    def stream(self, prompt: str | None = None, messages: Sequence[ChatMessage] | None = None,
               token_ids: Sequence[int] | np.ndarray | None = None, *, max_tokens: int = 256,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, stop: Sequence[str] = (),
               request_id: bytes | str | None = None) -> "Stream":
        """Start a request; iterate the returned Stream for text chunks (str). When the
        iteration ends, `stream.result` holds the InvokeResult. Exactly one of prompt,
        messages, token_ids. Errors raise subclasses of ZerolayerError."""
        given = [x is not None for x in (prompt, messages, token_ids)]
        if sum(given) != 1:
            raise ValueError("give exactly one of prompt, messages, token_ids")
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=seed, stop=tuple(stop))
        if prompt is not None:
            kind, payload = PayloadKind.PROMPT, prompt.encode("utf-8")
        elif messages is not None:
            kind, payload = PayloadKind.CHAT, encode_chat(list(messages))
        else:
            assert token_ids is not None
            kind, payload = PayloadKind.TOKEN_IDS, encode_token_ids(token_ids)
        body = encode_invoke_body(params, kind, payload)  # validates params (MalformedError)
        if len(body) > MAX_MESSAGE_BYTES:
            raise PayloadTooLargeError(
                f"request body of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
        return Stream(self, body, _request_id(request_id))

    def ping(self) -> float:
        """Round-trip time of an authenticated PING/PONG, in seconds (no model involved)."""
        rid = secrets.token_bytes(REQUEST_ID_LEN)
        deadline = time.monotonic() + self.timeout
        refusal: ZerolayerError | None = None  # the last retryable one, raised if none follows
        with _open_socket(self.address) as sock:
            attempt = 0
            while self.may_retry(attempt):
                attempt += 1
                sent = time.monotonic()
                _send(sock, encode_control(MsgType.PING, self.key_id, self._secret, rid,
                                           _now_us(), secrets.token_bytes(NONCE_LEN)))
                wait_until = min(deadline, sent + self._ack_wait(attempt - 1))
                while (left := wait_until - time.monotonic()) > 0:
                    frame = self._recv(sock, left, rid)
                    if isinstance(frame, PongFrame):
                        return time.monotonic() - sent
                    if isinstance(frame, ErrorFrame):
                        exc = error_for(frame.code, frame.message, request_id=rid)
                        assert exc.code is not None
                        if not (frame.signed and ERROR_INFO[exc.code].retryable):
                            raise exc
                        refusal = exc
                if time.monotonic() >= deadline:
                    break
        if refusal is not None:
            raise refusal
        raise ZerolayerTimeoutError("no PONG", request_id=rid)

    # -- shared helpers ---------------------------------------------------------------------

    def may_retry(self, attempts: int) -> bool:
        """Whether another attempt may follow `attempts` sent (the window is the caller's)."""
        return self.max_attempts is None or attempts < self.max_attempts

    def _ack_wait(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.ack_timeout_s * (2 ** attempt))

    def _backoff(self, attempt: int) -> float:
        base = min(self.backoff_max_s, self.backoff_initial_s * (2 ** attempt))
        return base * (0.5 + random.random() / 2)   # jitter: no synchronised retry storms

    def _recv(self, sock: socket.socket, wait_s: float, rid: bytes) -> Response | None:
        """One datagram for this request, authenticated, or None (timeout, spoof, noise)."""
        sock.settimeout(max(wait_s, 1e-4))
        try:
            dg = sock.recv(RECV_BUF)
        except (TimeoutError, BlockingIOError):
            return None
        except OSError:          # ICMP port unreachable etc.: the daemon may be restarting
            time.sleep(min(wait_s, 0.01))
            return None
        try:
            frame = decode_response(dg, self._secret)
        except ZerolayerError:
            return None          # forged, corrupted or foreign: drop silently
        if frame.request_id != rid:
            return None
        if isinstance(frame, ErrorFrame) and not frame.signed:
            try:
                if ErrorCode(frame.code) not in UNSIGNED_OK:
                    return None
            except ValueError:
                return None
        return frame


class Stream(Iterator[str]):
    """One request in flight. Iterate for text chunks; then `.result` is the InvokeResult.
    Use as a context manager (or call close()) so that leaving early sends CANCEL."""

    def __init__(self, client: Client, body: bytes, request_id: bytes) -> None:
        self._c = client
        self._body = body
        self._digest = hashlib.sha256(body).digest()
        self.request_id = request_id
        self.result: InvokeResult | None = None
        self._sock: socket.socket | None = _open_socket(client.address)
        self._t0 = time.monotonic()
        # Inactivity deadline, pushed forward by every authenticated datagram; the hard one
        # (total_timeout) never moves.
        self._hard_deadline = (self._t0 + client.total_timeout
                               if client.total_timeout is not None else float("inf"))
        self._deadline = min(self._t0 + client.timeout, self._hard_deadline)
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
        self._closed = False
        self._restartable = False      # set by invoke(): a new run may replace an old one
        try:
            self._send_attempt()
        except BaseException:       # e.g. the audit hook refused: release the socket
            self._close_socket()
            raise

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        while True:
            if self.result is not None or self._closed:
                raise StopIteration
            chunk = self._pop_ready()
            if chunk is not None:
                return chunk
            if self.result is not None:
                self._close_socket()
                raise StopIteration
            self._wait_and_handle()

    def cancel(self) -> InvokeResult | None:
        """Ask the daemon to stop generating. Waits (up to the call's timeout) for the final
        DONE with finish_reason "cancelled" (or "stop"/"length" if it had already ended)
        and returns the result, text so far included."""
        if self.result is None and not self._closed:
            self._send_cancel()
            try:
                for _ in self:
                    pass
            except ZerolayerTimeoutError:
                pass
        self.close()
        return self.result

    def close(self) -> None:
        """Release the socket; if the request is unfinished, send one best-effort CANCEL."""
        if self._sock is not None and self.result is None and not self._closed:
            try:
                self._send_cancel()
            except OSError:
                pass
        self._closed = True
        self._close_socket()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------

    def _pop_ready(self) -> str | None:
        """Hand out frames in sequence order; a DONE at the head finishes the stream."""
        while self._next_seq in self._frames:
            f = self._frames.pop(self._next_seq)
            self._next_seq += 1
            if isinstance(f, DoneFrame):
                self._finish(f)
                return None
            if f.text:
                self._chunks.append(f.text)
                if self._ttft is None:
                    self._ttft = time.monotonic() - self._t0
                self._delivered = True
                return f.text
        return None

    def _finish(self, d: DoneFrame) -> None:
        self.result = InvokeResult("".join(self._chunks), d.usage, d.timings,
                                   d.finish_reason.label, self.request_id, self._ttft,
                                   time.monotonic() - self._t0, self.attempts)

    def _wait_and_handle(self) -> None:
        now = time.monotonic()
        if now >= self._deadline:
            if self._last_refusal is not None and not self._accepted:
                self._fail(self._last_refusal)
            what = ("total_timeout" if now >= self._hard_deadline
                    else f"{self._c.timeout} s without an answer")
            self._fail(ZerolayerTimeoutError(
                f"gave up: {what}, after {self.attempts} attempt(s)",
                request_id=self.request_id))
        timer = self._next_timer(now)
        wait = max(0.0, min(timer, self._deadline) - now)
        assert self._sock is not None
        frame = self._c._recv(self._sock, wait, self.request_id) if wait > 0 else None
        if frame is not None:
            self._on_frame(frame)
        else:
            self._on_timer(time.monotonic())

    def _gap(self) -> bool:
        return self._next_seq < self._known_end and self._next_seq not in self._frames

    def _next_timer(self, now: float) -> float:
        c = self._c
        if self._next_attempt_at is not None:
            return self._next_attempt_at
        if not self._accepted:
            return self._attempt_sent + c._ack_wait(self.attempts - 1)
        t = min(self._last_heard + c.contact_timeout_s,
                self._last_sent + self._lease_s / 4,
                max(self._last_heard, self._last_sent) + c.probe_interval_s)
        if self._gap():
            t = min(t, self._last_resend + c.resend_interval_s)
        if self._cancel_sent_at is not None:
            t = min(t, self._cancel_sent_at + c.probe_interval_s)
        return t

    def _on_timer(self, now: float) -> None:
        c = self._c
        if self._next_attempt_at is not None:
            if now >= self._next_attempt_at:
                self._next_attempt_at = None
                self._send_attempt()
            return
        if not self._accepted:
            if now >= self._attempt_sent + c._ack_wait(self.attempts - 1):
                self._retry_or_wait()
            return
        if now - self._last_heard >= c.contact_timeout_s:
            # The daemon stopped answering even keepalives: re-send the request. Same
            # request id: if it is still running there, this attaches to it.
            self._last_heard = now
            self._accepted = False
            self._retry_or_wait()
            return
        if self._cancel_sent_at is not None and now - self._cancel_sent_at >= c.probe_interval_s:
            self._send_cancel()
            return
        if self._gap() and now - self._last_resend >= c.resend_interval_s:
            self._send_control(MsgType.RESEND, self._next_seq)
            self._last_resend = now
            return
        if (now - self._last_sent >= self._lease_s / 4
                or now - max(self._last_heard, self._last_sent) >= c.probe_interval_s):
            self._send_control(MsgType.RESEND, NO_SEQ)   # keepalive / status probe

    def _retry_or_wait(self) -> None:
        if self._c.may_retry(self.attempts):
            self._send_attempt()
        else:
            # Out of attempts: keep listening (a late answer still counts) until the deadline.
            self._attempt_sent = self._deadline

    def _on_frame(self, f: Response) -> None:
        if isinstance(f, ErrorFrame) and not f.signed:
            self._on_error(f)       # believed or not, it is no sign of a live daemon
            return
        now = time.monotonic()
        self._last_heard = now
        self._deadline = min(now + self._c.timeout, self._hard_deadline)
        if isinstance(f, ErrorFrame):
            self._on_error(f)
            return
        if isinstance(f, PongFrame):
            return
        run_id = f.run_id
        if run_id:
            if self._run_id is None:
                self._run_id = run_id
            elif run_id != self._run_id:
                if self._delivered and self._restartable:
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
            return
        if f.seq >= self._next_seq:
            self._frames[f.seq] = f
        end = f.seq + 1
        self._known_end = max(self._known_end, end)

    def _on_error(self, f: ErrorFrame) -> None:
        try:
            code = ErrorCode(f.code)
        except ValueError:
            code = None
        exc = error_for(f.code, f.message, request_id=self.request_id)
        if not f.signed and self._accepted:
            return                      # the daemon verified us already: this is a spoof
        if code is ErrorCode.EXPIRED_NONCE and self._accepted:
            return                      # a duplicated datagram of an accepted attempt
        if (f.signed and code is not None and ERROR_INFO[code].retryable
                and not self._delivered and self._c.may_retry(self.attempts)):
            # Retry the same request id later with a fresh nonce.
            self._last_refusal = exc
            self._accepted = False
            self._frames.clear()
            self._known_end = 0
            self._run_id = None
            self._next_attempt_at = time.monotonic() + self._c._backoff(self.attempts - 1)
            return
        self._fail(exc)

    def _fail(self, exc: ZerolayerError) -> None:
        self._closed = True
        self._close_socket()
        raise exc

    # -- sending --------------------------------------------------------------------------

    def _send_attempt(self) -> None:
        c = self._c
        ts = _now_us()
        frags = encode_invoke(c.key_id, c._secret, self.request_id, ts,
                              secrets.token_bytes(NONCE_LEN), self._body, c.chunk_len)
        if c.audit_log_hook is not None:
            c.audit_log_hook(self._digest, frags[0][-32:], ts)
        self.attempts += 1
        assert self._sock is not None
        burst, gap = c.pace_burst, c.pace_gap_s
        for i, dg in enumerate(frags):
            # Small requests go out at once. Past the first burst, fragments are paced so a
            # large request does not overrun the daemon's socket buffer in one blast (a lost
            # fragment costs the whole request a retry: v1 has no per-fragment NACK).
            if i >= burst and i % (burst // 4 or 1) == 0 and gap > 0:
                time.sleep(gap)
            _send(self._sock, dg)
        self._attempt_sent = self._last_sent = time.monotonic()

    def _send_control(self, mt: MsgType, arg: int = 0) -> None:
        c = self._c
        if self._sock is None:
            return
        _send(self._sock, encode_control(mt, c.key_id, c._secret, self.request_id, _now_us(),
                                         secrets.token_bytes(NONCE_LEN), arg))
        self._last_sent = time.monotonic()

    def _send_cancel(self) -> None:
        self._send_control(MsgType.CANCEL)
        self._cancel_sent_at = time.monotonic()

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _request_id(rid: bytes | str | None) -> bytes:
    if rid is None:
        return secrets.token_bytes(REQUEST_ID_LEN)
    b = bytes.fromhex(rid) if isinstance(rid, str) else bytes(rid)
    if len(b) != REQUEST_ID_LEN:
        raise ValueError("request_id must be 16 bytes (or 32 hex characters)")
    return b


def _open_socket(address: tuple[str, int]) -> socket.socket:
    family, stype, proto, _, sockaddr = socket.getaddrinfo(address[0], address[1],
                                                           type=socket.SOCK_DGRAM)[0]
    s = socket.socket(family, stype, proto)
    # connect(): the kernel then delivers only datagrams from the daemon's address to us.
    s.connect(sockaddr)
    return s


def _send(sock: socket.socket, dg: bytes) -> None:
    try:
        sock.send(dg)
    except (ConnectionRefusedError, BlockingIOError):
        pass   # a lost datagram, as far as the protocol is concerned: timers will retry


__all__ = ["AuditHook", "ChatMessage", "Client", "InvokeResult", "RunState", "Stream",
           "Timings", "Usage", "ZerolayerError"]
