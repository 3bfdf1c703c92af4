"""The answer of a request with tools (tools.py's format), read back, whole or in part.

`read` takes the text generated so far and says what it holds: the reply text decoded so
far, or the calls so far, each with its name once the name is complete and the raw JSON
text of its arguments so far. Reading a longer prefix only ever extends what a shorter one
gave (text and arguments grow, calls are added), so a stream sends the differences
(`ToolDeltas`) and they add up to what `read` gives for the whole answer: streamed and
whole answers carry the same calls, arguments byte for byte.

The constrained decoder keeps the answer a prefix of the format's JSON; an answer that is
not (a model without the constraint) is read as plain text.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_WS = " \t\n\r"
_SCALAR = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null")


class _End(Exception):
    """The text ends inside what is being read."""


class _Bad(Exception):
    """The text is not the format."""


@dataclass
class Call:
    name: str | None = None      # None until the whole name has been generated
    arguments: str = ""          # the raw JSON text of the arguments so far
    complete: bool = False       # the arguments' value is whole


@dataclass
class Reading:
    text: str | None = None      # the reply so far (None: not a text reply, or not yet known)
    calls: list[Call] = field(default_factory=list)
    whole: bool = False          # the answer's object is closed

    @property
    def named_calls(self) -> list[Call]:
        """The calls whose name is whole: what a stream has started (an answer cut by
        max_tokens inside a call's name has that call in neither)."""
        return [c for c in self.calls if c.name is not None]


class _Cursor:
    def __init__(self, s: str) -> None:
        self.s, self.i = s, 0

    def peek(self) -> str:
        while self.i < len(self.s) and self.s[self.i] in _WS:
            self.i += 1
        if self.i >= len(self.s):
            raise _End
        return self.s[self.i]

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise _Bad
        self.i += 1

    def string(self, partial: list[str] | None = None) -> str:
        """A JSON string at the cursor, decoded. At the text's end, _End; what was decoded
        before it (whole escapes only) is left in `partial` if given."""
        self.expect('"')
        start = j = self.i
        s = self.s
        while j < len(s):
            c = s[j]
            if c == '"':
                self.i = j + 1
                return _decode(s[start:j])
            if c == "\\":
                if j + 1 >= len(s) or (s[j + 1] == "u" and j + 6 > len(s)):
                    break           # an escape cut short: decode up to it
                j += 6 if s[j + 1] == "u" else 2
                continue
            j += 1
        if partial is not None:
            text = _decode(s[start:min(j, len(s))])
            # half of a surrogate pair stays back until its other half comes
            partial.append(text[:-1] if text and "\ud800" <= text[-1] <= "\udbff" else text)
        raise _End

    def value_end(self) -> int:
        """Skip one JSON value; the index after it. _End if the text ends inside it."""
        c = self.peek()
        s = self.s
        if c == '"':
            self.string()
            return self.i
        if c in "{[":
            depth, j = 0, self.i
            while j < len(s):
                ch = s[j]
                if ch == '"':
                    self.i = j
                    self.string()
                    j = self.i
                    continue
                if ch in "{[":
                    depth += 1
                elif ch in "}]":
                    depth -= 1
                    if depth == 0:
                        self.i = j + 1
                        return self.i
                j += 1
            raise _End
        m = _SCALAR.match(s, self.i)
        if m is None:
            raise _Bad
        if m.end() >= len(s):
            raise _End              # a number may go on
        self.i = m.end()
        return self.i


def _decode(raw: str) -> str:
    try:
        text: str = json.loads('"' + raw + '"')
    except ValueError:
        raise _Bad from None
    return text


def read(out: str) -> Reading:
    r = Reading()
    c = _Cursor(out)
    try:
        c.expect("{")
        key = c.string()
        c.expect(":")
        if key == "response":
            partial: list[str] = []
            try:
                r.text = c.string(partial)
            except _End:
                r.text = partial[0] if partial else ""
                raise
            c.expect("}")
            r.whole = True
        elif key == "tool_calls":
            _read_calls(c, r)
            c.expect("}")
            r.whole = True
        else:
            raise _Bad
    except _End:
        pass
    except _Bad:
        return Reading(text=out, whole=True)
    return r


def _read_calls(c: _Cursor, r: Reading) -> None:
    c.expect("[")
    while True:
        if r.calls:
            if c.peek() == "]":
                c.i += 1
                return
            c.expect(",")
        c.expect("{")
        call = Call()
        r.calls.append(call)
        keys = 0
        while True:
            if keys:
                if c.peek() == "}":
                    c.i += 1
                    break
                c.expect(",")
            key = c.string()
            c.expect(":")
            keys += 1
            if key == "name":
                call.name = c.string()
            elif key == "arguments":
                start = c.i + len(c.s[c.i:]) - len(c.s[c.i:].lstrip(_WS))
                try:
                    end = c.value_end()
                except _End:
                    call.arguments = c.s[start:]
                    raise
                call.arguments, call.complete = c.s[start:end], True
            else:
                raise _Bad
        if call.name is None or not call.complete:
            raise _Bad


@dataclass
class TextDelta:
    text: str


@dataclass
class CallStart:
    index: int
    name: str


@dataclass
class ArgumentsDelta:
    index: int
    text: str


Delta = TextDelta | CallStart | ArgumentsDelta


class ToolDeltas:
    """A stream's answer, chunk by chunk, as the differences of what `read` says: a call
    starts once its name is whole, then its arguments come as they are generated."""

    def __init__(self) -> None:
        self.out = ""
        self._text = 0
        self._args: list[int] = []      # per call started: arguments' characters sent

    def push(self, chunk: str) -> list[Delta]:
        self.out += chunk
        r = read(self.out)
        deltas: list[Delta] = []
        if r.text is not None and len(r.text) > self._text:
            deltas.append(TextDelta(r.text[self._text:]))
            self._text = len(r.text)
        for i, call in enumerate(r.calls):
            if i == len(self._args):
                if call.name is None:
                    break
                deltas.append(CallStart(i, call.name))
                self._args.append(0)
            if len(call.arguments) > self._args[i]:
                deltas.append(ArgumentsDelta(i, call.arguments[self._args[i]:]))
                self._args[i] = len(call.arguments)
        return deltas

    @property
    def calls_started(self) -> int:
        return len(self._args)
