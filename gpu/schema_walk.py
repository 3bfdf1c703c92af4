"""Where the schemas inside a JSON schema are: the keywords whose values are schemas (as
opposed to data: enum, const, default, examples), and local "$ref"s resolved.

Only what the checks before compiling need (schema_numbers.py, schema_finite.py); the
grammar compiler reads the schema itself.
"""
from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import unquote

# keyword -> how its value holds schemas
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_ONE = ("additionalProperties", "additionalItems", "unevaluatedProperties",
        "unevaluatedItems", "contains", "not", "if", "then", "else", "propertyNames")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")


def children(s: dict) -> Iterator[object]:
    """The schemas directly inside `s` (booleans included)."""
    for k in _MAPS:
        v = s.get(k)
        if isinstance(v, dict):
            yield from v.values()
    for k in _ONE:
        if k in s:
            yield s[k]
    for k in _LISTS:
        v = s.get(k)
        if isinstance(v, list):
            yield from v
    items = s.get("items")  # a schema, or (drafts 4-7) a list of them
    if isinstance(items, list):
        yield from items
    elif items is not None:
        yield items


def subschemas(root: object) -> Iterator[dict]:
    """Every object schema in `root`, itself included, without following "$ref" (each is
    reached where it is written). No recursion: the nesting is bounded, but not by the
    interpreter's stack."""
    stack = [root]
    while stack:
        s = stack.pop()
        if isinstance(s, dict):
            yield s
            stack.extend(children(s))


def resolve(root: object, ref: str) -> object | None:
    """The schema a local reference ("#", "#/$defs/a", JSON pointer escapes included) names
    in `root`; None for a remote reference, an anchor or a pointer to nothing."""
    if not ref.startswith("#"):
        return None
    pointer = unquote(ref[1:])
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        return None
    node = root
    for part in pointer[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
