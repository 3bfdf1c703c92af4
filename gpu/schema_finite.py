"""Whether any finite JSON value can satisfy a schema, decided before a model runs.

The grammar compiler checks what one schema says on its own (a minimum over its maximum, a
string that must be an integer) but not where "$ref" leads: {"type": "object", "properties":
{"c": {"$ref": "#"}}, "required": ["c"]} compiles, lets the model write '{"c": {"c": ...',
and only a limit of the grammar engine ends it, mid-answer. Every value of that schema
would be infinitely deep, so none exists.

This is the grammar textbook's "productive symbols", on schemas: a schema has a finite
instance if one of its alternatives (anyOf, oneOf, its types) does, and for that all its
parts (allOf, "$ref", the required properties of an object, the first minItems items of an
array, contains) must. Computed as a least fixpoint over the reference targets: none is
assumed to have an instance until shown, so a cycle with no way out stays without one.

It answers for recursion only. Anything it cannot judge (not, if/then/else, a pattern, a
remote reference, enum against the rest) counts as satisfiable here: the compiler and the
engine's first mask judge those, so this check never refuses a schema that has a value.
"""
from __future__ import annotations

import re
from decimal import Decimal

from .schema_errors import SchemaError
from .schema_walk import resolve, subschemas

# Node visits allowed for one schema (a round visits each node at most once; rounds are at
# most one more than the reference targets). A 16 KiB schema needs a few thousand; one
# that needs more is refused rather than allowed to hold the engine thread.
MAX_VISITS = 200_000


class _Rounds:
    def __init__(self, root: object):
        self.root = root
        self.targets: dict[int, object] = {}
        for s in subschemas(root):
            ref = s.get("$ref")
            if isinstance(ref, str):
                t = resolve(root, ref)
                if t is not None:
                    self.targets[id(t)] = t
        self.proven: set[int] = set()   # targets shown to have a finite instance
        self.visits = 0
        self._memo: dict[int, bool] = {}

    def run(self) -> bool:
        while True:
            self._memo = {}
            new = {k for k, t in self.targets.items()
                   if k not in self.proven and self._finite(t)}
            if not new:
                self._memo = {}
                return self._finite(self.root)
            self.proven |= new

    def _finite(self, s: object) -> bool:
        if isinstance(s, bool):
            return s
        if not isinstance(s, dict):
            return True  # not a schema: the compiler refuses it
        k = id(s)
        got = self._memo.get(k)
        if got is None:
            self.visits += 1
            if self.visits > MAX_VISITS:
                raise SchemaError("the schema's references are too many to check")
            got = self._memo[k] = self._node(s)
        return got

    def _node(self, s: dict) -> bool:
        ref = s.get("$ref")
        if isinstance(ref, str):
            t = resolve(self.root, ref)
            if t is not None and id(t) not in self.proven:
                return False
        for k in ("anyOf", "oneOf"):
            alts = s.get(k)
            if isinstance(alts, list) and alts and not any(self._finite(a) for a in alts):
                return False
        parts = s.get("allOf")
        if isinstance(parts, list) and not all(self._finite(p) for p in parts):
            return False
        listed = _listed_values(s)
        if listed is not None:
            # a listed value is finite; whether it fits the rest is the compiler's, unless
            # the lists (the schema's and its allOf's) have no value in common
            return bool(listed)
        t = s.get("type")
        types = [t] if isinstance(t, str) else t if isinstance(t, list) else None
        if types is None:
            return True  # a string or a number satisfies every object or array keyword
        return any(self._type(s, ty) for ty in types)

    def _type(self, s: dict, ty: object) -> bool:
        if ty == "object":
            return self._object(s)
        if ty == "array":
            return self._array(s)
        return True

    def _object(self, s: dict) -> bool:
        p, pp, r = s.get("properties"), s.get("patternProperties"), s.get("required")
        props: dict = p if isinstance(p, dict) else {}
        patterns: dict = pp if isinstance(pp, dict) else {}
        required: list = r if isinstance(r, list) else []
        for name in required:
            if not isinstance(name, str):
                continue
            if name in props:
                if not self._finite(props[name]):
                    return False
                continue
            matched = [v for p, v in patterns.items() if _matches(p, name)]
            if matched:
                if not all(self._finite(v) for v in matched):
                    return False
            elif not self._finite(s.get("additionalProperties", True)):
                return False
        return True

    def _array(self, s: dict) -> bool:
        n = s.get("minItems", 0)
        n = n if isinstance(n, int) and not isinstance(n, bool) else 0
        prefix = s.get("prefixItems")
        if isinstance(prefix, list):
            rest = s.get("items", True)
        elif isinstance(s.get("items"), list):  # drafts 4-7: the tuple form
            prefix, rest = s["items"], s.get("additionalItems", True)
        else:
            prefix, rest = [], s.get("items", True)
        if not all(self._finite(p) for p in prefix[:n]):
            return False
        if n > len(prefix) and not self._finite(rest):
            return False
        contains = s.get("contains")
        if contains is not None and s.get("minContains", 1) != 0:
            return self._finite(contains)
        return True


