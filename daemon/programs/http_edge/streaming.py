"""The SSE response of a generation, which always ends its daemon stream.

sse-starlette watches the connection and, when the HTTP client hangs up, cancels the task
that iterates our event generator. A generator cancelled before its first step never runs
its `finally`, so cleanup cannot live there: it lives in __call__'s `finally`, which runs
however the response ends (completed, client gone, send failed, server shutting down) and
cancels the daemon stream if it is still running.
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from sse_starlette.sse import EventSourceResponse
from starlette.types import Receive, Scope, Send

from zerolayer.daemon.json_value import JSONValue

from .generation import Generation
from .metrics import EdgeMetrics

# Seconds between `: ping` comments on a quiet stream (proxies close idle connections).
KEEPALIVE_S = 15
# On SIGTERM a stream in flight gets this long to finish before it is cancelled; uvicorn's
# graceful-shutdown timeout (app.py) and the unit's TimeoutStopSec are set above it.
DRAIN_S = 25


def dumps(obj: JSONValue) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def data_event(obj: JSONValue) -> bytes:
    """`data: <json>` + blank line: OpenAI's framing."""
    return b"data: " + dumps(obj).encode() + b"\n\n"


def named_event(name: str, obj: JSONValue) -> bytes:
    """`event: <name>` + `data: <json>`: Anthropic's framing."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(obj).encode() + b"\n\n"


class GenerationSSE(EventSourceResponse):
    def __init__(self, events: AsyncIterator[bytes], gen: Generation, metrics: EdgeMetrics,
                 api: str) -> None:
        super().__init__(events, sep="\n", ping=KEEPALIVE_S, shutdown_grace_period=DRAIN_S)
        self._gen = gen
        self._metrics = metrics
        self._api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._metrics.active_streams.inc()
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._metrics.active_streams.dec()
            await self._gen.finish()
            self._metrics.duration.labels(self._api).observe(time.monotonic() - self._gen.t0)
