"""What makes one HTTP API different from another: a `Dialect`.

serve.py runs every generation the same way (the caller's key, the JSON body, the daemon
stream, the first chunk before the status line, the metrics, cancel on leave). A dialect
supplies only what the two APIs disagree on:

    parse       the request body -> GenParams and whether to stream (strict: 400 on
                anything it cannot honour)
    error_body  an ApiError in the API's error shape (the status and headers are common)
    body        the whole answer, when not streaming
    chunks      the stream's events: what opens it, the events of each text chunk (with
                the logprobs of the tokens it completes, if asked; none while a tool
                call's answer needs more text), an in-band error once the status line is
                out, and what closes it

OpenAI's chat completions and completions (openai_api.py) and Anthropic's messages
(anthropic_api.py) are the dialects; none of them touches the daemon stream or the HTTP
connection, so each is checked by feeding it values.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from zerolayer.client import InvokeResult, TokenLogprob
from zerolayer.daemon.json_value import JSONObject

from .errors import ApiError
from .generation import GenParams
from .state import EdgeState


class Parsed(Protocol):
    """A request as a dialect parsed it: at least the generation and whether to stream."""
    @property
    def params(self) -> GenParams: ...
    @property
    def stream(self) -> bool: ...


class ChunkShape(Protocol):
    """One stream's events, in the dialect's framing (bytes ready for the SSE body)."""
    def start(self) -> list[bytes]: ...
    def chunk(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> bytes: ...
    def error(self, e: ApiError) -> bytes: ...
    def end(self, r: InvokeResult | None) -> list[bytes]: ...


Req = TypeVar("Req", bound=Parsed)


class Dialect(Protocol[Req]):
    """`Req` is the dialect's own parsed request, which only the dialect reads back."""
    @property
    def api(self) -> str: ...           # the metrics' `api` label
    @property
    def x_api_key(self) -> bool: ...    # `x-api-key` taken as well as `Authorization: Bearer`

    def parse(self, body: JSONObject, st: EdgeState) -> Req: ...
    def error_body(self, e: ApiError) -> JSONObject: ...
    def body(self, req: Req, r: InvokeResult, text: str, model: str,
             created: int) -> JSONObject: ...
    def chunks(self, req: Req, request_id: bytes, model: str, created: int) -> ChunkShape: ...
