"""Structured output on the wire: the INVOKE block that constrains what a request generates.

A request that wants its answer to be JSON (any object, or one that validates against a
JSON schema) sets the INVOKE parameter flag CONSTRAINT and adds this block; without the flag
the body is byte for byte what it was (docs/PROTOCOL.md §4.2). The block carries the
constraint as text, not compiled: the daemon compiles it once per distinct text on its
engine thread (gpu/grammar.py), so the I/O thread only checks the block's bytes here (kind,
reserved byte, length, UTF-8), never parses the schema.

The text is bounded (MAX_CONSTRAINT_BYTES): a schema is a request's own input, and what a
daemon compiles and caches per request must not grow with what a client cares to send.
16 KiB holds any schema a person writes by hand (OpenAI's limits on a strict schema, 100
properties and 5 levels of nesting, come to a few KiB); a longer text is MALFORMED.

`from_response_format` reads OpenAI's `response_format` shape, which the SDK takes as is.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

from .errors import MalformedError

__all__ = ["CONSTRAINT_BLOCK", "MAX_CONSTRAINT_BYTES", "Constraint", "ConstraintKind",
           "ResponseFormat",
           "decode_block", "encode_block", "from_response_format"]

# INVOKE: kind u8, reserved u8 (zero), text_len u16, then text_len bytes of UTF-8 text.
CONSTRAINT_BLOCK = struct.Struct("<BBH")
MAX_CONSTRAINT_BYTES = 16384
# OpenAI's response_format, a JSON object as json.loads gives it
ResponseFormat = Mapping[str, object]


class ConstraintKind(IntEnum):
    JSON_SCHEMA = 1   # the text is a JSON schema (a JSON object)
    JSON_OBJECT = 2   # any JSON object; the text is empty


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the generated text must be: kind, and for JSON_SCHEMA the schema as JSON text."""
    kind: ConstraintKind
    text: str = ""

    def check(self) -> None:
        """The block's rules, for either side (the SDK before sending, the parser after)."""
        n = len(self.text.encode("utf-8"))
        if self.kind is ConstraintKind.JSON_OBJECT and n:
            raise MalformedError("constraint json_object carries no text")
        if self.kind is ConstraintKind.JSON_SCHEMA and not n:
            raise MalformedError("constraint json_schema needs a schema")
        if n > MAX_CONSTRAINT_BYTES:
            raise MalformedError(f"constraint text must be at most {MAX_CONSTRAINT_BYTES} "
                                 f"bytes, got {n}")


def encode_block(c: Constraint) -> bytes:
    c.check()
    b = c.text.encode("utf-8")
    return CONSTRAINT_BLOCK.pack(int(c.kind), 0, len(b)) + b


def decode_block(body: bytes, off: int) -> tuple[Constraint, int]:
    """The constraint at `off` and the offset after it; MalformedError if it is cut short,
    of an unknown kind, over the bound, not UTF-8, or has its reserved byte set."""
    if off + CONSTRAINT_BLOCK.size > len(body):
        raise MalformedError("body shorter than the constraint block")
    kind, reserved, n = CONSTRAINT_BLOCK.unpack_from(body, off)
    if reserved:
        raise MalformedError("constraint block: reserved byte must be zero")
    try:
        k = ConstraintKind(kind)
    except ValueError:
        raise MalformedError(f"unknown constraint kind {kind}") from None
    if n > MAX_CONSTRAINT_BYTES:
        raise MalformedError(f"constraint text must be at most {MAX_CONSTRAINT_BYTES} bytes, "
                             f"got {n}")
    off += CONSTRAINT_BLOCK.size
    if off + n > len(body):
        raise MalformedError("constraint text runs past the body")
    try:
        text = bytes(body[off:off + n]).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedError("constraint text is not valid UTF-8") from None
    c = Constraint(k, text)
    c.check()
    return c, off + n


def from_response_format(rf: ResponseFormat | None) -> Constraint | None:
    """OpenAI's `response_format`: {"type": "json_object"}, {"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}, "strict": ...}}, or {"type": "text"} (no
    constraint, as None). Anything else raises MalformedError naming what is wrong. The
    schema is always enforced: a constrained decoder has no non-strict mode."""
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise MalformedError("response_format must be an object")
    t = rf.get("type")
    if t == "text":
        return None
    if t == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT)
    if t != "json_schema":
        raise MalformedError(f"response_format.type must be 'json_schema', 'json_object' or "
                             f"'text', got {t!r}")
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise MalformedError("response_format.json_schema must be an object")
    schema = js.get("schema")
    if not isinstance(schema, dict):
        raise MalformedError("response_format.json_schema.schema must be a JSON schema object")
    # compact, in the schema's own key order (properties are generated in that order)
    c = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema, separators=(",", ":")))
    c.check()
    return c
