"""OpenAI's API: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.

The OpenAI dialect of serve.serve (dialect.py): request fields are translated into one
AsyncClient.stream call (generation.GenParams); responses and stream chunks follow OpenAI's
shapes field for field, so the official SDK parses them. Supported: max_tokens /
max_completion_tokens, temperature, top_p, stop, seed, presence_penalty, frequency_penalty,
stream, stream_options.include_usage, response_format (chat: json_schema, strict or not,
and json_object, enforced by the daemon's constrained decoding), logprobs (chat: logprobs +
top_logprobs 0..20; completions: logprobs 0..20, OpenAI's limit there being 5; logprobs.py),
tools with tool_choice and parallel_tool_calls (chat: openai_tools.py); top_k and the
repetition penalty (vLLM's repetition_penalty, llama.cpp's repeat_penalty) as extensions.
Parameters that would change the answer in ways the daemon cannot (n > 1, logit_bias,
functions ...) are refused with 400 rather than ignored.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from zerolayer.client import InvokeResult, TokenLogprob
from zerolayer.daemon.json_value import JSONObject, JSONValue
from zerolayer.protocol.constraint import ResponseFormat, from_response_format
from zerolayer.protocol.errors import MalformedError
from zerolayer.protocol.sampling_params import (
    MAX_ADDITIVE_PENALTY,
    MAX_REPETITION_PENALTY,
    MAX_STOP,
    MAX_TOP_LOGPROBS,
)

from .common import Fields, key_id_for
from .errors import ApiError, bad_request, not_found
from .generation import GenParams
from .logprobs import CompletionLogprobs, chat_logprobs
from .openai_tools import chat_messages, delta, message, parse_tools
from .serve import error_response, serve
from .state import EdgeState, edge
from .streaming import data_event
from .tool_output import ToolDeltas, read
from .tools import ToolSpec, with_tools

MAX_TOKENS_LIMIT = 0xFFFFFFFF
# llama.cpp server extensions some clients send (bench/_harness.py does)
NEUTRAL = {"min_p": (0, 0.0)}


@dataclass(frozen=True)
class OpenAIRequest:
    params: GenParams
    stream: bool
    include_usage: bool
    tools: ToolSpec | None = None     # with tools whose answer is constrained (not `none`)


def _model(f: Fields, cfg_model: str) -> None:
    model = f.string("model", required=True)
    if model != cfg_model:
        raise not_found(f"The model '{model}' does not exist (this server serves "
                        f"'{cfg_model}')", "model", "model_not_found")


class _Sampling(TypedDict):
    """The GenParams fields chat and completions share."""
    max_tokens: int
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]


def _common(f: Fields, st: EdgeState, max_tokens_names: tuple[str, ...]) -> _Sampling:
    """The sampling fields chat and completions share."""
    _model(f, st.cfg.model_name)
    max_tokens = None
    for name in max_tokens_names:
        v = f.integer(name, 1, MAX_TOKENS_LIMIT)
        if v is not None:
            max_tokens = v
    f.neutral("n", 1)
    f.neutral("logit_bias", {})
    for name, values in NEUTRAL.items():
        f.neutral(name, *values)
    f.ignore("user", "metadata", "store", "service_tier")
    seed = f.integer("seed", 0, (1 << 64) - 1)
    # the repetition penalty under vLLM's name or llama.cpp's, not both at odds
    rep = [f.number(n, 0.0, MAX_REPETITION_PENALTY, 1.0, lo_open=True)
           for n in ("repetition_penalty", "repeat_penalty")]
    if f.has("repetition_penalty") and f.has("repeat_penalty") and rep[0] != rep[1]:
        raise bad_request("'repetition_penalty' and 'repeat_penalty' disagree",
                          "repetition_penalty")
    return {"max_tokens": max_tokens or st.cfg.default_max_tokens,
            "repetition_penalty": rep[0] if f.has("repetition_penalty") else rep[1],
            "presence_penalty": f.number("presence_penalty", -MAX_ADDITIVE_PENALTY,
                                         MAX_ADDITIVE_PENALTY, 0.0),
            "frequency_penalty": f.number("frequency_penalty", -MAX_ADDITIVE_PENALTY,
                                          MAX_ADDITIVE_PENALTY, 0.0),
            "temperature": f.number("temperature", 0.0, 2.0, 1.0),
            "top_p": f.number("top_p", 0.0, 1.0, 1.0, lo_open=True),
            "top_k": f.integer("top_k", 0, 0xFFFFFFFF, default=0) or 0,
            "seed": seed, "stop": f.stop_list("stop", MAX_STOP)}


def _stream_flags(f: Fields) -> tuple[bool, bool]:
    stream = f.boolean("stream")
    opts = f.raw("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true",
                              "stream_options")
        if not isinstance(opts, dict) or set(opts) - {"include_usage"}:
            raise bad_request("'stream_options' supports only include_usage", "stream_options")
        include_usage = opts.get("include_usage") is True
    return stream, include_usage


def parse_chat(body: JSONObject, st: EdgeState) -> OpenAIRequest:
    f = Fields(body)
    common = _common(f, st, ("max_tokens", "max_completion_tokens"))
    logprobs = f.boolean("logprobs")
    top = f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    f.refuse("functions", "function_call", "audio", "modalities", "prediction",
             "reasoning_effort", "web_search_options")
    spec = parse_tools(f)
    fmt = _response_format(f.raw("response_format"))
    msgs = chat_messages(f.raw("messages"))
    stream, include_usage = _stream_flags(f)
    f.refuse_unknown()
    if spec is None or not spec.active:
        return OpenAIRequest(GenParams(prompt=None, messages=msgs, logprobs=logprobs,
                                       top_logprobs=top or 0, response_format=fmt, **common),
                             stream, include_usage)
    # The answer is constrained to the tool format: another constraint cannot also hold,
    # and the logprobs would be of the format's JSON rather than of the reply.
    if fmt is not None:
        raise bad_request("'response_format' cannot be combined with tools unless "
                          "tool_choice is 'none'", "response_format")
    if logprobs:
        raise bad_request("'logprobs' cannot be combined with tools unless tool_choice is "
                          "'none'", "logprobs")
    return OpenAIRequest(GenParams(prompt=None, messages=with_tools(msgs, spec),
                                   response_format=spec.response_format(),
                                   constraint_param="tools", **common),
                         stream, include_usage, spec)


def _response_format(fmt: object) -> ResponseFormat | None:
    """OpenAI's response_format, as the SDK takes it: json_schema (strict or not: the
    daemon's constrained decoding always enforces the schema) or json_object; text or none
    is free text. Its shape and size are checked here; whether the schema can be compiled
    and satisfied the daemon says (a 400 naming the field all the same)."""
    try:
        c = from_response_format(fmt)  # type: ignore[arg-type]  # any JSON: it checks
    except MalformedError as e:
        raise bad_request(f"'response_format': {e.message}", "response_format") from None
    if c is None or not isinstance(fmt, dict):
        return None
    js = fmt.get("json_schema")
    if isinstance(js, dict) and js.get("strict") not in (None, True, False):
        raise bad_request("'response_format.json_schema.strict' must be a boolean",
                          "response_format")
    return dict(fmt)


def parse_completion(body: JSONObject, st: EdgeState) -> OpenAIRequest:
    f = Fields(body)
    common = _common(f, st, ("max_tokens",))
    f.neutral("echo", False)
    f.neutral("best_of", 1)
    f.neutral("suffix", "")
    top = f.integer("logprobs", 0, MAX_TOP_LOGPROBS)   # null: none; N: the top N as well
    prompt = f.raw("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_request("'prompt' must be a string (one prompt; token arrays and batches "
                          "are not supported)", "prompt")
    stream, include_usage = _stream_flags(f)
    f.refuse_unknown()
    return OpenAIRequest(GenParams(prompt=prompt, messages=None, logprobs=top is not None,
                                   top_logprobs=top or 0, **common), stream, include_usage)


def finish_reason(r: InvokeResult | None, called: bool = False) -> str:
    # "cancelled" only happens when the edge cancels, and then nobody reads the answer.
    if r is not None and r.finish_reason == "length":
        return "length"
    return "tool_calls" if called else "stop"


def usage(r: InvokeResult) -> JSONObject:
    u = r.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens}}


class OpenAIChunks:
    """One OpenAI stream: `data:` events of chat.completion.chunk (a first chunk with the
    role, then deltas) or text_completion objects, a finish chunk, the usage chunk if asked
    for, and `data: [DONE]`."""

    def __init__(self, req: OpenAIRequest, chat: bool, request_id: bytes, model: str,
                 created: int) -> None:
        self._chat = chat
        self._include_usage = req.include_usage
        self._request_id = request_id
        self._tools = ToolDeltas() if req.tools is not None else None
        self._logprobs = req.params.logprobs
        self._offsets = CompletionLogprobs()
        self._base: dict[str, JSONValue] = {
            "id": ("chatcmpl-" if chat else "cmpl-") + request_id.hex(),
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created, "model": model, "system_fingerprint": None}
        if req.include_usage:
            self._base["usage"] = None    # OpenAI: null on every chunk but the last one

    def _chunk(self, text: str | None, finish: str | None = None,
               role: bool = False, logprobs: Sequence[TokenLogprob] | None = None,
               tool_delta: JSONObject | None = None) -> bytes:
        if self._chat:
            d: dict[str, JSONValue] = {}
            if role:
                d["role"] = "assistant"
            if text is not None:
                d["content"] = text
            choice: dict[str, JSONValue] = {"index": 0, "delta": tool_delta or d}
        else:
            choice = {"index": 0, "text": text or ""}
        choice["logprobs"] = (None if logprobs is None else chat_logprobs(logprobs) if self._chat
                              else self._offsets.next(logprobs))
        choice["finish_reason"] = finish
        return data_event({**self._base, "choices": [choice]})

    def start(self) -> list[bytes]:
        return [self._chunk("", role=True)] if self._chat else []

    def chunk(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        if self._tools is not None:
            return b"".join(self._chunk(None, tool_delta=delta(d, self._request_id))
                            for d in self._tools.push(text))
        return self._chunk(text, logprobs=logprobs if self._logprobs else None)

    def error(self, e: ApiError) -> bytes:
        return data_event(e.openai_body())   # OpenAI's in-stream error: no event name

    def end(self, r: InvokeResult | None) -> list[bytes]:
        called = self._tools is not None and self._tools.calls_started > 0
        out = [self._chunk(None, finish_reason(r, called))]
        if self._include_usage and r is not None:
            out.append(data_event({**self._base, "choices": [], "usage": usage(r)}))
        out.append(b"data: [DONE]\n\n")
        return out


@dataclass(frozen=True)
class OpenAIDialect:
    """OpenAI's chat completions (`chat`) or legacy completions, as a serve.Dialect."""
    api: str
    chat: bool
    x_api_key: bool = False

    def parse(self, body: JSONObject, st: EdgeState) -> OpenAIRequest:
        return (parse_chat if self.chat else parse_completion)(body, st)

    def error_body(self, e: ApiError) -> JSONObject:
        return e.openai_body()

    def body(self, req: OpenAIRequest, r: InvokeResult, text: str, model: str,
             created: int) -> JSONObject:
        lps = r.logprobs if req.params.logprobs else None
        if self.chat:
            answer = read(text) if req.tools is not None else None
            msg = ({"role": "assistant", "content": text, "refusal": None} if answer is None
                   else message(answer, r.request_id))
            return {"id": "chatcmpl-" + r.request_id.hex(), "object": "chat.completion",
                    "created": created, "model": model, "system_fingerprint": None,
                    "choices": [{"index": 0, "message": msg,
                                 "logprobs": None if lps is None else chat_logprobs(lps),
                                 "finish_reason": finish_reason(
                                     r, answer is not None and bool(answer.named_calls))}],
                    "usage": usage(r)}
        return {"id": "cmpl-" + r.request_id.hex(), "object": "text_completion",
                "created": created, "model": model, "system_fingerprint": None,
                "choices": [{"index": 0, "text": text,
                             "logprobs": (None if lps is None
                                          else CompletionLogprobs().next(lps)),
                             "finish_reason": finish_reason(r)}],
                "usage": usage(r)}

    def chunks(self, req: OpenAIRequest, request_id: bytes, model: str,
               created: int) -> OpenAIChunks:
        return OpenAIChunks(req, self.chat, request_id, model, created)


