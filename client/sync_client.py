"""The synchronous SDK: `Client.invoke()`, `Client.stream()` and `Client.ping()`.

    from zerolayer.client import Client
    c = Client(("127.0.0.1", 7700), key_id=1, secret="…hex…", timeout=30)
    print(c.invoke(prompt="The capital of France is", max_tokens=8).text)

    with c.stream(messages=[ChatMessage("user", "Hi")]) as s:
        for chunk in s:          # str chunks, in order, each valid text
            print(chunk, end="")
    print(s.result.usage)        # InvokeResult, set once the iteration ended

    r = c.invoke(prompt="2 + 2 =", max_tokens=4, logprobs=True, top_logprobs=5)
    r.logprobs[0].logprob, r.logprobs[0].top_logprobs   # per token (protocol/logprobs.py)

    r = c.invoke(prompt="A user as JSON:", max_tokens=64, response_format={
        "type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA}})
    json.loads(r.text)   # valid against SCHEMA (unless max_tokens cut it: finish "length")

The address is a UDP ("host", port) / "host:port", or "shm:///path/shm.sock" for the
same-host shared-memory carrier (client/address.py). The reliability rules (retries,
recovery window, resends, keepalives, which frames are believed) live in one place,
client/request_machine.py, which this client and the asyncio AsyncClient both drive.

audit_log_hook(payload, signature, timestamp) is called before every INVOKE attempt is sent:
payload = SHA-256 (32 bytes) of the signed INVOKE body (sampling parameters, stop strings and
payload, exactly as sent), signature = the HMAC-SHA256 tag of fragment 0 (which covers the
timestamp, the nonce and that SHA-256), timestamp = the request timestamp in unix µs. If the
hook raises, nothing is sent and the exception propagates: no audit record, no request.
"""
from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType

from zerolayer.protocol.constraint import ResponseFormat
from zerolayer.protocol.errors import ZerolayerError, ZerolayerTimeoutError, error_for
from zerolayer.protocol.logprobs import TokenLogprob
from zerolayer.protocol.wire import REQUEST_ID_LEN, ChatMessage, ErrorFrame, Mac, MsgType, PongFrame

from .client_config import ClientConfig
from .connect import connector_for
from .invoke_body import build_invoke_body, request_id_bytes
from .ping_rule import PingAttempts
from .request_machine import InvokeResult, RequestMachine
from .retry_policy import AuditHook, authenticate
from .transport import Channel, Connector, Routed


