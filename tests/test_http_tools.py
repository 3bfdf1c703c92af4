"""Tool calls through zerolayer-http end to end: a real zerolayerd (the bundled model, whose
chat template has no tool syntax, so the edge's generic format) and the edge on a loopback
port, driven with the official `openai` and `anthropic` packages; and the `zerolayer` CLI's
logprob and response-format flags against the same daemon.

Answers are sampled (temperature > 0) over several seeds, with small token limits: the
constrained decoder makes every call's arguments valid against its tool's schema whatever
is sampled, and that is what is checked, with jsonschema. One daemon and one edge for the
module; every request here is sequential.
"""
from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from edge_proc import MODEL, TOKEN, EdgeProc, daemon_and_edge
from zerolayer.daemon.programs import cli

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 16},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 12}},
         "required": ["tz"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
OAI_TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": s}}
             for n, d, s in [("get_weather", "The weather in a city now", WEATHER),
                             ("get_time", "The time in a timezone now", CLOCK)]]
ANTH_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
               "input_schema": t["function"]["parameters"]} for t in OAI_TOOLS]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SEEDS = range(6)
MAX_TOKENS = 40        # a call of these tools is ~25 tokens in the format


@pytest.fixture(scope="module")
def stack(tmp_path_factory):  # type: ignore[no-untyped-def]
    with daemon_and_edge(tmp_path_factory.mktemp("zl-tools")) as pair:
        yield pair


def oai(edge: EdgeProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=edge.base + "/v1", api_key=TOKEN, max_retries=0, timeout=120)


def anth(edge: EdgeProc) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=edge.base, api_key=TOKEN, max_retries=0, timeout=120)


def chat(edge: EdgeProc, **kw: Any) -> Any:
    kw = {"model": MODEL, "messages": ASK, "max_tokens": MAX_TOKENS, "temperature": 0.9, **kw}
    return oai(edge).chat.completions.create(**kw)


