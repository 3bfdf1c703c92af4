"""Numbers in a schema that the grammar cannot hold exactly are refused, never rounded.

The grammar compiler (llguidance) reads every number of a schema as a float64, integer
bounds and const values included, and an integer bound then as a signed 64-bit integer.
What does not survive that is changed without a word, and the answer breaks the schema the
client sent: {"type": "integer", "minimum": 1e40} was clamped to 2^63 − 1 (an answer below
its minimum), {"minimum": 9007199254740993} became 9007199254740992, and a const whose
float64 is −2^63 brings the compiler down (measured, llguidance 1.9). So before compiling,
every number that shapes the grammar (the bounds, multipleOf, every number inside enum and
const) is checked against what it will become:

- it must survive the float64 round trip: its shortest float64 form is the number written
  (0.1, 1e40 and 2^53 do; 0.10000000000000000001, 1e400, 5e-400 and 2^53 + 1 do not);
- on a schema whose type is or lists "integer", a bound's float64 must lie strictly between
  −2^63 and 2^63 (the 64-bit range, with its ends excluded: at them the conversion clamps),
  and an integral bound must be that float64 exactly (the compiler converts the float's
  value, not its shortest form: 9223372036854775000 would become 9223372036854774784);
- an integer literal in enum or const must be exactly a float64, and not ±2^63 (it is
  written back as the float's exact value: const 9223372036854775000 came out as
  9223372036854774784);
- multipleOf must be greater than 0 (JSON Schema's rule, which the compiler does not check);
- the significant digits of the multipleOf values (7 for 0.7 or 7000; 9973 for 99.73), summed
  over the schema, may be at most MAX_MULTIPLE_OF_DIGITS_SUM: the compiler builds an
  automaton for "a multiple of N" whose size grows with those digits, on the engine thread
  (measured: 9973 compiles in 0.1-0.3 s; 1000003 in 19 s and 138 MB; 2^31 did not finish
  in 10 minutes and 12 GB).

Numbers are compared as the client wrote them (schema_text.py reads them as int and
Decimal), so nothing is lost before the check.
"""
from __future__ import annotations

from decimal import Decimal

from .schema_errors import SchemaError
from .schema_walk import subschemas

_TWO_63 = float(2**63)
MAX_MULTIPLE_OF_DIGITS_SUM = 10_000
_SHAPING = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def _is_number(v: object) -> bool:
    return isinstance(v, (int, Decimal)) and not isinstance(v, bool)


def _survives_float64(v: int | Decimal) -> bool:
    try:
        f = float(v)
    except OverflowError:  # an int past float64's range
        return False
    return f == f and abs(f) != float("inf") and Decimal(repr(f)) == Decimal(v)


def _significand(v: int | Decimal) -> int:
    """The number written without its decimal point and trailing zeros: 0.7 and 7000 -> 7."""
    digits = Decimal(v).normalize().as_tuple().digits
    return int("".join(map(str, digits)) or "0")


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
            assert isinstance(x, (int, Decimal))
            if not _survives_float64(x):
                raise _refuse(x, where, "the grammar holds numbers as float64")
            if abs(float(x)) == _TWO_63:
                raise _refuse(x, where, "an integer must lie strictly between -2^63 and 2^63")
            # an integer literal is written back as its float64's exact value, not its
            # shortest form (a number written with a fraction or exponent keeps its form)
            if isinstance(x, int) and Decimal(float(x)) != Decimal(x):
                raise _refuse(x, where, "an integer must be exactly a float64")


def check_numbers(schema: object) -> None:
    """SchemaError naming the first number the grammar would not keep exactly."""
    multiples = 0
    for s in subschemas(schema):
        t = s.get("type")
        integer = t == "integer" or (isinstance(t, list) and "integer" in t)
        for k in _SHAPING:
            v = s.get(k)
            if not _is_number(v):
                continue  # absent, or draft 4's boolean exclusive flags
            assert isinstance(v, (int, Decimal))
            if k == "multipleOf":
                if v <= 0:
                    raise SchemaError(f"multipleOf must be greater than 0, got {v}")
                if not _survives_float64(v):
                    raise _refuse(v, k, "the grammar holds numbers as float64")
                multiples += _significand(v)
                if multiples > MAX_MULTIPLE_OF_DIGITS_SUM:
                    raise SchemaError(f"multipleOf {v}: the significant digits of the "
                                      f"schema's multipleOf values may sum to at most "
                                      f"{MAX_MULTIPLE_OF_DIGITS_SUM}")
            if not _survives_float64(v):
                raise _refuse(v, k, "the grammar holds numbers as float64")
            if integer and v == v.to_integral_value() if isinstance(v, Decimal) else integer:
                if Decimal(float(v)) != Decimal(v):
                    raise _refuse(v, k, "an integer bound must be exactly a float64")
            if integer and abs(float(v)) >= _TWO_63:
                raise _refuse(v, k, "an integer bound must lie strictly between -2^63 and "
                                    "2^63")
        for k in ("enum", "const"):
            if k in s:
                _check_data(s[k], k)
