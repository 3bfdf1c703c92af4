"""One daemon stream as an HTTP handler uses it.

`Generation.open` sends the invoke and waits for the first text chunk (or the end) before
the handler answers. That way every error the daemon can give before generating (OVERLOADED,
CONTEXT_OVERFLOW, a bad key ...) still becomes a proper HTTP status, not a 200 followed by
an SSE error event; the headers and the first token then leave together, so the HTTP
client's time to first token is not made longer by it.

While the edge waits on the daemon and no response has started, nothing else notices an
HTTP client that hangs up: `until_disconnect` watches the ASGI receive channel for
`http.disconnect` meanwhile, and the stream is cancelled at once (CANCEL to the daemon, so
its KV cache and batch slot are freed instead of generating for nobody).

`finish()` is the one way a generation ends from the edge's side: if the daemon has not
sent DONE yet, the HTTP client went away (or the edge failed), so it sends CANCEL, waits
briefly for the daemon's DONE(cancelled), and counts it.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
from starlette.requests import Request

from zerolayer.client import (
    AsyncClient,
    AsyncStream,
    ChatMessage,
    ErrorCode,
    InvokeResult,
    TokenLogprob,
    ZerolayerError,
)
from zerolayer.protocol.constraint import ResponseFormat

from .errors import ApiError
from .metrics import EdgeMetrics

T = TypeVar("T")

# How long finish() waits for the daemon's DONE(cancelled). The daemon answers CANCEL from
# its I/O thread at once; this only bounds a daemon that has gone away.
CANCEL_WAIT_S = 2.0


class ClientGone(Exception):
    """The HTTP client disconnected before the answer was complete."""


@dataclass(frozen=True)
class GenParams:
    """What both APIs translate their request into: the arguments of AsyncClient.stream."""
    prompt: str | None
    messages: tuple[ChatMessage, ...] | None
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: ResponseFormat | None = None   # OpenAI's shape (protocol/constraint.py)
    # the request field the constraint came from: a refused schema is a 400 naming it
    constraint_param: str = "response_format"


async def until_disconnect(request: Request, fn: Callable[[], Awaitable[T]]) -> T:
    """Run fn() unless the HTTP client disconnects first (then raise ClientGone).
    For use before a response has started; afterwards the SSE response watches itself."""
    outcome: list[T] = []
    failure: list[BaseException] = []
    gone = False

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal gone
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                gone = True
                scope.cancel()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        try:
            outcome.append(await fn())
        except Exception as e:      # re-raised below, outside the task group's grouping
            failure.append(e)
        tg.cancel_scope.cancel()
    if gone and not outcome and not failure:
        raise ClientGone()
    if failure:
        raise failure[0]
    return outcome[0]


class Generation:
    def __init__(self, stream: AsyncStream, api: str, metrics: EdgeMetrics,
                 t0: float) -> None:
        self.stream = stream
        self.api = api
        self.metrics = metrics
        self.t0 = t0                        # time.monotonic() when the HTTP request arrived
        self.first: str | None = None       # the first chunk, taken by open()
        self._finished = False
        self._lp_taken = 0                  # the stream's logprobs handed out so far

    @classmethod
    async def open(cls, request: Request, client: AsyncClient, p: GenParams, api: str,
                   metrics: EdgeMetrics, t0: float) -> Generation:
        """Send the invoke and wait for its first chunk. Raises ApiError (daemon errors,
        mapped) or ClientGone (the stream is then already cancelled)."""
        try:
            s = await client.stream(p.prompt, list(p.messages) if p.messages is not None
                                    else None, max_tokens=p.max_tokens,
                                    temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                    seed=p.seed, stop=p.stop,
                                    repetition_penalty=p.repetition_penalty,
                                    presence_penalty=p.presence_penalty,
                                    frequency_penalty=p.frequency_penalty,
                                    logprobs=p.logprobs, top_logprobs=p.top_logprobs,
                                    response_format=p.response_format)
        except ZerolayerError as e:         # refused locally: bad parameters, too large
            raise _constraint_error(daemon_error(e, metrics), e, p) from None
        g = cls(s, api, metrics, t0)
        try:
            g.first = await until_disconnect(request, g._first_chunk)
        except ClientGone:
            await g.finish()
            raise
        except ZerolayerError as e:
            await g.finish()
            raise _constraint_error(daemon_error(e, metrics), e, p) from None
        except BaseException:
            await g.finish()
            raise
        return g

    async def _first_chunk(self) -> str | None:
        try:
            chunk = await self.stream.__anext__()
        except StopAsyncIteration:
            return None                      # DONE before any text (e.g. EOS at once)
        self.metrics.ttft.labels(self.api).observe(time.monotonic() - self.t0)
        return chunk

    async def chunks(self) -> AsyncIterator[str]:
        """The text: the first chunk, then the rest as the daemon sends it. ZerolayerError
        propagates (after the first chunk, errors are the caller's to put into the stream)."""
        if self.first:
            yield self.first
        async for chunk in self.stream:
            yield chunk

    def take_logprobs(self) -> list[TokenLogprob]:
        """The tokens' logprobs that arrived since the last call: after a chunk, those of the
        tokens it completes (empty when none were asked)."""
        got = self.stream.logprobs
        new, self._lp_taken = got[self._lp_taken:], len(got)
        return new

    async def text(self) -> str:
        parts = [c async for c in self.chunks()]
        return "".join(parts)

    @property
    def result(self) -> InvokeResult | None:
        return self.stream.result

    async def finish(self) -> None:
        """End the daemon stream; cancel it (and count the cancel) if it is unfinished.
        Shielded: this runs when the HTTP side is being torn down."""
        if self._finished:
            return
        self._finished = True
        with anyio.CancelScope(shield=True):
            if self.stream.result is None:
                self.metrics.cancels.inc()
                try:
                    with anyio.move_on_after(CANCEL_WAIT_S):
                        await self.stream.cancel()
                except ZerolayerError:
                    pass                # the CANCEL went out; the daemon's answer is moot
            else:
                r = self.stream.result
                self.metrics.completion_tokens.labels(self.api).inc(r.usage.completion_tokens)
            await self.stream.aclose()


def _constraint_error(err: ApiError, e: ZerolayerError, p: GenParams) -> ApiError:
    """MALFORMED for a request with a constraint: the edge checked every other field, so
    the daemon (or the SDK, for its size) refused the schema, which the daemon compiles and
    the edge does not; the 400 names the field it came from."""
    if p.response_format is not None and e.code is ErrorCode.MALFORMED:
        err.param = p.constraint_param
        if p.constraint_param == "tools":
            err.message = f"'tools': the tools' schemas cannot be used: {err.message}"
    return err


def daemon_error(e: ZerolayerError, metrics: EdgeMetrics) -> ApiError:
    metrics.daemon_errors.labels(e.code.name if e.code is not None
                                 else type(e).__name__).inc()
    return ApiError.from_daemon(e)