def valid_call(name: str, arguments: Any) -> Any:
    """The call's arguments, after checking them against its tool's schema."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])
    return args


def test_openai_required_calls_validate_over_seeds(stack) -> None:  # type: ignore[no-untyped-def]
    _, edge = stack
    for seed in SEEDS:
        r = chat(edge, tools=OAI_TOOLS, tool_choice="required", seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason in ("tool_calls", "length"), ch
        calls = ch.message.tool_calls
        assert calls and ch.message.content is None
        for c in calls[:-1] if ch.finish_reason == "length" else calls:
            assert c.type == "function" and c.id.startswith("call_")
            valid_call(c.function.name, c.function.arguments)


def test_openai_named_tool_and_no_parallel_calls(stack) -> None:  # type: ignore[no-untyped-def]
    _, edge = stack
    for seed in SEEDS[:3]:
        r = chat(edge, tools=OAI_TOOLS, seed=seed, parallel_tool_calls=False,
                 tool_choice={"type": "function", "function": {"name": "get_time"}})
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        (c,) = ch.message.tool_calls
        assert c.function.name == "get_time"
        valid_call("get_time", c.function.arguments)


def test_openai_auto_is_a_reply_or_valid_calls_and_none_is_text(stack) -> None:  # type: ignore[no-untyped-def]
    _, edge = stack
    kinds = set()
    for seed in SEEDS[:2]:
        ch = chat(edge, tools=OAI_TOOLS, tool_choice="auto", seed=seed).choices[0]
        if ch.message.tool_calls:
            kinds.add("calls")
            if ch.finish_reason == "tool_calls":
                for c in ch.message.tool_calls:
                    valid_call(c.function.name, c.function.arguments)
        else:
            kinds.add("reply")
            assert isinstance(ch.message.content, str)
    assert kinds
    ch = chat(edge, tools=OAI_TOOLS, tool_choice="none", seed=0, max_tokens=8).choices[0]
    assert ch.message.tool_calls is None and ch.message.content
    assert ch.finish_reason in ("stop", "length")


def test_openai_streamed_deltas_reassemble_into_the_same_calls(stack) -> None:  # type: ignore[no-untyped-def]
    _, edge = stack
    for seed in SEEDS[:1]:
        kw = {"tools": OAI_TOOLS, "tool_choice": "required", "seed": seed}
        whole = chat(edge, **kw).choices[0]
        calls: dict[int, dict[str, str]] = {}
        finish = None
        pieces = 0
        for ev in chat(edge, stream=True, **kw):
            ch = ev.choices[0]
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
                pieces += 1
        assert finish == whole.finish_reason
        assert [calls[i] for i in sorted(calls)] == [
            {"name": c.function.name, "arguments": c.function.arguments}
            for c in whole.message.tool_calls]
        assert pieces > len(calls)      # the arguments came in pieces, not at the end


def test_openai_multi_turn_with_a_tool_result(stack) -> None:  # type: ignore[no-untyped-def]
    _, edge = stack
    first = chat(edge, tools=OAI_TOOLS, tool_choice="required", seed=1,
                 parallel_tool_calls=False).choices[0].message
    (call,) = first.tool_calls
    history = [*ASK, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id,
                "content": json.dumps({"temperature": 21, "sky": "sunny"})}]
    r = chat(edge, tools=OAI_TOOLS, messages=history, tool_choice="none", seed=1,
             max_tokens=16, temperature=0.0)
    ch = r.choices[0]
    assert ch.message.tool_calls is None and ch.message.content
    # the result reached the prompt: the turn costs more than the question and the call
    assert r.usage.prompt_tokens > 40
    again = chat(edge, tools=OAI_TOOLS, messages=history, tool_choice="auto", seed=2)
    assert again.choices[0].finish_reason in ("stop", "tool_calls", "length")


def test_a_pydantic_style_schema_with_defs_and_references(stack) -> None:  # type: ignore[no-untyped-def]
    _, edge = stack
    event = {"type": "object", "required": ["title", "when"], "additionalProperties": False,
             "properties": {"title": {"type": "string", "maxLength": 16},
                            "when": {"$ref": "#/$defs/Day"}},
             "$defs": {"Day": {"type": "object", "required": ["month", "day"],
                               "additionalProperties": False, "properties": {
                                   "month": {"type": "integer", "minimum": 1, "maximum": 12},
                                   "day": {"type": "integer", "minimum": 1, "maximum": 31}}}}}
    for seed in SEEDS[:2]:
        ch = chat(edge, seed=seed, max_tokens=48, tool_choice="required",
                  parallel_tool_calls=False, tools=[
            {"type": "function", "function": {"name": "add_event", "parameters": event}}],
            messages=[{"role": "user", "content": "Put lunch with Sam on May 3 in my calendar"}]
        ).choices[0]
        assert ch.finish_reason == "tool_calls", ch
        for c in ch.message.tool_calls:
            jsonschema.validate(json.loads(c.function.arguments), event)


def test_openai_hostile_tools_are_400s(stack) -> None:  # type: ignore[no-untyped-def]
    _, edge = stack
    c = oai(edge)
    broken = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(("}},
        "required": ["a"]}}}]
    huge = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "description": "x" * 400}}} for i in range(60)]
    deep = '{"model": "%s", "messages": [], "tools": %s}' % (MODEL, "[" * 5000 + "]" * 5000)
    r = httpx.post(edge.base + "/v1/chat/completions", content=deep, timeout=30,
                   headers={"Authorization": f"Bearer {TOKEN}",
                            "Content-Type": "application/json"})
    assert r.status_code == 400 and "nests too deeply" in r.json()["error"]["message"]
    for kw, param in [({"tools": broken}, "tools"),       # the daemon's compiler refuses it
                      ({"tools": huge}, "tools"),         # over the constraint's 16 KiB
                      ({"tool_choice": "required"}, "tool_choice"),
                      ({"tools": OAI_TOOLS, "tool_choice": {
                          "type": "function", "function": {"name": "get_date"}}}, "tool_choice")]:
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, **kw)
        assert ei.value.status_code == 400 and ei.value.body["param"] == param, ei.value.body


def test_anthropic_tool_use_validates_over_seeds(stack) -> None:  # type: ignore[no-untyped-def]
    _, edge = stack
    c = anth(edge)
    for _ in SEEDS[:3]:     # Anthropic's API has no seed: the daemon draws one each time
        r = c.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=ASK, tools=ANTH_TOOLS,
                              tool_choice={"type": "any"}, extra_body={"temperature": 0.9})
        assert r.stop_reason in ("tool_use", "max_tokens"), r
        uses = [b for b in r.content if b.type == "tool_use"]
        assert uses and len(uses) == len(r.content)
        for b in uses[:-1] if r.stop_reason == "max_tokens" else uses:
            assert b.id.startswith("toolu_")
            valid_call(b.name, b.input)


def test_anthropic_stream_matches_and_a_tool_result_turn(stack) -> None:  # type: ignore[no-untyped-def]
    _, edge = stack
    c = anth(edge)
    kw: Any = {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": ASK, "tools": ANTH_TOOLS,
               "tool_choice": {"type": "tool", "name": "get_weather",
                               "disable_parallel_tool_use": True},
               "extra_body": {"temperature": 0.0}}
    whole = c.messages.create(**kw)
    with c.messages.stream(**kw) as s:
        kinds = [ev.type for ev in s]
        streamed = s.get_final_message()
    assert "input_json" in kinds                      # the SDK's event for input_json_delta
    assert whole.stop_reason == streamed.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed.content] == [
        (b.name, b.input) for b in whole.content]
    (use,) = whole.content
    valid_call("get_weather", use.input)
    r = c.messages.create(model=MODEL, max_tokens=12, extra_body={"temperature": 0.0},
                          tools=ANTH_TOOLS,
                          tool_choice={"type": "none"}, messages=[
                              *ASK, {"role": "assistant", "content": whole.content},
                              {"role": "user", "content": [{
                                  "type": "tool_result", "tool_use_id": use.id,
                                  "content": "21 degrees, sunny"}]}])
    assert r.content[0].type == "text" and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens")


def test_cli_logprobs_and_response_format_against_the_daemon(stack, capsys) -> None:  # type: ignore[no-untyped-def]
    d, _ = stack
    schema = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                         "required": ["ok"], "additionalProperties": False})
    argv = ["invoke", "Is Paris in France?", "--max-tokens", "12", "--top-logprobs", "2",
            "--response-format", schema, "--addr", f"{d.addr[0]}:{d.addr[1]}",
            "--key-id", str(d.key_id), "--secret", d.secret.hex()]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) in ({"ok": True}, {"ok": False})
    lines = [ln for ln in err.splitlines() if ln.startswith("zerolayer: logprob ")]
    assert lines and all(" top: " in ln and ln.count(", ") >= 1 for ln in lines), err
    # the tokens printed spell the answer
    assert "".join(json.loads(ln.split(" ", 3)[3].split(" top: ")[0]) for ln in lines
                   ) == out.rstrip("\n")
