"""Text a schema fixes (const and enum strings, property names) must be writable by the
model's vocabulary.

A byte-level vocabulary need not hold every byte: the bundled SmolLM2's has no token with
0xF1 or 0xF2 in it, the lead bytes of U+40000..U+BFFFF (planes Unicode leaves unassigned).
A const the model cannot spell should leave the grammar no token to allow; llguidance 1.9
instead allows one and then refuses it (measured), which would end a run mid-answer. So the
strings the grammar forces are checked against the vocabulary's bytes before it compiles.
"""
from __future__ import annotations

from collections.abc import Iterator

from .schema_errors import SchemaError
from .schema_walk import subschemas


def _fixed_strings(schema: object) -> Iterator[str]:
    """Every string the grammar writes as given: property names, and the strings (values
    and keys) inside enum and const."""
    for s in subschemas(schema):
        props = s.get("properties")
        if isinstance(props, dict):
            yield from props
        req = s.get("required")
        if isinstance(req, list):
            yield from (r for r in req if isinstance(r, str))
        for k in ("enum", "const"):
            stack = [s[k]] if k in s else []
            while stack:
                x = stack.pop()
                if isinstance(x, str):
                    yield x
                elif isinstance(x, list):
                    stack.extend(x)
                elif isinstance(x, dict):
                    yield from x
                    stack.extend(x.values())


def check_spelling(schema: object, missing: frozenset[int]) -> None:
    """SchemaError naming the first fixed character whose UTF-8 holds a byte in `missing`
    (the bytes no token of the vocabulary contains)."""
    if not missing:
        return
    for text in _fixed_strings(schema):
        for ch in text:
            if ord(ch) >= 0x80 and not missing.isdisjoint(ch.encode("utf-8", "surrogatepass")):
                raise SchemaError(f"the model's vocabulary cannot write the character "
                                  f"U+{ord(ch):04X} that the schema fixes")
