"""The checks a response_format schema passes before it compiles (gpu/schema_*.py), each on
the cases that broke the protocol's promises and the edges of its stated limits."""
from __future__ import annotations

import json

import pytest

from zerolayer.gpu.schema_errors import SchemaError
from zerolayer.gpu.schema_finite import check_finite, check_no_loop
from zerolayer.gpu.schema_numbers import check_numbers
from zerolayer.gpu.schema_spelling import check_spelling
from zerolayer.gpu.schema_text import MAX_SCHEMA_DEPTH, load_schema, nesting_depth


def nested_any_of(levels: int) -> str:
    s = '{"type": "string"}'
    for _ in range(levels):
        s = '{"anyOf": [%s, {"type": "null"}]}' % s
    return s


def test_depth_is_measured_on_the_text_and_bounded():
    ok = "[" * MAX_SCHEMA_DEPTH + "]" * MAX_SCHEMA_DEPTH
    assert nesting_depth(ok) == MAX_SCHEMA_DEPTH and load_schema(ok) is not None
    assert nesting_depth('{"a": "[[[[{{", "b": ["\\"]"]}') == 2   # brackets in strings aren't
    for text in ["[" * 1000 + "]" * 1000, nested_any_of(584), "[" * 101 + "]" * 101]:
        with pytest.raises(SchemaError, match="^response_format: the JSON schema nests"):
            load_schema(text)
    # a real API's deepest (10 schema levels) is far inside the bound
    assert nesting_depth(nested_any_of(10)) <= 30 < MAX_SCHEMA_DEPTH


def test_numbers_are_read_exactly_and_nan_is_not_json():
    assert load_schema('{"minimum": 0.10000000000000000001}')["minimum"] != 0.1
    with pytest.raises(SchemaError, match="not valid JSON"):
        load_schema('{"minimum": NaN}')


@pytest.mark.parametrize("schema, says", [
    ('{"type": "integer", "minimum": 1e40}', r"minimum 1E\+40 cannot be represented"),
    ('{"type": "integer", "minimum": 1e19}', "strictly between"),
    ('{"type": "integer", "minimum": 9223372036854775807}', "float64"),
    ('{"type": ["integer", "null"], "maximum": -1e19}', "strictly between"),
    ('{"type": "integer", "minimum": 9223372036854775000}', "exactly a float64"),
    ('{"type": "integer", "minimum": 9007199254740993}', "float64"),
    ('{"type": "number", "maximum": 0.10000000000000000001}', "float64"),
    ('{"type": "number", "maximum": 1e400}', "float64"),
    ('{"type": "number", "minimum": 5e-400}', "float64"),
    ('{"const": 9007199254740993}', "const"),
    ('{"enum": [1, [2, -9223372036854775296]]}', "enum"),
    ('{"type": "number", "multipleOf": -2.5}', "greater than 0"),
    ('{"type": "integer", "multipleOf": 2147483648}', "sum to at most"),
])
def test_numbers_the_grammar_would_change_are_refused(schema, says):
    with pytest.raises(SchemaError, match=says):
        check_numbers(load_schema(schema))


@pytest.mark.parametrize("schema", [
    '{"type": "integer", "minimum": -1e17, "maximum": 100000000000000000}',
    '{"type": "number", "minimum": 0.1, "maximum": 1e40, "multipleOf": 0.25}',
    '{"const": 1e40}', '{"enum": [0.1, -9007199254740992, "x"]}',
    '{"type": "integer", "multipleOf": 9973}',
    '{"type": "object", "properties": {"minimum": {"const": 1}}}',  # a property, not a bound
])
def test_numbers_the_grammar_keeps_pass(schema):
    check_numbers(load_schema(schema))


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"c": {"$ref": "#"}}, "required": ["c"]},
    {"$defs": {"a": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/b"}},
               "b": {"type": "object", "required": ["x"],
                     "properties": {"x": {"$ref": "#/$defs/a"}}}},
     "$ref": "#/$defs/a"},
    {"anyOf": [{"type": "object", "required": ["n"], "properties": {"n": {"$ref": "#"}}},
               {"type": "array", "prefixItems": [{"$ref": "#"}], "minItems": 1}]},
])
def test_recursion_with_no_way_out_is_refused(schema):
    with pytest.raises(SchemaError, match="no JSON value satisfies"):
        check_finite(schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"c": {"$ref": "#"}}},                     # c optional
    {"type": "array", "items": {"$ref": "#"}},                                  # [] ends it
    {"type": "object", "properties": {"c": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
     "required": ["c"]},
    {"type": ["object", "null"], "properties": {"c": {"$ref": "#"}}, "required": ["c"]},
])
def test_recursion_with_a_way_out_passes(schema):
    check_finite(schema)


def test_a_ref_loop_on_the_same_value_is_refused():
    for schema in [{"$ref": "#"}, {"anyOf": [{"allOf": [{"$ref": "#"}]}, {"type": "null"}]}]:
        with pytest.raises(SchemaError, match="refers back to itself"):
            check_no_loop(schema)
    check_no_loop({"type": "array", "items": {"$ref": "#"}})   # an item breaks it


def test_text_the_vocabulary_cannot_write_is_refused():
    missing = frozenset({0xF1, 0xF2})
    bad = json.loads('{"properties": {"a": {"const": "\\ud8c0\\udc00"}}}')   # U+40000
    with pytest.raises(SchemaError, match=r"U\+40000"):
        check_spelling(bad, missing)
    check_spelling({"enum": ["😀", "日本"], "properties": {"é": {}}}, missing)


def test_lists_with_no_value_in_common_are_no_way_out():
    """The branch that would end the recursion allows no value (its allOf's enums share
    none), so every value would nest forever."""
    schema = {"type": "array", "minItems": 1, "prefixItems": [{"anyOf": [
        {"allOf": [{"enum": [None, 1]}, {"enum": ["x"]}]}, {"$ref": "#"}]}]}
    with pytest.raises(SchemaError, match="no JSON value satisfies"):
        check_finite(schema)
    schema["prefixItems"][0]["anyOf"][0]["allOf"][1]["enum"].append(1.0)   # 1 == 1.0
    check_finite(schema)
