"""A response_format schema's text read into Python values, its nesting bounded first.

json.loads recurses once per nested array or object, so two thousand brackets (2 KB of
valid JSON) end in RecursionError, an interpreter limit rather than a verdict on the
request; and the grammar compiler (llguidance, through Rust's serde_json) stops at 128
levels. So the depth is measured on the text itself, without recursion, before anything
parses it, and a text nested deeper than MAX_SCHEMA_DEPTH is refused with that reason.

MAX_SCHEMA_DEPTH counts JSON levels (arrays and objects), not schema levels: one schema
level costs two or three JSON levels ("properties" → name → schema, "anyOf" → list →
schema). The deepest schema the hosted APIs accept is 10 levels of nesting (OpenAI's
strict mode; 5 before 2025), about 30 JSON levels; 100 leaves room for three times that and
stays under the compiler's 128 with its own wrapping (a few levels) on top.

Numbers are read exactly (integers as int, the others as Decimal), so that the checks that
follow (schema_numbers.py) see the value the client wrote, not its nearest float. NaN and
Infinity, which json.loads would otherwise accept, are not JSON and are refused.
"""
from __future__ import annotations

import json
import re
from decimal import Decimal

from .schema_errors import SchemaError

MAX_SCHEMA_DEPTH = 100

# A JSON string as a whole (so brackets inside it are not counted), or one bracket. In
# valid JSON nothing outside a string is a backslash or a quote, so scanning left to
# right meets every string at its opening quote.
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in the text (for invalid JSON, at least
    as deep as any parser gets before it gives up)."""
    depth = deepest = 0
    for m in _STRING_OR_BRACKET.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def load_schema(text: str) -> object:
    """The schema's JSON value; SchemaError if the text is nested too deep or is not JSON."""
    depth = nesting_depth(text)
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"the JSON schema nests {depth} levels deep; at most "
                          f"{MAX_SCHEMA_DEPTH} are allowed")
    try:
        return json.loads(text, parse_float=Decimal, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise SchemaError(f"the JSON schema is not valid JSON: {e}") from None
