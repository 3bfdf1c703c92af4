"""OpenAI's tool calls at the edge: `tools`, `tool_choice`, `parallel_tool_calls`, the
messages of a conversation with tools (an assistant's `tool_calls`, `role: tool` results),
and the answer's `tool_calls`, whole or as stream deltas. The format the model sees and
writes is tools.py's; what its answer holds, tool_output.py's.
"""
from __future__ import annotations

from zerolayer.client import ChatMessage
from zerolayer.daemon.json_value import JSONValue

from .common import Fields
from .errors import bad_request
from .tool_output import ArgumentsDelta, CallStart, Delta, Reading, TextDelta
from .tools import (
    Tool,
    ToolSpec,
    arguments_value,
    calls_turn,
    check_tool,
    check_tools,
    named_tool,
    result_turn,
)

# OpenAI's roles -> the daemon's chat roles. "developer" is OpenAI's newer name for system.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def parse_tools(f: Fields) -> ToolSpec | None:
    """`tools`, `tool_choice` and `parallel_tool_calls`; None without tools (then
    tool_choice is refused, as OpenAI does, and parallel_tool_calls means nothing)."""
    raw, choice = f.raw("tools"), f.raw("tool_choice")
    parallel = f.boolean("parallel_tool_calls", True)
    if raw is None:
        if choice is not None:
            raise bad_request("'tool_choice' is only allowed when 'tools' are given",
                              "tool_choice")
        return None
    if not isinstance(raw, list):
        raise bad_request("'tools' must be a list", "tools")
    tools: list[Tool] = []
    for i, t in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(
                t.get("function"), dict):
            raise bad_request(f"{where}: only {{'type': 'function', 'function': {{...}}}} "
                              "tools are supported", "tools")
        fn = t["function"]
        extra = set(fn) - {"name", "description", "parameters", "strict"}
        if extra or set(t) - {"type", "function"}:
            raise bad_request(f"{where}: unsupported field(s) "
                              f"{sorted(extra | (set(t) - {'type', 'function'}))}", "tools")
        if fn.get("strict") not in (None, True, False):
            raise bad_request(f"{where}.function.strict must be a boolean", "tools")
        tools.append(check_tool(fn.get("name"), fn.get("description"), fn.get("parameters"),
                                where, "tools"))
    checked = check_tools(tools, "tools")
    if choice is None or choice in ("auto", "none", "required"):
        return ToolSpec(checked, choice or "auto", parallel)
    if (isinstance(choice, dict) and choice.get("type") == "function"
            and isinstance(choice.get("function"), dict)):
        name = named_tool(choice["function"].get("name"), checked, "tool_choice")
        return ToolSpec(checked, "required", parallel, named=name)
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                      "{'type': 'function', 'function': {'name': ...}}", "tool_choice")


def _text_content(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(
                    p.get("text"), str):
                raise bad_request(f"{where}: only text content parts are supported", where)
            parts.append(p["text"])
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of text parts", where)


def _assistant_calls(calls: object, where: str, names: dict[str, str]) -> list[tuple[str, object]]:
    """An assistant message's tool_calls -> (name, arguments) in order; each id's name is
    remembered for the `role: tool` results that answer it."""
    if not isinstance(calls, list) or not calls:
        raise bad_request(f"{where}.tool_calls must be a non-empty list", where)
    out = []
    for j, c in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if (not isinstance(c, dict) or not isinstance(c.get("id"), str)
                or not isinstance(fn, dict) or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("arguments"), str)):
            raise bad_request(f"{w}: needs an 'id' and a 'function' with a 'name' and "
                              "'arguments' (a JSON string)", where)
        names[c["id"]] = fn["name"]
        out.append((fn["name"], arguments_value(fn["arguments"])))
    return out


def chat_messages(raw: object) -> tuple[ChatMessage, ...]:
    """The conversation as the daemon's turns; tool calls and results in tools.py's format."""
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list", "messages")
    msgs = []
    names: dict[str, str] = {}        # tool_call id -> the called tool's name
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where)
        if m.get("function_call") is not None:
            raise bad_request(f"{where}: function_call (deprecated) is not supported; use "
                              "tool_calls", where)
        if m.get("role") == "tool":
            extra = set(m) - {"role", "content", "tool_call_id"}
            if extra:
                raise bad_request(f"{where}: unsupported field(s) {sorted(extra)}", where)
            tid = m.get("tool_call_id")
            name = names.get(tid) if isinstance(tid, str) else None
            if name is None:
                raise bad_request(f"{where}: 'tool_call_id' {m.get('tool_call_id')!r} "
                                  "answers no tool call of an earlier assistant message",
                                  where)
            msgs.append(ChatMessage("user", result_turn(
                name, _text_content(m.get("content"), where))))
            continue
        role = ROLES.get(m.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise bad_request(f"{where}: role {m.get('role')!r} is not supported "
                              f"(supported: {', '.join([*ROLES, 'tool'])})", where)
        extra = set(m) - {"role", "content", "name", "refusal", "tool_calls", "function_call"}
        if extra:
            raise bad_request(f"{where}: unsupported field(s) {sorted(extra)}", where)
        content = m.get("content")
        text = "" if content is None and role == "assistant" else _text_content(content, where)
        if role == "assistant" and m.get("tool_calls") is not None:
            text = calls_turn(_assistant_calls(m["tool_calls"], where, names), text)
        elif m.get("tool_calls") is not None:
            raise bad_request(f"{where}: only assistant messages carry tool_calls", where)
        msgs.append(ChatMessage(role, text))
    return tuple(msgs)


def call_id(request_id: bytes, index: int) -> str:
    return f"call_{request_id.hex()[:24]}{index:02d}"


def message(r: Reading, request_id: bytes) -> dict[str, JSONValue]:
    """The answer's `message`: text as content, or the calls (then content is null)."""
    calls = r.named_calls
    if not calls:
        return {"role": "assistant", "content": r.text or "", "refusal": None}
    return {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
        {"id": call_id(request_id, i), "type": "function",
         "function": {"name": str(c.name), "arguments": c.arguments}}
        for i, c in enumerate(calls)]}


def delta(d: Delta, request_id: bytes) -> dict[str, JSONValue]:
    """One stream delta: text as content, a call's start with its id and name, then its
    arguments in pieces (OpenAI's tool_calls deltas, by index)."""
    if isinstance(d, TextDelta):
        return {"content": d.text}
    if isinstance(d, CallStart):
        return {"tool_calls": [{"index": d.index, "id": call_id(request_id, d.index),
                                "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    assert isinstance(d, ArgumentsDelta)
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}