class Client(ClientConfig):
    """A client of one daemon (or a fleet; arguments: ClientConfig). Thread-safe: each call
    has its own channel (over UDP its own socket), so concurrent calls from threads do not
    see each other's datagrams."""

    _connector: Connector | None = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Release the carrier (an shm ring pair); UDP holds nothing between calls."""
        with self._lock:
            if self._connector is not None:
                self._connector.close()
                self._connector = None

    # -- public API -----------------------------------------------------------------------

    def invoke(self, prompt: str | None = None, messages: Sequence[ChatMessage] | None = None,
               token_ids: Iterable[int] | None = None, *, max_tokens: int = 256,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, stop: Sequence[str] = (),
               repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0,
               logprobs: bool = False, top_logprobs: int = 0,
               response_format: ResponseFormat | None = None,
               speculative: bool = True,
               request_id: bytes | str | None = None) -> InvokeResult:
        """Run one request to completion and return its text, usage and timings."""
        with self.stream(prompt, messages, token_ids, max_tokens=max_tokens,
                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                         stop=stop, repetition_penalty=repetition_penalty,
                         presence_penalty=presence_penalty,
                         frequency_penalty=frequency_penalty, logprobs=logprobs,
                         top_logprobs=top_logprobs, response_format=response_format,
                         speculative=speculative,
                         request_id=request_id) as s:
            s._m.restartable = True  # the caller sees no text until the end
            for _ in s:
                pass
        assert s.result is not None
        return s.result

    def stream(self, prompt: str | None = None, messages: Sequence[ChatMessage] | None = None,
               token_ids: Iterable[int] | None = None, *, max_tokens: int = 256,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, stop: Sequence[str] = (),
               repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0,
               logprobs: bool = False, top_logprobs: int = 0,
               response_format: ResponseFormat | None = None,
               speculative: bool = True,
               request_id: bytes | str | None = None) -> Stream:
        """Start a request; iterate the returned Stream for text chunks (str). When the
        iteration ends, `stream.result` holds the InvokeResult. Exactly one of prompt,
        messages, token_ids. Errors raise subclasses of ZerolayerError."""
        body = build_invoke_body(prompt, messages, token_ids, max_tokens=max_tokens,
                                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                 stop=stop, repetition_penalty=repetition_penalty,
                                 presence_penalty=presence_penalty,
                                 frequency_penalty=frequency_penalty, logprobs=logprobs,
                                 top_logprobs=top_logprobs, response_format=response_format,
                                 speculative=speculative)
        return Stream(self, body, request_id_bytes(request_id))

    def ping(self) -> float:
        """Round-trip time of an authenticated PING/PONG, in seconds (no model involved).
        Retried like an INVOKE within the recovery window."""
        att = PingAttempts(self.policy, time.monotonic())
        ch = self._open(att.request_id)
        try:
            while (nxt := att.next(time.monotonic())) is not None:
                datagram, wait_until = nxt
                ch.send(datagram)
                while (left := wait_until - time.monotonic()) > 0:
                    got = ch.recv(left)
                    rtt = att.receive(got, time.monotonic()) if got is not None else None
                    if rtt is not None:
                        return rtt
        finally:
            ch.close()
        raise att.give_up()

    def probe(self, wait_s: float | None = None) -> tuple[float, PongFrame]:
        """One PING, one wait, no retry: (round trip in s, the PONG with the daemon's state
        and clock). For ping tools, which count every probe."""
        p = self.policy
        rid = secrets.token_bytes(REQUEST_ID_LEN)
        ch = self._open(rid)
        try:
            sent = time.monotonic()
            ch.send(p.control(MsgType.PING, rid))
            deadline = sent + (p.timeout if wait_s is None else wait_s)
            while (left := deadline - time.monotonic()) > 0:
                frame = _frame(ch, left, p.mac, rid)
                if isinstance(frame, PongFrame):
                    return time.monotonic() - sent, frame
                if isinstance(frame, ErrorFrame):
                    raise error_for(frame.code, frame.message, request_id=rid)
        finally:
            ch.close()
        raise ZerolayerTimeoutError(f"no PONG within {deadline - sent:.3g} s", request_id=rid)

    def _open(self, request_id: bytes) -> Channel:
        with self._lock:
            if self._connector is None:
                self._connector = connector_for(self._target)
            connector = self._connector
        return connector.open(request_id)


def _frame(ch: Channel, wait_s: float, mac: Mac, rid: bytes) -> PongFrame | ErrorFrame | None:
    dg = ch.recv(wait_s)
    frame = authenticate(dg, mac, rid) if dg is not None else None
    return frame if isinstance(frame, (PongFrame, ErrorFrame)) else None


class Stream(Iterator[str]):
    """One request in flight. Iterate for text chunks; then `.result` is the InvokeResult.
    Use as a context manager (or call close()) so that leaving early sends CANCEL."""

    def __init__(self, client: Client, body: bytes, request_id: bytes) -> None:
        self.request_id = request_id
        self._ch: Channel | None = client._open(request_id)
        now = time.monotonic()
        self._m = RequestMachine(client.policy, body, request_id, now,
                                 route=self._ch if isinstance(self._ch, Routed) else None)
        try:
            self._send(self._m.start(now))
        except BaseException:       # e.g. the audit hook refused: release the channel
            self._release()
            raise

    @property
    def result(self) -> InvokeResult | None:
        return self._m.result

    @property
    def attempts(self) -> int:
        return self._m.attempts

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """With logprobs asked: one TokenLogprob per sampled token so far, in order; a
        token's entry arrives no later than the chunk that completes its text."""
        return self._m.logprobs

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> str:
        m = self._m
        while True:
            if m.finished:
                self._release()
                raise StopIteration
            chunk = m.pop_ready(time.monotonic())
            if chunk is not None:
                return chunk
            if m.result is not None:
                continue
            try:
                wait = m.get_timer() - time.monotonic()
                dg = self._ch.recv(wait) if wait > 0 and self._ch is not None else None
                now = time.monotonic()
                self._send(m.receive(dg, now) if dg is not None else m.handle_timer(now))
            except ZerolayerError:
                self._release()
                raise

    def cancel(self) -> InvokeResult | None:
        """Ask the daemon to stop generating. Waits (up to the call's timeout) for the final
        DONE with finish_reason "cancelled" (or "stop"/"length" if it had already ended)
        and returns the result, text so far included."""
        if not self._m.finished:
            self._send(self._m.cancel(time.monotonic()))
            try:
                for _ in self:
                    pass
            except ZerolayerTimeoutError:
                pass
        self.close()
        return self.result

    def close(self) -> None:
        """Release the channel; if the request is unfinished, send one best-effort CANCEL."""
        try:
            self._send(self._m.close(time.monotonic()))
        except OSError:
            pass
        self._release()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _send(self, datagrams: list[bytes]) -> None:
        if self._ch is None:
            return
        policy = self._m._p
        for i, dg in enumerate(datagrams):
            pause = policy.pause_before(i)
            if pause:
                time.sleep(pause)
            self._ch.send(dg)

    def _release(self) -> None:
        if self._ch is not None:
            self._ch.close()
            self._ch = None


__all__ = ["AuditHook", "ChatMessage", "Client", "InvokeResult", "Stream"]
