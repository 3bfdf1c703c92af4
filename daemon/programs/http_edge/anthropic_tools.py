"""Anthropic's tool use at the edge: `tools`, `tool_choice`, the `tool_use` and
`tool_result` content blocks of a conversation, and the answer's `tool_use` blocks, whole or
as a stream's content_block_start / input_json_delta events. The format the model sees and
writes is tools.py's; what its answer holds, tool_output.py's.
"""
from __future__ import annotations

import json

from zerolayer.client import ChatMessage
from zerolayer.daemon.json_value import JSONValue

from .errors import bad_request
from .tool_output import Reading
from .tools import Tool, ToolSpec, calls_turn, check_tool, check_tools, named_tool, result_turn

TOOL_FIELDS = {"name", "description", "input_schema", "type", "cache_control"}


def parse_tools(raw: object, choice: object) -> ToolSpec | None:
    if raw is None:
        if choice is not None:
            raise bad_request("tool_choice: only allowed when tools are given")
        return None
    if not isinstance(raw, list):
        raise bad_request("tools: must be a list")
    tools: list[Tool] = []
    for i, t in enumerate(raw):
        where = f"tools.{i}"
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            raise bad_request(f"{where}: only custom tools (name, description, input_schema) "
                              "are supported")
        if set(t) - TOOL_FIELDS:
            raise bad_request(f"{where}: unsupported field(s) {sorted(set(t) - TOOL_FIELDS)}")
        if not isinstance(t.get("input_schema"), dict):
            raise bad_request(f"{where}.input_schema: must be a JSON schema object")
        tools.append(check_tool(t.get("name"), t.get("description"), t["input_schema"],
                                where, "tools"))
    checked = check_tools(tools, "tools")
    if choice is None:
        return ToolSpec(checked, "auto", True)
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise bad_request("tool_choice: type must be 'auto', 'any', 'tool' or 'none'")
    if set(choice) - {"type", "name", "disable_parallel_tool_use"}:
        raise bad_request("tool_choice: unsupported field(s) "
                          f"{sorted(set(choice) - {'type', 'name', 'disable_parallel_tool_use'})}")
    single = choice.get("disable_parallel_tool_use", False)
    if not isinstance(single, bool):
        raise bad_request("tool_choice.disable_parallel_tool_use: must be a boolean")
    kind = choice["type"]
    if kind == "tool":
        return ToolSpec(checked, "required", not single,
                        named=named_tool(choice.get("name"), checked, "tool_choice.name"))
    if "name" in choice:
        raise bad_request(f"tool_choice: a name goes with type 'tool', not {kind!r}")
    return ToolSpec(checked, {"auto": "auto", "any": "required", "none": "none"}[kind],  # type: ignore[arg-type]
                    not single)


def _result_text(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return "".join(b["text"] for b in content)
    raise bad_request(f"{where}.content: must be a string or a list of text blocks")


def turn(role: str, content: object, where: str, names: dict[str, str]) -> list[ChatMessage]:
    """One message's content blocks as the daemon's turns: text as it is, an assistant's
    tool_use blocks as its calls, a user's tool_result blocks as results (tools.py)."""
    if isinstance(content, str):
        return [ChatMessage(role, content)]
    if not isinstance(content, list):
        raise bad_request(f"{where}: content must be a string or a list of content blocks")
    out: list[ChatMessage] = []
    text: list[str] = []
    calls: list[tuple[str, object]] = []
    for i, b in enumerate(content):
        w = f"{where}.content.{i}"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
        elif kind == "tool_use" and role == "assistant":
            if (not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str)
                    or not isinstance(b.get("input"), dict)):
                raise bad_request(f"{w}: tool_use needs an id, a name and an input object")
            names[b["id"]] = b["name"]
            calls.append((b["name"], b["input"]))
        elif kind == "tool_result" and role == "user":
            name = names.get(b.get("tool_use_id"))
            if name is None:
                raise bad_request(f"{w}: tool_use_id {b.get('tool_use_id')!r} answers no "
                                  "tool_use block of an earlier assistant message")
            is_error = b.get("is_error", False)
            if not isinstance(is_error, bool):
                raise bad_request(f"{w}.is_error: must be a boolean")
            out.append(ChatMessage("user", result_turn(name, _result_text(b.get("content"), w),
                                                       is_error)))
        else:
            raise bad_request(f"{w}: only text, tool_use (assistant) and tool_result (user) "
                              "content blocks are supported")
    if calls:
        out.append(ChatMessage(role, calls_turn(calls, "".join(text))))
    elif text or not out:
        out.append(ChatMessage(role, "".join(text)))
    return out


def use_id(request_id: bytes, index: int) -> str:
    return f"toolu_{request_id.hex()[:24]}{index:02d}"


def tool_input(arguments: str) -> dict[str, JSONValue]:
    """A call's input object. An answer cut by max_tokens can leave its arguments
    unfinished; the block then carries what parses, an empty input."""
    try:
        v = json.loads(arguments)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def content(r: Reading, request_id: bytes) -> list[dict[str, JSONValue]]:
    """The answer's content blocks: the reply's text, or one tool_use block per call."""
    calls = r.named_calls
    if not calls:
        return [{"type": "text", "text": r.text or ""}]
    return [{"type": "tool_use", "id": use_id(request_id, i), "name": str(c.name),
             "input": tool_input(c.arguments)} for i, c in enumerate(calls)]