CHAT = OpenAIDialect("chat_completions", chat=True)
COMPLETIONS = OpenAIDialect("completions", chat=False)


async def chat_completions(request: Request) -> Response:
    return await serve(request, CHAT)


async def completions(request: Request) -> Response:
    return await serve(request, COMPLETIONS)


async def list_models(request: Request) -> Response:
    """One model. The entries carry OpenAI's fields and Anthropic's, so both SDKs' model
    listing parses the same answer (the two APIs share the path)."""
    st = edge(request)
    status = 200
    try:
        key_id_for(request, st.tokens, x_api_key=True)
        name = request.path_params.get("model")
        if name is not None and name != st.cfg.model_name:
            raise not_found(f"The model '{name}' does not exist", "model", "model_not_found")
        entry = {"id": st.cfg.model_name, "object": "model", "created": 0,
                 "owned_by": "zerolayer", "type": "model",
                 "display_name": st.cfg.model_name, "created_at": "1970-01-01T00:00:00Z"}
        if name is not None:
            return JSONResponse(entry)
        return JSONResponse({"object": "list", "data": [entry], "has_more": False,
                             "first_id": st.cfg.model_name, "last_id": st.cfg.model_name})
    except ApiError as e:
        status = e.status
        return error_response(CHAT, e)
    finally:
        st.metrics.requests.labels("models", str(status)).inc()
