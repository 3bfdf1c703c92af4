"""Tool calls for a chat template without tool syntax: the generic format, both APIs' tools.

The daemon renders a chat through the model's own template with system, user and assistant
turns only, and SmolLM2's template (the bundled model's) has no tool syntax anyway. So the
tools travel the way llama.cpp's server carries them for such templates:

- the tools' names, descriptions and argument schemas go into the system turn, with what
  to answer;
- the answer is constrained (a JSON schema, the daemon's constrained decoding) to one JSON
  object, either {"tool_calls": [{"name": N, "arguments": {...}}, ...]}, each call's
  arguments valid against that tool's `parameters` schema, or {"response": "text"};
- `required` (OpenAI) / `any` (Anthropic) allow only the calls, a named tool only calls of
  that tool, `none` neither the schema nor the tools: free text;
- earlier turns are written in the same format: an assistant's calls as the JSON it would
  have produced, a tool's result as a user turn {"tool_response": {"name": N, "content": C}}.

What the output means is read back by tool_output.py. Everything here is checked before a
request leaves the edge: a malformed tool list, an unknown named tool or a tool_choice
without tools is a 400 naming the field; a schema the daemon's compiler refuses comes back
as MALFORMED and is a 400 naming `tools` as well (generation.py).
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from zerolayer.client import ChatMessage

from .errors import bad_request

# Both APIs' rule for a tool's name; it also keeps a name plain text in the prompt.
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128                  # OpenAI's limit on one request's tools
# JSON levels a tool's parameters may nest: under the daemon's 100 for a whole schema
# (gpu/schema_text.py) with the format's own levels around them
MAX_PARAMETERS_DEPTH = 90
EMPTY_PARAMETERS: dict[str, object] = {"type": "object", "properties": {}}

Mode = Literal["none", "auto", "required"]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, object]


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools and what it lets the model do with them. `named`: only that tool
    (mode is then "required")."""
    tools: tuple[Tool, ...]
    mode: Mode
    parallel: bool
    named: str | None = None

    @property
    def active(self) -> bool:
        """Whether the answer is constrained to the tool format (not for `none`)."""
        return self.mode != "none"

    def offered(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if self.named is None or t.name == self.named)

    def schema(self) -> dict[str, object]:
        """The JSON schema the whole answer must satisfy. Each tool's parameters sit in the
        root's $defs, their local references rebased there, so that a schema's own "$defs"
        and "#/..." references (pydantic writes nested models so) still resolve."""
        defs = {f"tool_{t.name}": rebase(t.parameters, f"#/$defs/tool_{t.name}")
                for t in self.offered()}
        calls = [{"type": "object",
                  "properties": {"name": {"const": t.name},
                                 "arguments": {"$ref": f"#/$defs/tool_{t.name}"}},
                  "required": ["name", "arguments"], "additionalProperties": False}
                 for t in self.offered()]
        items: dict[str, object] = {"type": "array",
                                 "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
                                 "minItems": 1}
        if not self.parallel:
            items["maxItems"] = 1
        call_answer = {"type": "object", "properties": {"tool_calls": items},
                       "required": ["tool_calls"], "additionalProperties": False}
        if self.mode == "required":
            return {**call_answer, "$defs": defs}
        text_answer = {"type": "object", "properties": {"response": {"type": "string"}},
                       "required": ["response"], "additionalProperties": False}
        return {"anyOf": [call_answer, text_answer], "$defs": defs}

    def response_format(self) -> dict[str, object]:
        return {"type": "json_schema",
                "json_schema": {"name": "tool_calls", "schema": self.schema(), "strict": True}}

    def system_text(self) -> str:
        listed = json.dumps([{"name": t.name, "description": t.description,
                              "parameters": t.parameters} for t in self.offered()],
                            ensure_ascii=False)
        call = '{"tool_calls": [{"name": <tool name>, "arguments": <its arguments>}]}'
        if self.named is not None:
            what = f"Answer by calling the tool {self.named} with JSON: {call}"
        elif self.mode == "required":
            what = f"Answer by calling one of the tools with JSON: {call}"
        else:
            what = (f"Answer with JSON: {call} to call tools, or "
                    '{"response": <your reply>} to reply to the user.')
        return f"You can use these tools (JSON schemas of their arguments):\n{listed}\n{what}"


def rebase(node: object, base: str) -> object:
    """A copy of a schema placed at `base` (a "#/..." pointer): each local "$ref" ("#" and
    "#/..." forms) prefixed with it. Depth is bounded by check_tool."""
    if isinstance(node, list):
        return [rebase(v, base) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: rebase(v, base) for k, v in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and (len(ref) == 1 or ref[1] == "/"):
        out["$ref"] = base + ref[1:]
    return out


def depth(node: object) -> int:
    """JSON levels (objects and lists) of a value, without recursion."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def check_tool(name: object, description: object, parameters: object, where: str,
               param: str) -> Tool:
    """One tool as either API gives it; a 400 naming `param` if it cannot be used."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise bad_request(f"{where}: the name must match [A-Za-z0-9_-]{{1,64}}", param)
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise bad_request(f"{where}: the description must be a string", param)
    if parameters is None:
        parameters = EMPTY_PARAMETERS
    if not isinstance(parameters, dict):
        raise bad_request(f"{where}: the parameters must be a JSON schema object", param)
    if parameters.get("type", "object") != "object":
        raise bad_request(f"{where}: the parameters schema must be of type 'object'", param)
    if depth(parameters) > MAX_PARAMETERS_DEPTH:
        raise bad_request(f"{where}: the parameters schema nests deeper than "
                          f"{MAX_PARAMETERS_DEPTH} JSON levels", param)
    return Tool(name, description, parameters)


def check_tools(tools: list[Tool], param: str) -> tuple[Tool, ...]:
    if not 1 <= len(tools) <= MAX_TOOLS:
        raise bad_request(f"'{param}' must list 1..{MAX_TOOLS} tools", param)
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise bad_request(f"'{param}': tool names must be unique, {dup} repeat", param)
    return tuple(tools)


def named_tool(name: object, tools: tuple[Tool, ...], param: str) -> str:
    if not isinstance(name, str) or name not in {t.name for t in tools}:
        raise bad_request(f"'{param}' names the tool {name!r}, which is not in the tools "
                          f"({', '.join(t.name for t in tools)})", param)
    return name


def arguments_value(arguments: str) -> object:
    """A call's arguments as JSON for the prompt; text that is not JSON stays text."""
    try:
        value: object = json.loads(arguments)
        return value
    except ValueError:
        return arguments


def calls_turn(calls: list[tuple[str, object]], text: str = "") -> str:
    """An assistant turn that called tools, written as the model answers in this format."""
    body = json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in calls]},
                      ensure_ascii=False)
    return f"{text}\n{body}" if text else body


def result_turn(name: str, content: str, is_error: bool = False) -> str:
    """A tool's result, as the user turn that hands it to the model."""
    r: dict[str, object] = {"name": name, "content": content}
    if is_error:
        r["is_error"] = True
    return json.dumps({"tool_response": r}, ensure_ascii=False)


def with_tools(msgs: Sequence[ChatMessage], spec: ToolSpec) -> tuple[ChatMessage, ...]:
    """The tools described in the system turn (the conversation's own, or a new one)."""
    text = spec.system_text()
    if msgs and msgs[0].role == "system":
        return (ChatMessage("system", f"{msgs[0].content}\n\n{text}"), *msgs[1:])
    return (ChatMessage("system", text), *msgs)
