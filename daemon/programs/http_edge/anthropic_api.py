"""Anthropic's Messages API: POST /v1/messages, plain and streamed; the Anthropic dialect of
serve.serve (dialect.py).

The stream is Anthropic's event sequence: message_start, content_block_start, ping,
content_block_delta (text_delta) per chunk, content_block_stop, message_delta (stop_reason,
usage), message_stop; an error after the start is an `event: error`. Supported: system,
max_tokens (required), stop_sequences, temperature, top_p, top_k, stream, tools and
tool_choice with tool_use / tool_result blocks (anthropic_tools.py: a streamed call is a
tool_use block whose input comes as input_json_delta events). The key comes from
`x-api-key` (Anthropic's header) or `Authorization: Bearer`.

stop_reason: the daemon's DONE says "stop" for the end of the turn (EOS) and for a matched
stop string, and its stop_index names which stop string (PROTOCOL §5.2); the SDK's result
carries it as `stop_sequence`. So "stop" with a stop string is "stop_sequence" with the
string, without one "end_turn"; "length" is "max_tokens"; an answer that calls tools
"tool_use".
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from zerolayer.client import ChatMessage, InvokeResult, TokenLogprob
from zerolayer.daemon.json_value import JSONObject, JSONValue
from zerolayer.protocol.sampling_params import MAX_STOP

from .anthropic_tools import content, parse_tools, turn, use_id
from .common import Fields
from .errors import ApiError, bad_request, not_found
from .generation import GenParams
from .serve import serve
from .state import EdgeState
from .streaming import named_event
from .tool_output import ArgumentsDelta, CallStart, TextDelta, ToolDeltas, read
from .tools import ToolSpec, with_tools

API = "messages"


@dataclass(frozen=True)
class MessagesRequest:
    params: GenParams
    stream: bool
    tools: ToolSpec | None = None     # with tools whose answer is constrained (not `none`)


def _text(content: JSONValue, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for i, block in enumerate(content):
            text = block.get("text") if isinstance(block, dict) else None
            if (not isinstance(block, dict) or block.get("type") != "text"
                    or not isinstance(text, str)):
                raise bad_request(f"{where}.{i}: only text content blocks are supported")
            parts.append(text)
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of text blocks")


def parse_messages(body: JSONObject, st: EdgeState) -> MessagesRequest:
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
    names: dict[str, str] = {}          # tool_use id -> the called tool's name
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"{where}: role must be 'user' or 'assistant'")
        if set(m) - {"role", "content"}:
            raise bad_request(f"{where}: unsupported field(s) {sorted(set(m) - {'role', 'content'})}")
        msgs.extend(turn(m["role"], m.get("content"), where, names))
    spec = parse_tools(f.raw("tools"), f.raw("tool_choice"))
    f.refuse("thinking", "mcp_servers", "container", "output_config")
    # no effect on the answer: request metadata, and prompt-cache hints (the daemon's
    # prefix cache reuses prompts by itself)
    f.ignore("metadata", "service_tier", "cache_control", "user_profile_id", "workspace_id")
    stream = f.boolean("stream")
    active = spec if spec is not None and spec.active else None
    params = GenParams(prompt=None, messages=with_tools(msgs, active) if active
                       else tuple(msgs), max_tokens=max_tokens,
                       temperature=f.number("temperature", 0.0, 1.0, 1.0),
                       top_p=f.number("top_p", 0.0, 1.0, 1.0, lo_open=True),
                       top_k=f.integer("top_k", 0, 0xFFFFFFFF, default=0) or 0,
                       stop=f.stop_list("stop_sequences", MAX_STOP),
                       response_format=active.response_format() if active else None,
                       constraint_param="tools")
    f.refuse_unknown()
    return MessagesRequest(params, stream, active)


def stop_reason(r: InvokeResult | None, called: bool = False) -> str:
    if r is not None and r.finish_reason == "length":
        return "max_tokens"
    if called:
        return "tool_use"
    return "stop_sequence" if r is not None and r.stop_sequence is not None else "end_turn"


def stop_sequence(r: InvokeResult | None) -> str | None:
    return r.stop_sequence if r is not None else None


def _usage(r: InvokeResult) -> JSONObject:
    u = r.usage
    # Anthropic counts cache reads apart from input_tokens: input = the uncached part.
    return {"input_tokens": u.prompt_tokens - u.cached_prompt_tokens,
            "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_prompt_tokens,
            "cache_creation_input_tokens": 0}


class AnthropicChunks:
    """One Messages stream, in Anthropic's named events."""

    def __init__(self, request_id: bytes, model: str, tools: bool = False) -> None:
        self._id = "msg_" + request_id.hex()
        self._model = model
        self._request_id = request_id
        # With tools, a block opens once the answer shows what it is (text or a call).
        self._tools = ToolDeltas() if tools else None
        self._open: int | None = None       # the index of the block open now
        self._blocks = 0                    # blocks opened so far

    def start(self) -> list[bytes]:
        # Prompt tokens are known only at DONE; message_start carries 0 and message_delta
        # the real counts (the SDKs take usage from message_delta).
        return [
            named_event("message_start", {"type": "message_start", "message": {
                "id": self._id, "type": "message", "role": "assistant", "model": self._model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            *([] if self._tools is not None else [self._start_block({"type": "text",
                                                                      "text": ""})]),
            named_event("ping", {"type": "ping"})]

    def _start_block(self, block: dict[str, JSONValue]) -> bytes:
        out = self._stop_block()
        self._open, self._blocks = self._blocks, self._blocks + 1
        return out + named_event("content_block_start", {
            "type": "content_block_start", "index": self._open, "content_block": block})

    def _stop_block(self) -> bytes:
        if self._open is None:
            return b""
        i, self._open = self._open, None
        return named_event("content_block_stop", {"type": "content_block_stop", "index": i})

    def _delta(self, delta: dict[str, JSONValue]) -> bytes:
        return named_event("content_block_delta", {"type": "content_block_delta",
                                                   "index": self._open, "delta": delta})

    def chunk(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        # (Anthropic's API has no logprobs; a request here never asks for them)
        if self._tools is None:
            return self._delta({"type": "text_delta", "text": text})
        out = []
        for d in self._tools.push(text):
            if isinstance(d, TextDelta):
                if self._open is None:
                    out.append(self._start_block({"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": d.text}))
            elif isinstance(d, CallStart):
                out.append(self._start_block({"type": "tool_use",
                                              "id": use_id(self._request_id, d.index),
                                              "name": d.name, "input": {}}))
            else:
                assert isinstance(d, ArgumentsDelta)
                out.append(self._delta({"type": "input_json_delta", "partial_json": d.text}))
        return b"".join(out)

    def error(self, e: ApiError) -> bytes:
        return named_event("error", e.anthropic_body())

    def end(self, r: InvokeResult | None) -> list[bytes]:
        called = self._tools is not None and self._tools.calls_started > 0
        opened = (b"" if self._blocks else   # an empty answer still has its text block
                  self._start_block({"type": "text", "text": ""}))
        return [
            opened + self._stop_block(),
            named_event("message_delta", {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(r, called),
                          "stop_sequence": stop_sequence(r)},
                "usage": _usage(r) if r is not None else {"output_tokens": 0}}),
            named_event("message_stop", {"type": "message_stop"})]


class AnthropicDialect:
    """Anthropic's Messages API as a serve.Dialect."""
    api: str = API
    x_api_key: bool = True

    def parse(self, body: JSONObject, st: EdgeState) -> MessagesRequest:
        return parse_messages(body, st)

    def error_body(self, e: ApiError) -> JSONObject:
        return e.anthropic_body()

    def body(self, req: MessagesRequest, r: InvokeResult, text: str, model: str,
             created: int) -> JSONObject:
        answer = read(text) if req.tools is not None else None
        blocks = ([{"type": "text", "text": text}] if answer is None
                  else content(answer, r.request_id))
        return {"id": "msg_" + r.request_id.hex(), "type": "message", "role": "assistant",
                "model": model, "content": blocks,
                "stop_reason": stop_reason(r, answer is not None and bool(answer.named_calls)),
                "stop_sequence": stop_sequence(r), "usage": _usage(r)}

    def chunks(self, req: MessagesRequest, request_id: bytes, model: str,
               created: int) -> AnthropicChunks:
        return AnthropicChunks(request_id, model, req is not None and req.tools is not None)


MESSAGES = AnthropicDialect()


async def messages(request: Request) -> Response:
    return await serve(request, MESSAGES)