def _canon(v: object) -> object:
    """A hashable form under JSON Schema's equality (1 == 1.0, true != 1, key order free)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return (type(v).__name__, v)
    if isinstance(v, (int, float, Decimal)):
        return ("number", Decimal(repr(v) if isinstance(v, float) else v).normalize())
    if isinstance(v, list):
        return ("array", tuple(_canon(x) for x in v))
    if isinstance(v, dict):
        return ("object", frozenset((k, _canon(x)) for k, x in v.items()))
    return ("other", repr(v))


def _lists(s: dict) -> list[set]:
    out = []
    if "const" in s:
        out.append({_canon(s["const"])})
    if isinstance(s.get("enum"), list):
        out.append({_canon(x) for x in s["enum"]})
    return out


def _listed_values(s: dict) -> set | None:
    """The values the schema's enum/const and its allOf members' allow in common; None if
    none of them lists values."""
    lists = _lists(s)
    parts = s.get("allOf")
    if isinstance(parts, list):
        for p in parts:
            if isinstance(p, dict):
                lists.extend(_lists(p))
    if not lists:
        return None
    common = lists[0]
    for other in lists[1:]:
        common = common & other
    return common


def _matches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except (re.error, TypeError):
        return True  # a pattern Python cannot read: assume it could apply (the safe side)


def check_finite(schema: object) -> None:
    """SchemaError if no finite JSON value can satisfy the schema (an unbroken cycle)."""
    if not _Rounds(schema).run():
        raise SchemaError("no JSON value satisfies the schema: its references form a cycle "
                          "that every value would have to follow forever")



def _in_place(root: object, s: dict) -> list[object]:
    """The schemas that apply to the same value as `s` (not to a property or an item)."""
    out: list[object] = []
    ref = s.get("$ref")
    if isinstance(ref, str):
        t = resolve(root, ref)
        if t is not None:
            out.append(t)
    for k in ("allOf", "anyOf", "oneOf"):
        v = s.get(k)
        if isinstance(v, list):
            out.extend(v)
    out.extend(s[k] for k in ("not", "if", "then", "else") if k in s)
    return out


def check_no_loop(schema: object) -> None:
    """SchemaError if a "$ref" leads back to a schema for the same value without going into
    a property or an item first ({"anyOf": [{"$ref": "#"}, ...]}): a validator following
    it never ends (JSON Schema leaves such a schema undefined; jsonschema recurses until
    the interpreter stops it), so no answer could be judged against it."""
    state: dict[int, int] = {}   # 1: on the current path, 2: done
    for start in subschemas(schema):
        if id(start) in state:
            continue
        stack = [(start, iter(_in_place(schema, start)))]
        state[id(start)] = 1
        while stack:
            node, it = stack[-1]
            nxt = next((c for c in it if isinstance(c, dict)), None)
            if nxt is None:
                state[id(node)] = 2
                stack.pop()
            elif state.get(id(nxt)) == 1:
                raise SchemaError("the schema refers back to itself for the same value "
                                  "(a \"$ref\" loop that no property or item breaks)")
            elif id(nxt) not in state:
                state[id(nxt)] = 1
                stack.append((nxt, iter(_in_place(schema, nxt))))
