"""The asyncio SDK: `AsyncClient.invoke()`, `.stream()` and `.ping()`.

    from zerolayer.client import AsyncClient, ChatMessage
    async with AsyncClient(("127.0.0.1", 7700), key_id=1, secret="…hex…") as c:
        print((await c.invoke(prompt="The capital of France is", max_tokens=8)).text)
        async with await c.stream(messages=[ChatMessage("user", "Hi")]) as s:
            async for chunk in s:
                print(chunk, end="")
        print(s.result.usage)

The same reliability semantics as the sync Client, because both drive the one protocol state
machine in client/request_machine.py: retries with the same request id, the recovery window,
resends of missing frames, keepalives, CANCEL when a stream is left early. Many streams run
concurrently on one event loop; each has its own channel (over UDP its own socket).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from types import TracebackType

from zerolayer.protocol.constraint import ResponseFormat
from zerolayer.protocol.errors import ZerolayerError, ZerolayerTimeoutError
from zerolayer.protocol.logprobs import TokenLogprob
from zerolayer.protocol.wire import ChatMessage

from .client_config import ClientConfig
from .connect import async_connector_for
from .invoke_body import build_invoke_body, request_id_bytes
from .ping_rule import PingAttempts
from .request_machine import InvokeResult, RequestMachine
from .transport import AsyncChannel, AsyncConnector, Routed


class AsyncClient(ClientConfig):
    """An asyncio client of one daemon (or a fleet); the arguments are ClientConfig's, as
    for the sync Client."""

    _connector: AsyncConnector | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._connector is not None:
            connector, self._connector = self._connector, None
            await connector.aclose()

    async def invoke(self, prompt: str | None = None,
                     messages: Sequence[ChatMessage] | None = None,
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
        s = await self.stream(prompt, messages, token_ids, max_tokens=max_tokens,
                              temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                              stop=stop, repetition_penalty=repetition_penalty,
                              presence_penalty=presence_penalty,
                              frequency_penalty=frequency_penalty, logprobs=logprobs,
                              top_logprobs=top_logprobs, response_format=response_format,
                              speculative=speculative,
                              request_id=request_id)
        s._m.restartable = True  # the caller sees no text until the end
        async with s:
            async for _ in s:
                pass
        assert s.result is not None
        return s.result

    async def stream(self, prompt: str | None = None,
                     messages: Sequence[ChatMessage] | None = None,
                     token_ids: Iterable[int] | None = None, *, max_tokens: int = 256,
                     temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                     seed: int | None = None, stop: Sequence[str] = (),
                     repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                     frequency_penalty: float = 0.0,
                     logprobs: bool = False, top_logprobs: int = 0,
                     response_format: ResponseFormat | None = None,
                     speculative: bool = True,
                     request_id: bytes | str | None = None) -> AsyncStream:
        """Send the request's first attempt and return the AsyncStream; iterate it with
        `async for` for text chunks. Errors raise subclasses of ZerolayerError."""
        body = build_invoke_body(prompt, messages, token_ids, max_tokens=max_tokens,
                                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                 stop=stop, repetition_penalty=repetition_penalty,
                                 presence_penalty=presence_penalty,
                                 frequency_penalty=frequency_penalty, logprobs=logprobs,
                                 top_logprobs=top_logprobs, response_format=response_format,
                                 speculative=speculative)
        rid = request_id_bytes(request_id)
        ch = await self._open(rid)
        route = ch if isinstance(ch, Routed) else None
        now = time.monotonic()
        s = AsyncStream(RequestMachine(self.policy, body, rid, now, route=route), ch)
        try:
            await s._send(s._m.start(now))
        except BaseException:       # e.g. the audit hook refused: release the channel
            s._release()
            raise
        return s

    async def ping(self) -> float:
        """Round-trip time of an authenticated PING/PONG, in seconds, retried like the sync
        Client.ping() within the recovery window."""
        att = PingAttempts(self.policy, time.monotonic())
        ch = await self._open(att.request_id)
        try:
            while (nxt := att.next(time.monotonic())) is not None:
                datagram, wait_until = nxt
                ch.send(datagram)
                while (left := wait_until - time.monotonic()) > 0:
                    got = await ch.recv(left)
                    rtt = att.receive(got, time.monotonic()) if got is not None else None
                    if rtt is not None:
                        return rtt
        finally:
            ch.close()
        raise att.give_up()

    async def _open(self, request_id: bytes) -> AsyncChannel:
        if self._connector is None:
            self._connector = async_connector_for(self._target)
        return await self._connector.open(request_id)


class AsyncStream(AsyncIterator[str]):
    """One request in flight. `async for` yields text chunks; then `.result` is set. Use as
    an async context manager (or await aclose()) so that leaving early sends CANCEL. If the
    task iterating it is cancelled, the stream sends CANCEL too (via aclose in __aexit__)."""

    def __init__(self, machine: RequestMachine, channel: AsyncChannel) -> None:
        self._m = machine
        self._ch: AsyncChannel | None = channel
        self.request_id = machine.request_id

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

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> str:
        m = self._m
        while True:
            if m.finished:
                self._release()
                raise StopAsyncIteration
            chunk = m.pop_ready(time.monotonic())
            if chunk is not None:
                return chunk
            if m.result is not None:
                continue
            try:
                wait = m.get_timer() - time.monotonic()
                dg = await self._ch.recv(wait) if wait > 0 and self._ch is not None else None
                now = time.monotonic()
                await self._send(m.receive(dg, now) if dg is not None else m.handle_timer(now))
            except ZerolayerError:
                self._release()
                raise

    async def cancel(self) -> InvokeResult | None:
        """Ask the daemon to stop; wait for the final DONE (finish_reason "cancelled", or
        "stop"/"length" if it had already ended) and return the result."""
        if not self._m.finished:
            await self._send(self._m.cancel(time.monotonic()))
            try:
                async for _ in self:
                    pass
            except ZerolayerTimeoutError:
                pass
        await self.aclose()
        return self.result

    async def aclose(self) -> None:
        """Release the channel; if the request is unfinished, send one best-effort CANCEL."""
        try:
            self._send_now(self._m.close(time.monotonic()))
        except OSError:
            pass
        self._release()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _send(self, datagrams: list[bytes]) -> None:
        policy = self._m._p
        for i, dg in enumerate(datagrams):
            pause = policy.pause_before(i)
            if pause:
                await asyncio.sleep(pause)
            if self._ch is not None:
                self._ch.send(dg)

    def _send_now(self, datagrams: list[bytes]) -> None:
        # No await: aclose must send its CANCEL even while the task is being cancelled.
        for dg in datagrams:
            if self._ch is not None:
                self._ch.send(dg)

    def _release(self) -> None:
        if self._ch is not None:
            self._ch.close()
            self._ch = None


__all__ = ["AsyncClient", "AsyncStream"]
