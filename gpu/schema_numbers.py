"""Numbers in a schema that the grammar cannot hold exactly are refused, never rounded.

The grammar compiler (llguidance) reads an integer bound as a signed 64-bit integer and any
other number as a float64. A bound outside those is clamped or rounded without a word, and
the answer then breaks the schema the client sent: {"type": "integer", "minimum": 1e40}
gave 9223372036854775807, which is below the minimum. So before compiling, every number
that shapes the grammar is checked against what it will become:

- on a schema whose type is only "integer", an integral bound or multipleOf must fit in 64
  bits (−2^63 .. 2^63−1);
- every other bound or multipleOf, and every number in enum or const, must survive the
  float64 round trip: its shortest float64 form must be the number written (0.1 does;
  0.10000000000000000001, 1e400 and 2^53+1 do not). An integer in enum or const may also be
  any 64-bit integer, signed or not (the compiler keeps those as integers).

Numbers are compared as the client wrote them (schema_text.py reads them as int and
Decimal), so nothing is lost before the check.
"""
from __future__ import annotations

from decimal import Decimal

from .schema_errors import SchemaError
from .schema_walk import subschemas

_I64 = (-2**63, 2**63 - 1)
_U64_MAX = 2**64 - 1
_SHAPING = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def _is_number(v: object) -> bool:
    return isinstance(v, (int, Decimal)) and not isinstance(v, bool)


def _integral(v: int | Decimal) -> bool:
    return isinstance(v, int) or (v.is_finite() and v == v.to_integral_value())


def _survives_float64(v: int | Decimal) -> bool:
    f = float(v)
    return f == f and abs(f) != float("inf") and Decimal(repr(f)) == Decimal(v)


def _in_i64(v: int | Decimal) -> bool:
    return _I64[0] <= v <= _I64[1]


def _refuse(v: int | Decimal, where: str, why: str) -> SchemaError:
    return SchemaError(f"{where} {v} cannot be represented exactly ({why})")


def _check_data(v: object, where: str) -> None:
    """Every number inside an enum or const value."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif _is_number(x):
            ok = (_I64[0] <= x <= _U64_MAX if isinstance(x, int) else _survives_float64(x))
            if not ok:
                raise _refuse(x, where, "a number in enum or const must be a 64-bit integer "
                                        "or a float64")  # type: ignore[arg-type]


def check_numbers(schema: object) -> None:
    """SchemaError naming the first number the grammar would not keep exactly."""
    for s in subschemas(schema):
        t = s.get("type")
        integer_only = t == "integer" or t == ["integer"]
        for k in _SHAPING:
            v = s.get(k)
            if not _is_number(v):
                continue  # absent, or draft 4's boolean exclusive flags
            assert isinstance(v, (int, Decimal))
            if integer_only and _integral(v):
                if not _in_i64(v):
                    raise _refuse(v, k, "an integer bound must fit in 64 bits")
            elif not _survives_float64(v):
                raise _refuse(v, k, "a bound must be a float64")
            elif integer_only and not _in_i64(v):
                raise _refuse(v, k, "an integer bound must fit in 64 bits")
        for k in ("enum", "const"):
            if k in s:
                _check_data(s[k], k)
