"""The edge's tool calls without a daemon: the generic format (tools.py), reading answers back
whole and streamed (tool_output.py), both APIs' parsing and refusals, and their stream
events fed values. End to end, with the real SDKs and the model: test_http_tools.py."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import jsonschema
import pytest

from zerolayer.client import ChatMessage, InvokeResult
from zerolayer.daemon.programs.http_edge import anthropic_api, openai_api, serve
from zerolayer.daemon.programs.http_edge.errors import ApiError
from zerolayer.daemon.programs.http_edge.generation import Generation
from zerolayer.daemon.programs.http_edge.metrics import EdgeMetrics
from zerolayer.daemon.programs.http_edge.tool_output import (
    ArgumentsDelta,
    CallStart,
    TextDelta,
    ToolDeltas,
    read,
)
from zerolayer.daemon.programs.http_edge.tools import Tool, ToolSpec
from zerolayer.protocol.constraint import from_response_format
from zerolayer.protocol.wire import Timings, Usage

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}
TOOLS = (Tool("get_weather", "Weather in a city", WEATHER), Tool("get_time", "", TIME))
OAI_TOOLS = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.parameters}} for t in TOOLS]
ANTH_TOOLS = [{"name": t.name, "description": t.description, "input_schema": t.parameters}
              for t in TOOLS]
CALLS = ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa\\"ris }\\u00e9", '
         '"unit": "c"}}, {"name": "get_time", "arguments": {"tz": "UTC"}}]}')
REPLY = '{"response": "Hello \\ud83d\\ude00 and \\"quotes\\" {not json}"}'
ST = SimpleNamespace(cfg=SimpleNamespace(model_name="m", default_max_tokens=16))
RID = bytes(range(16))


def result(finish: str = "stop") -> InvokeResult:
    return InvokeResult("", Usage(7, 0, 3), Timings(1, 2, 3, 4), finish, RID, 0.1, 0.2, 1)


# ---------------------------------------------------------------- the format

@pytest.mark.parametrize("mode,named,parallel", [("auto", None, True), ("required", None, False),
                                                 ("required", "get_time", True)])
def test_the_schema_admits_exactly_the_format(mode, named, parallel) -> None:  # type: ignore[no-untyped-def]
    spec = ToolSpec(TOOLS, mode, parallel, named)
    schema = spec.schema()
    assert from_response_format(spec.response_format()) is not None   # the SDK's shape
    ok = jsonschema.Draft202012Validator(schema).is_valid

    def calls(*cs: tuple[str, object]) -> dict[str, object]:
        return {"tool_calls": [{"name": n, "arguments": a} for n, a in cs]}
    weather, clock = ("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {"tz": "UTC"})
    assert ok(calls(clock))
    assert ok(calls(weather)) == (named is None)
    assert ok(calls(clock, clock)) == parallel
    assert ok({"response": "hi"}) == (mode == "auto")
    assert not ok(calls(("get_weather", {"city": "Paris", "unit": "k"})))   # its arguments
    assert not ok(calls(("get_date", {})))                                   # no such tool
    assert not ok({"tool_calls": []}) and not ok({"response": "hi", "tool_calls": []})


PERSON = {"type": "object", "properties": {"who": {"$ref": "#/$defs/Person"}}, "required": ["who"],
          "$defs": {"Person": {"type": "object", "required": ["name"], "properties": {
              "name": {"type": "string"},
              "boss": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]}}}}}


def test_a_tools_own_defs_and_references_still_resolve() -> None:
    # pydantic writes nested models as $defs and "#/$defs/..." references: nested under the
    # format's call object as they are, they would point at the answer's root instead
    for spec in (ToolSpec((Tool("hire", "", PERSON), TOOLS[1]), "auto", True),
                 ToolSpec((Tool("hire", "", PERSON),), "required", True)):
        ok = jsonschema.Draft202012Validator(spec.schema()).is_valid

        def hire(who: object) -> dict[str, object]:
            return {"tool_calls": [{"name": "hire", "arguments": {"who": who}}]}
        assert ok(hire({"name": "A", "boss": {"name": "B", "boss": None}}))
        assert not ok(hire({"name": "A", "boss": {"boss": None}}))     # B's name missing
    assert PERSON["properties"]["who"] == {"$ref": "#/$defs/Person"}   # the tool's own: as given


def test_parameters_nested_too_deep_are_refused_before_any_recursion() -> None:
    deep: dict[str, object] = {"type": "object"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ApiError) as ei:
        oai(tools=[{"type": "function", "function": {"name": "f", "parameters": deep}}])
    assert ei.value.param == "tools" and "deeper than" in ei.value.message


def test_the_system_turn_lists_the_offered_tools() -> None:
    text = ToolSpec(TOOLS, "required", True, "get_time").system_text()
    assert '"get_time"' in text and "get_weather" not in text
    assert '"get_weather"' in ToolSpec(TOOLS, "auto", True).system_text()


def test_reading_whole_answers() -> None:
    r = read(CALLS)
    assert r.whole and r.text is None
    assert [(c.name, json.loads(c.arguments), c.complete) for c in r.calls] == [
        ("get_weather", {"city": 'Pa"ris }é', "unit": "c"}, True),
        ("get_time", {"tz": "UTC"}, True)]
    assert read(REPLY).text == 'Hello 😀 and "quotes" {not json}'
    # not the format (a model without the constraint): the whole text is the reply
    assert read("Paris, of course.").text == "Paris, of course."


@pytest.mark.parametrize("answer", [CALLS, REPLY])
def test_every_prefix_extends_the_last_and_deltas_add_up_to_the_whole(answer: str) -> None:
    whole = read(answer)
    last = read("")
    for n in range(len(answer) + 1):
        r = read(answer[:n])
        if last.text is not None:
            assert r.text is not None and r.text.startswith(last.text)
        assert len(r.calls) >= len(last.calls)
        for old, new in zip(last.calls, r.calls):
            assert new.arguments.startswith(old.arguments)
            assert old.name is None or new.name == old.name
        last = r
    for step in (1, 2, 5, len(answer)):
        d = ToolDeltas()
        deltas = [x for i in range(0, len(answer), step) for x in d.push(answer[i:i + step])]
        text = "".join(x.text for x in deltas if isinstance(x, TextDelta))
        names = [x.name for x in deltas if isinstance(x, CallStart)]
        args = ["".join(x.text for x in deltas if isinstance(x, ArgumentsDelta) and x.index == i)
                for i in range(len(names))]
        assert text == (whole.text or "")
        assert names == [c.name for c in whole.calls]
        assert args == [c.arguments for c in whole.calls]


def test_an_answer_cut_inside_a_name_has_no_call_for_it() -> None:
    r = read(CALLS[:CALLS.index("get_time") + 3])
    assert [c.name for c in r.named_calls] == ["get_weather"] and len(r.calls) == 2


# ---------------------------------------------------------------- OpenAI

def oai(**body: object) -> openai_api.OpenAIRequest:
    return openai_api.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                  **body}, ST)  # type: ignore[arg-type]


def test_openai_tools_constrain_the_answer_and_describe_the_tools() -> None:
    req = oai(tools=OAI_TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
              parallel_tool_calls=False)
    assert req.tools == ToolSpec(TOOLS, "required", False, "get_time")
    p = req.params
    assert p.response_format == req.tools.response_format() and p.constraint_param == "tools"
    assert p.messages is not None and p.messages[0].role == "system"
    assert "get_time" in p.messages[0].content and p.messages[1] == ChatMessage("user", "hi")
    assert oai(tools=OAI_TOOLS).tools == ToolSpec(TOOLS, "auto", True)
    none = oai(tools=OAI_TOOLS, tool_choice="none")      # free text, no tools in the prompt
    assert none.tools is None and none.params.response_format is None
    assert none.params.messages == (ChatMessage("user", "hi"),)


def test_openai_conversation_with_a_tool_result() -> None:
    req = oai(tools=OAI_TOOLS, tool_choice="none", messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"}])
    assert req.params.messages == (
        ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", '{"tool_calls": [{"name": "get_weather", "arguments": '
                                 '{"city": "Paris", "unit": "c"}}]}'),
        ChatMessage("user", '{"tool_response": {"name": "get_weather", '
                            '"content": "21 C, sunny"}}'))


@pytest.mark.parametrize("body,param,words", [
    ({"tool_choice": "auto"}, "tool_choice", "only allowed when 'tools'"),
    ({"tools": OAI_TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "'nope'"),
    ({"tools": OAI_TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools", "type 'object'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
     "tools", "JSON schema object"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "name"),
    ({"tools": OAI_TOOLS + OAI_TOOLS[:1]}, "tools", "unique"),
    ({"tools": []}, "tools", "1..128"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", "only"),
    ({"tools": OAI_TOOLS, "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined"),
    ({"tools": OAI_TOOLS, "logprobs": True}, "logprobs", "cannot be combined"),
    ({"messages": [{"role": "tool", "tool_call_id": "x", "content": "1"}]}, "messages[0]",
     "answers no tool call"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}, "messages[0]",
     "needs an 'id'"),
])
def test_openai_hostile_tools_are_400s_naming_the_field(body, param, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiError) as ei:
        oai(**body)
    assert ei.value.status == 400 and ei.value.param == param and words in ei.value.message


def events(dialect, req, chunks: list[str], finish: str = "stop") -> list[bytes]:  # type: ignore[no-untyped-def]
    class Stream:
        request_id, logprobs, result = RID, [], None

        def __aiter__(self):  # type: ignore[no-untyped-def]
            return self

        async def __anext__(self) -> str:
            if chunks:
                return chunks.pop(0)
            self.result = result(finish)
            raise StopAsyncIteration

    metrics = EdgeMetrics()
    gen = Generation(Stream(), dialect.api, metrics, 0.0)  # type: ignore[arg-type]
    shape = dialect.chunks(req, RID, "m", 1)

    async def collect() -> list[bytes]:
        return [e async for e in serve.events(gen, shape, SimpleNamespace(metrics=metrics))]  # type: ignore[arg-type]
    return asyncio.run(collect())


def data(e: bytes) -> dict:  # type: ignore[type-arg]
    return json.loads(e.split(b"data: ", 1)[1])  # type: ignore[no-any-return]


def split(answer: str, n: int = 4) -> list[str]:
    return [answer[i:i + n] for i in range(0, len(answer), n)]


def test_openai_stream_of_calls_reassembles_into_the_whole_answer() -> None:
    req = oai(tools=OAI_TOOLS, stream=True)
    evs = [data(x) for e in events(openai_api.CHAT, req, split(CALLS))
           for x in e.split(b"\n\n") if x.startswith(b"data: {")]
    calls: dict[int, dict[str, str]] = {}
    for ev in evs:
        for tc in ev["choices"][0]["delta"].get("tool_calls", []):
            c = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
            c["id"] += tc.get("id", "")
            c["name"] += tc.get("function", {}).get("name", "")
            c["arguments"] += tc["function"]["arguments"]
    body = openai_api.CHAT.body(req, result(), CALLS, "m", 1)
    whole = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "tool_calls" and whole["content"] is None
    assert [calls[i] for i in sorted(calls)] == [
        {"id": c["id"], **c["function"]} for c in whole["tool_calls"]]
    assert evs[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_openai_stream_of_a_reply_is_content_deltas() -> None:
    req = oai(tools=OAI_TOOLS, stream=True)
    evs = [data(e) for e in events(openai_api.CHAT, req, split(REPLY))[:-1]]
    text = "".join(ev["choices"][0]["delta"].get("content") or "" for ev in evs)
    assert text == read(REPLY).text and evs[-1]["choices"][0]["finish_reason"] == "stop"


# ---------------------------------------------------------------- Anthropic

def anth(**body: object) -> anthropic_api.MessagesRequest:
    return anthropic_api.parse_messages({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "hi"}], **body}, ST)  # type: ignore[arg-type]


def test_anthropic_tool_choice_kinds() -> None:
    assert anth(tools=ANTH_TOOLS).tools == ToolSpec(TOOLS, "auto", True)
    assert anth(tools=ANTH_TOOLS, tool_choice={"type": "any"}).tools == ToolSpec(
        TOOLS, "required", True)
    assert anth(tools=ANTH_TOOLS, tool_choice={
        "type": "tool", "name": "get_time", "disable_parallel_tool_use": True}).tools == ToolSpec(
        TOOLS, "required", False, "get_time")
    assert anth(tools=ANTH_TOOLS, tool_choice={"type": "none"}).tools is None


def test_anthropic_conversation_with_tool_use_and_result() -> None:
    req = anth(tools=ANTH_TOOLS, tool_choice={"type": "none"}, messages=[
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"tz": "UTC"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": [{"type": "text", "text": "clock broken"}]}]}])
    assert req.params.messages == (
        ChatMessage("user", "Time?"),
        ChatMessage("assistant", 'Checking.\n{"tool_calls": [{"name": "get_time", '
                                 '"arguments": {"tz": "UTC"}}]}'),
        ChatMessage("user", '{"tool_response": {"name": "get_time", "content": "clock broken", '
                            '"is_error": true}}'))


@pytest.mark.parametrize("body,words", [
    ({"tool_choice": {"type": "auto"}}, "only allowed when tools"),
    ({"tools": ANTH_TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "'nope'"),
    ({"tools": ANTH_TOOLS, "tool_choice": {"type": "sometimes"}}, "type must be"),
    ({"tools": [{"name": "f"}]}, "input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "only custom tools"),
    ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "type 'object'"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "x", "content": "1"}]}]}, "answers no tool_use"),
])
def test_anthropic_hostile_tools_are_400s(body, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiError) as ei:
        anth(**body)
    assert ei.value.status == 400 and words in ei.value.message


def test_anthropic_stream_of_calls_is_tool_use_blocks_with_input_json_deltas() -> None:
    req = anth(tools=ANTH_TOOLS, stream=True)
    evs = [(e.split(b"\n")[0].removeprefix(b"event: ").decode(), data(e))
           for raw in events(anthropic_api.MESSAGES, req, split(CALLS))
           for e in raw.split(b"\n\n") if e]
    names = [n for n, _ in evs]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta",
                                                                      "message_stop"]
    blocks: dict[int, dict[str, object]] = {}
    for name, ev in evs:
        if name == "content_block_start":
            blocks[ev["index"]] = {**ev["content_block"], "json": ""}
        elif name == "content_block_delta":
            assert ev["delta"]["type"] == "input_json_delta"
            blocks[ev["index"]]["json"] += ev["delta"]["partial_json"]  # type: ignore[operator]
    assert names.count("content_block_start") == names.count("content_block_stop") == 2
    body = anthropic_api.MESSAGES.body(req, result(), CALLS, "m", 1)
    assert body["stop_reason"] == "tool_use" == evs[-2][1]["delta"]["stop_reason"]
    assert [{"type": "tool_use", "id": b["id"], "name": b["name"],
             "input": json.loads(b["json"])} for b in blocks.values()] == body["content"]  # type: ignore[arg-type]


def test_anthropic_answer_cut_by_max_tokens() -> None:
    cut = CALLS[:CALLS.index('"tz"') + 3]
    req = anth(tools=ANTH_TOOLS)
    body = anthropic_api.MESSAGES.body(req, result("length"), cut, "m", 1)
    assert body["stop_reason"] == "max_tokens"
    assert [b["input"] for b in body["content"]] == [{"city": 'Pa"ris }é', "unit": "c"}, {}]
