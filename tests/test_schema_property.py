"""response_format schemas from a generator: each is refused MALFORMED before a run, or
every answer the grammar lets through validates (jsonschema is the judge).

The schemas are random (hypothesis, derandomized so CI sees the same ones every run) and
adversarial on purpose: nesting around and past the depth bound, objects wide enough to
pass the 16 KiB text bound, "$ref" cycles with and without a way out, and numbers at the
edges of 64-bit integers and float64 (written as text, exactly: 2^63, 1e40, 1e400,
0.10000000000000000001). Each goes through what the daemon does with a constraint: the
block's own check (protocol/constraint.py, on the I/O thread) and Grammars.matcher (what
Engine.submit calls on the engine thread). A refusal must be a MalformedError or a
SchemaError; any other exception is what the daemon would answer INTERNAL.

An accepted schema is then answered by a decoder without a model: at each step a token is
drawn, by a seeded generator, among those the grammar's mask allows (the engine's sampler
draws among the same; the model only weighs them), leaning towards tokens that close
strings, arrays and objects so that most answers end. An answer that ends (the grammar
stopped, or EOS drawn where it was allowed) must parse and validate against the schema,
numbers read exactly (Decimal, both sides). A bounded subset then runs through the real
engine with the bundled model.
"""
from __future__ import annotations

import decimal
import json
from collections import Counter
from decimal import Decimal

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_engine import Recorder
from zerolayer.gpu.grammar import Grammars, mask_words
from zerolayer.gpu.ops.token_mask import allowed
from zerolayer.gpu.schema_errors import SchemaError
from zerolayer.protocol.constraint import Constraint, ConstraintKind
from zerolayer.protocol.errors import MalformedError

EXAMPLES = 2000        # schemas through admission and the model-free decoder
ENGINE_EXAMPLES = 24   # of those, through the engine with the bundled model
WALK_TOKENS = 96

# Numbers as the client writes them: the text goes into the schema verbatim.
EDGE_INTS = ["0", "1", "-1", "7", "255", "-300", "2147483648", "9007199254740993",
             "9223372036854775807", "9223372036854775808", "-9223372036854775808", "9973",
             "-9223372036854775809", "18446744073709551616", "1e20", "1e40", "-1e40",
             "9223372036854775000", "1e17", "1e19"]
EDGE_FLOATS = ["0.1", "-2.5", "3.0", "0.10000000000000000001", "1e308", "1e400", "-1e400",
               "1e-400", "5e-324", "1.7976931348623157e308", "123456789.123456789",
               "0.3", "1.5e3", "1e-5", "2.220446049250313e-16"]
NUMBER_TEXT = st.sampled_from(EDGE_INTS + EDGE_FLOATS)
NAMES = st.sampled_from(["a", "b", "c", "id", "name", "x y", "é", "0", "$ref", "type",
                         "properties", 'q"uote'])


class Num(str):
    """A number written as this text in the schema."""


def to_text(v: object) -> str:
    """JSON text with every Num written verbatim (json.dumps would quote it)."""
    raws: list[str] = []

    def mark(x: object) -> object:
        if isinstance(x, Num):
            raws.append(str(x))
            return f"\x00{len(raws) - 1}\x00"
        if isinstance(x, dict):
            return {k: mark(y) for k, y in x.items()}
        if isinstance(x, list):
            return [mark(y) for y in x]
        return x
    text = json.dumps(mark(v), ensure_ascii=False, separators=(",", ":"))
    for i, r in enumerate(raws):
        text = text.replace(json.dumps(f"\x00{i}\x00"), r)
    return text


def _bounds(kinds: list[str]) -> st.SearchStrategy[dict]:
    return st.dictionaries(st.sampled_from(kinds), NUMBER_TEXT.map(Num), max_size=3)


INTEGER = _bounds(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                   "multipleOf"]).map(lambda b: {"type": "integer", **b})
NUMBER = _bounds(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                  "multipleOf"]).map(lambda b: {"type": "number", **b})
STRING = st.fixed_dictionaries({"type": st.just("string")}, optional={
    "minLength": st.integers(0, 6), "maxLength": st.integers(0, 12),
    "enum": st.lists(st.text(max_size=5), min_size=1, max_size=4)})
DATA = st.one_of(NUMBER_TEXT.map(Num), st.text(max_size=4), st.booleans(), st.none(),
                 st.lists(NUMBER_TEXT.map(Num), max_size=2))
