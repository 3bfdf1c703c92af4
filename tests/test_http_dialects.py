"""The HTTP edge's two dialects fed values, without a daemon or a socket: the one handler
(daemon/programs/http_edge/serve.py) runs a stream the same way for each, and each dialect shapes
only its own events, bodies and errors. End to end, with the real SDKs: test_http_edge.py."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from zerolayer.client import InvokeResult, TokenLogprob
from zerolayer.daemon.programs.http_edge import anthropic_api, openai_api, serve
from zerolayer.daemon.programs.http_edge.errors import ApiError, bad_request
from zerolayer.daemon.programs.http_edge.generation import Generation, GenParams
from zerolayer.daemon.programs.http_edge.metrics import EdgeMetrics
from zerolayer.protocol.errors import RequestCancelledError
from zerolayer.protocol.wire import Timings, Usage

RID = bytes(range(16))
RESULT = InvokeResult("Hello world", Usage(7, 2, 3), Timings(1, 2, 3, 4), "length", RID,
                      0.1, 0.2, 1)


class FakeStream:
    """A daemon stream that yields `chunks`, then ends with RESULT or is cut."""

    def __init__(self, chunks: list[str], cut: bool) -> None:
        self.chunks, self.cut, self.request_id = list(chunks), cut, RID
        self.result: InvokeResult | None = None
        self.logprobs: list[TokenLogprob] = []      # none asked

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> str:
        if self.chunks:
            return self.chunks.pop(0)
        if self.cut:
            raise RequestCancelledError("drain timeout")
        self.result = RESULT
        raise StopAsyncIteration


def _run(dialect, req, cut: bool = False) -> tuple[list[bytes], EdgeMetrics]:  # type: ignore[no-untyped-def]
    metrics = EdgeMetrics()
    st = SimpleNamespace(cfg=SimpleNamespace(model_name="m"), metrics=metrics)
    gen = Generation(FakeStream([" world"], cut), dialect.api, metrics, 0.0)  # type: ignore[arg-type]
    gen.first = "Hello"
    shape = dialect.chunks(req, RID, "m", 123)

    async def collect() -> list[bytes]:
        return [e async for e in serve.events(gen, shape, st)]  # type: ignore[arg-type]
    return asyncio.run(collect()), metrics


def _data(event: bytes) -> object:
    return json.loads(event.split(b"data: ", 1)[1])


def _req(include_usage: bool) -> openai_api.OpenAIRequest:
    return openai_api.OpenAIRequest(GenParams(None, None, 4, 1.0, 1.0), True, include_usage)


def test_openai_chat_stream_opens_with_the_role_and_ends_with_usage_and_done() -> None:
    events, _ = _run(openai_api.CHAT, _req(include_usage=True))
    chunks = [_data(e) for e in events[:-1]]
    assert [c["choices"][0]["delta"] for c in chunks[:3]] == [  # type: ignore[index]
        {"role": "assistant", "content": ""}, {"content": "Hello"}, {"content": " world"}]
    assert chunks[3]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert chunks[4] == {"id": "chatcmpl-" + RID.hex(), "object": "chat.completion.chunk",
                         "created": 123, "model": "m", "system_fingerprint": None,
                         "choices": [], "usage": {
                             "prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                             "prompt_tokens_details": {"cached_tokens": 2}}}
    assert all(c["usage"] is None for c in chunks[:4])  # type: ignore[index]
    assert events[-1] == b"data: [DONE]\n\n"


def test_openai_completions_stream_has_no_role_chunk_and_no_usage_unasked() -> None:
    events, _ = _run(openai_api.COMPLETIONS, _req(include_usage=False))
    texts = [_data(e)["choices"][0]["text"] for e in events[:-1]]  # type: ignore[index]
    assert texts == ["Hello", " world", ""] and events[-1] == b"data: [DONE]\n\n"
    assert all("usage" not in _data(e) for e in events[:-1])  # type: ignore[operator]


def test_anthropic_stream_is_its_named_event_sequence() -> None:
    events, _ = _run(anthropic_api.MESSAGES, None)
    assert [e.split(b"\n")[0].removeprefix(b"event: ") for e in events] == [
        b"message_start", b"content_block_start", b"ping", b"content_block_delta",
        b"content_block_delta", b"content_block_stop", b"message_delta", b"message_stop"]
    assert _data(events[-2])["delta"]["stop_reason"] == "max_tokens"  # type: ignore[index]
    assert _data(events[-2])["usage"]["input_tokens"] == 5   # type: ignore[index]


@pytest.mark.parametrize("dialect,req,last", [
    (openai_api.CHAT, _req(False), {"error": {"message": "CANCELLED: drain timeout",
                                              "type": "server_error", "param": None,
                                              "code": "cancelled_by_server"}}),
    (anthropic_api.MESSAGES, None, {"type": "error", "error": {
        "type": "overloaded_error", "message": "CANCELLED: drain timeout"}}),
])
def test_a_cut_stream_ends_with_the_dialects_error_and_is_counted(dialect, req, last) -> None:  # type: ignore[no-untyped-def]
    events, metrics = _run(dialect, req, cut=True)
    assert _data(events[-1]) == last
    assert metrics.stream_errors.labels(dialect.api)._value.get() == 1


def test_each_dialect_has_its_error_shape_and_key_header() -> None:
    e: ApiError = bad_request("'top_p' must be a number", "top_p")
    assert openai_api.CHAT.error_body(e) == {"error": {
        "message": "'top_p' must be a number", "type": "invalid_request_error",
        "param": "top_p", "code": None}}
    assert anthropic_api.MESSAGES.error_body(e) == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "'top_p' must be a number"}}
    assert anthropic_api.MESSAGES.x_api_key and not openai_api.COMPLETIONS.x_api_key
    assert {d.api for d in (openai_api.CHAT, openai_api.COMPLETIONS, anthropic_api.MESSAGES)
            } == {"chat_completions", "completions", "messages"}
