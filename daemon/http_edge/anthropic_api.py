"""Anthropic's Messages API: POST /v1/messages, plain and streamed.

The stream is Anthropic's event sequence: message_start, content_block_start, ping,
content_block_delta (text_delta) per chunk, content_block_stop, message_delta (stop_reason,
usage), message_stop; an error after the start is an `event: error`. Supported: system,
max_tokens (required), stop_sequences, temperature, top_p, top_k, stream; text content
only. The key comes from `x-api-key` (Anthropic's header) or `Authorization: Bearer`.

stop_reason: the daemon's DONE says "stop" both for the end of the turn (EOS) and for a
matched stop string (PROTOCOL §5.2, finish_reason 0), and the matched string is never sent,
so the edge cannot tell the two apart: every "stop" is reported as "end_turn" (and
`stop_sequence` stays null), "length" as "max_tokens". Telling them apart needs a finish
reason of its own in DONE (a protocol change).
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from zerolayer.client import ChatMessage, InvokeResult, ZerolayerError
from zerolayer.client.sampling_params import MAX_STOP

from .common import Fields, key_id_for, read_json
from .errors import ApiError, bad_request, not_found
from .generation import ClientGone, Generation, GenParams, daemon_error, until_disconnect
from .state import EdgeState, edge
from .streaming import GenerationSSE, named_event

API = "messages"


@dataclass(frozen=True)
class MessagesRequest:
    params: GenParams
    stream: bool


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, block in enumerate(content):
            if (not isinstance(block, dict) or block.get("type") != "text"
                    or not isinstance(block.get("text"), str)):
                raise bad_request(f"{where}.{i}: only text content blocks are supported")
            parts.append(block["text"])
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of text blocks")


def parse_messages(body: dict[str, Any], st: EdgeState) -> MessagesRequest:
    f = Fields(body)
    model = f.string("model", required=True)
    if model != st.cfg.model_name:
        raise not_found(f"model: {model} (this server serves '{st.cfg.model_name}')")
    max_tokens = f.integer("max_tokens", 1, 0xFFFFFFFF, required=True)
    assert max_tokens is not None
    msgs: list[ChatMessage] = []
    system = f.raw("system")
    if system is not None:
        msgs.append(ChatMessage("system", _text(system, "system")))
    raw = f.raw("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages: must be a non-empty list")
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"{where}: role must be 'user' or 'assistant'")
        if set(m) - {"role", "content"}:
            raise bad_request(f"{where}: unsupported field(s) {sorted(set(m) - {'role', 'content'})}")
        msgs.append(ChatMessage(m["role"], _text(m.get("content"), where)))
    f.refuse("tools", "tool_choice", "thinking", "mcp_servers", "container", "output_config")
    # no effect on the answer: request metadata, and prompt-cache hints (the daemon's
    # prefix cache reuses prompts by itself)
    f.ignore("metadata", "service_tier", "cache_control", "user_profile_id", "workspace_id")
    stream = f.boolean("stream")
    params = GenParams(prompt=None, messages=tuple(msgs), max_tokens=max_tokens,
                       temperature=f.number("temperature", 0.0, 1.0, 1.0),
                       top_p=f.number("top_p", 0.0, 1.0, 1.0, lo_open=True),
                       top_k=f.integer("top_k", 0, 0xFFFFFFFF, default=0) or 0,
                       stop=f.stop_list("stop_sequences", MAX_STOP))
    f.refuse_unknown()
    return MessagesRequest(params, stream)


def stop_reason(r: InvokeResult | None) -> str:
    return "max_tokens" if r is not None and r.finish_reason == "length" else "end_turn"


def _usage(r: InvokeResult) -> dict[str, Any]:
    u = r.usage
    # Anthropic counts cache reads apart from input_tokens: input = the uncached part.
    return {"input_tokens": u.prompt_tokens - u.cached_prompt_tokens,
            "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_prompt_tokens,
            "cache_creation_input_tokens": 0}


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.anthropic_body(), status_code=e.status, headers=e.headers())


async def messages(request: Request) -> Response:
    st = edge(request)
    t0 = time.monotonic()
    status = 500
    streaming = False
    try:
        kid = key_id_for(request, st.tokens, x_api_key=True)
        body = await read_json(request)
        req = parse_messages(body, st)
        gen = await Generation.open(request, st.backend.client(kid), req.params, API,
                                    st.metrics, t0)
        if req.stream:
            status, streaming = 200, True
            return GenerationSSE(_events(gen, st), gen, st.metrics, API)
        try:
            text = await until_disconnect(request, gen.text)
        except ZerolayerError as e:
            raise daemon_error(e, st.metrics) from None
        finally:
            await gen.finish()
        r = gen.result
        assert r is not None
        status = 200
        return JSONResponse({
            "id": "msg_" + r.request_id.hex(), "type": "message", "role": "assistant",
            "model": st.cfg.model_name, "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason(r), "stop_sequence": None, "usage": _usage(r)})
    except ApiError as e:
        status = e.status
        return error_response(e)
    except ClientGone:
        status = 499
        return Response(status_code=499)
    finally:
        st.metrics.requests.labels(API, str(status)).inc()
        if not streaming:
            st.metrics.duration.labels(API).observe(time.monotonic() - t0)


async def _events(gen: Generation, st: EdgeState) -> AsyncIterator[bytes]:
    msg_id = "msg_" + gen.stream.request_id.hex()
    # Prompt tokens are known only at DONE; message_start carries 0 and message_delta the
    # real counts (the SDKs take usage from message_delta).
    yield named_event("message_start", {"type": "message_start", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": st.cfg.model_name,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0}}})
    yield named_event("content_block_start", {"type": "content_block_start", "index": 0,
                                              "content_block": {"type": "text", "text": ""}})
    yield named_event("ping", {"type": "ping"})
    try:
        async for text in gen.chunks():
            yield named_event("content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text}})
    except ZerolayerError as e:
        st.metrics.stream_errors.labels(API).inc()
        yield named_event("error", daemon_error(e, st.metrics).anthropic_body())
        return
    r = gen.result
    yield named_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield named_event("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason(r), "stop_sequence": None},
        "usage": _usage(r) if r is not None else {"output_tokens": 0}})
    yield named_event("message_stop", {"type": "message_stop"})