LEAF = st.one_of(
    INTEGER, NUMBER, STRING, st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.just({}), st.booleans(),
    st.lists(DATA, min_size=1, max_size=4).map(lambda xs: {"enum": xs}),
    DATA.map(lambda x: {"const": x}),
    st.sampled_from(["#", "#/$defs/d0", "#/$defs/d1", "#/$defs/missing", "#/properties/a",
                     "other.json#"]).map(lambda r: {"$ref": r}),
)


def _object(children: st.SearchStrategy) -> st.SearchStrategy[dict]:
    def build(props: dict, required: list, extra: object, minp: int | None) -> dict:
        s: dict = {"type": "object", "properties": props,
                   "required": [k for k in required if k in props or extra is not False]}
        if extra is not None:
            s["additionalProperties"] = extra
        if minp is not None:
            s["minProperties"] = minp
        return s
    return st.builds(build, st.dictionaries(NAMES, children, max_size=4),
                     st.lists(NAMES, max_size=3, unique=True),
                     st.sampled_from([None, False, True]), st.none() | st.integers(0, 2))


def _array(children: st.SearchStrategy) -> st.SearchStrategy[dict]:
    def build(items: object, prefix: list, lo: int, span: int | None) -> dict:
        s: dict = {"type": "array", "items": items, "minItems": lo}
        if prefix:
            s["prefixItems"] = prefix
        if span is not None:
            s["maxItems"] = lo + span
        return s
    return st.builds(build, children, st.lists(children, max_size=2), st.integers(0, 2),
                     st.none() | st.integers(0, 3))


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    lists = st.lists(children, min_size=1, max_size=3)
    return st.one_of(_object(children), _array(children),
                     lists.map(lambda xs: {"anyOf": xs}), lists.map(lambda xs: {"oneOf": xs}),
                     lists.map(lambda xs: {"allOf": xs}),
                     st.tuples(children, st.sampled_from(["#", "#/$defs/d0"])).map(
                         lambda t: {"anyOf": [t[0], {"$ref": t[1]}]}))


RANDOM = st.recursive(LEAF, _extend, max_leaves=12)


def _rooted(body: object, defs: dict | None) -> dict:
    root: dict = body if isinstance(body, dict) else {"anyOf": [body]}
    if defs is not None:
        root = {**root, "$defs": defs}
    return root


ROOTED = st.builds(_rooted, RANDOM, st.none() | st.fixed_dictionaries(
    {"d0": RANDOM}, optional={"d1": RANDOM}))


def _deep(n: int, how: str, inner: object) -> dict:
    s = inner
    for _ in range(n):
        s = {"type": "array", "items": s, "maxItems": 1} if how == "items" else \
            {"anyOf": [s]} if how == "anyOf" else \
            {"type": "object", "properties": {"k": s}, "required": ["k"]}
    return s if isinstance(s, dict) else {"anyOf": [s]}


# around and past the depth bound (100 JSON levels: items 1 each, anyOf and properties 2)
DEEP = st.builds(_deep, st.integers(1, 120), st.sampled_from(["items", "anyOf", "props"]),
                 LEAF)
# wide: up to a few hundred properties, around the 16 KiB text bound
WIDE = st.builds(lambda n, leaf: {"type": "object",
                                  "properties": {f"p{i}": leaf for i in range(n)},
                                  "required": [f"p{i}" for i in range(0, n, 7)],
                                  "additionalProperties": False},
                 st.integers(1, 700), LEAF)
SCHEMAS = st.one_of(ROOTED, ROOTED, ROOTED, DEEP, WIDE)


def _admit(grammars: Grammars, text: str):
    """What the daemon does with the block: (matcher, None) or (None, refusal message)."""
    c = Constraint(ConstraintKind.JSON_SCHEMA, text)
    try:
        c.check()
        return grammars.matcher(c), None
    except (MalformedError, SchemaError) as e:
        return None, str(e)


class Walker:
    """The model-free decoder: masked draws from a seeded generator."""

    def __init__(self, tok, vocab: int):
        self.vocab = vocab
        self.eos = sorted(tok.eos_ids)
        self.bytes = [tok.token_bytes(i) if i < tok.vocab_size else b"" for i in range(vocab)]
        closers = [i for i, b in enumerate(self.bytes) if any(c in b for c in b'"]}')]
        self.closer = np.zeros(vocab, np.bool_)
        self.closer[closers] = True
        self.row = np.zeros(mask_words(vocab), np.uint32)

    def walk(self, m, rng: np.random.Generator) -> tuple[str, bytes]:
        """("stop", text) when the answer ended, ("length", text) when it ran out of
        tokens; AssertionError if the grammar fails where the daemon would fail a run."""
        out = bytearray()
        for _ in range(WALK_TOKENS):
            if m.stopped:
                return "stop", bytes(out)
            m.fill(self.row)
            assert not m.gave_up, f"the grammar engine gave up mid-answer: {m.error}"
            ok = allowed(self.row, self.vocab)
            eos_ok = [e for e in self.eos if ok[e]]
            if eos_ok and rng.random() < 0.7:
                return "stop", bytes(out)
            ok[self.eos] = False
            pick = np.flatnonzero(ok & self.closer) if rng.random() < 0.6 else []
            if not len(pick):
                pick = np.flatnonzero(ok)
            if not len(pick):
                assert eos_ok, f"a mask allows nothing after {bytes(out)!r}"
                return "stop", bytes(out)
            t = int(pick[rng.integers(len(pick))])
            assert m.advance(t), f"the grammar refused the token it allowed: {m.error}"
            out += self.bytes[t]
        return "length", bytes(out)


def _exact(s: str) -> Decimal:
    """A JSON number as a Decimal; one whose exponent is past even Decimal's (valid JSON:
    an unbounded "number" may be 1e-91089790606458302503) as the Decimal nearest it on the
    same side of 0 and of every bound a schema can write."""
    try:
        return Decimal(s)
    except decimal.InvalidOperation:
        mantissa, _, exp = s.lower().partition("e")
        sign = "-" if mantissa.startswith("-") else ""
        e = decimal.MIN_EMIN if exp.startswith("-") else decimal.MAX_EMAX
        return Decimal(f"{sign}1e{e}")


def judge(text: str, answer: bytes) -> None:
    """The answer parses as JSON and validates, every number read exactly."""
    with decimal.localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = 2000, decimal.MAX_EMAX, decimal.MIN_EMIN
        value = json.loads(answer.decode("utf-8"), parse_float=_exact)
        schema = json.loads(text, parse_float=Decimal)
        jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    import gguf

    from zerolayer.gpu.tokenizer import Tokenizer
    return Tokenizer.from_gguf(gguf.GGUFReader(model_path))


def test_generated_schemas_are_refused_or_answered_validly(tokenizer):
    vocab = tokenizer.vocab_size
    grammars = Grammars(tokenizer, vocab, entries=4096)
    walker = Walker(tokenizer, vocab)
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(SCHEMAS, st.integers(0, 2**32 - 1))
    def one(schema: dict, seed: int) -> None:
        text = to_text(schema)
        seen["schemas"] += 1
        m, refusal = _admit(grammars, text)
        if m is None:
            assert refusal.startswith("response_format: ") or "constraint" in refusal
            assert "\n" not in refusal
            seen["refused"] += 1
            return
        how, answer = walker.walk(m, np.random.default_rng(seed))
        seen[how] += 1
        if how == "stop":
            judge(text, answer)

    one()
    # the run covered what it claims: this many schemas, both outcomes, answers that ended
    assert seen["schemas"] >= EXAMPLES, seen
    assert seen["refused"] >= EXAMPLES // 20, seen
    assert seen["stop"] >= EXAMPLES // 4, seen


def test_generated_schemas_through_the_engine(generator):
    """A bounded subset through Engine.submit and the bundled model: refused before the
    engine holds it, or no error and an answer that ends validates."""
    from zerolayer.daemon.engine import Engine
    from zerolayer.daemon.request import Admitted
    from zerolayer.protocol.sampling_params import SamplingParams
    tok = generator.tokenizer
    prompt = np.array(tok.encode_chat([{"role": "user", "content": "Answer in JSON."}]),
                      np.int32)
    seen: Counter[str] = Counter()

    @settings(max_examples=ENGINE_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(ROOTED, st.integers(0, 2**32 - 1))
    def one(schema: dict, seed: int) -> None:
        text = to_text(schema)
        c = Constraint(ConstraintKind.JSON_SCHEMA, text)
        try:
            c.check()
        except MalformedError:
            seen["refused"] += 1
            return
        rec = Recorder()
        eng = Engine(generator.model, tok, emit=rec, max_running=1)
        try:
            eng.submit(Admitted(0, SamplingParams(
                max_tokens=128, temperature=1.0, seed=seed, constraint=c)), prompt)
        except SchemaError as e:
            assert str(e).startswith("response_format: ") and not eng.has_work
            seen["refused"] += 1
            return
        for _ in range(200):
            if not eng.has_work:
                break
            eng.step()
        eng.prefix.clear()
        assert not rec.errors, rec.errors
        reason = rec.done[0][0]
        seen[reason] += 1
        if reason == "stop":
            judge(text, rec.text.get(0, "").encode("utf-8"))

    one()
    assert sum(seen.values()) == ENGINE_EXAMPLES and seen["stop"] >= 1, seen
