"""Structured output: the CONSTRAINT block on the wire, the token mask before sampling, the
engine's matchers, the SDK's response_format and the HTTP edge's, with jsonschema as judge.

Every generated answer that ends by itself (finish "stop") is checked against its schema;
the schemas are small and bounded (enums, maxLength, integer ranges) so the small bundled
model completes them within max_tokens at any temperature. No assertion depends on speed.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import numpy as np
import pytest

from test_engine import Recorder  # the engine's typed events, by request key
from zerolayer.daemon.engine import Engine
from zerolayer.daemon.request import Admitted
from zerolayer.gpu.grammar import Grammars, mask_words
from zerolayer.gpu.ops.sampling import sample
from zerolayer.gpu.ops.token_mask import allowed, masked
from zerolayer.protocol import wire
from zerolayer.protocol.constraint import (
    MAX_CONSTRAINT_BYTES,
    Constraint,
    ConstraintKind,
    from_response_format,
)
from zerolayer.protocol.errors import MalformedError
from zerolayer.protocol.sampling_params import SamplingParams

CITY = {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 16},
                       "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
                       "capital": {"type": "boolean"}},
        "required": ["city", "population", "capital"], "additionalProperties": False}
PET = {"type": "object",
       "properties": {"kind": {"enum": ["cat", "dog", "bird"]},
                      "legs": {"type": "integer", "minimum": 0, "maximum": 8},
                      "tags": {"type": "array", "items": {"enum": ["small", "loud", "old"]},
                               "maxItems": 2}},
       "required": ["kind", "legs", "tags"], "additionalProperties": False}
ANSWER = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}
SCHEMAS = [CITY, PET, ANSWER]
UNSATISFIABLE = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5,
                                                        "maximum": 3}}, "required": ["n"]}


def rf(schema: dict, name: str = "out") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                   "strict": True}}


def constraint(schema: dict) -> Constraint:
    c = from_response_format(rf(schema))
    assert c is not None
    return c


# ------------------------------------------------------------------------------ the wire

def test_block_round_trip_after_the_other_blocks():
    p = SamplingParams(max_tokens=9, temperature=0.5, seed=3, stop=("\n",),
                       presence_penalty=0.5, logprobs=True, top_logprobs=2,
                       constraint=constraint(PET))
    body = wire.encode_invoke_body(p, wire.PayloadKind.PROMPT, b"pets")
    flags = wire.PARAMS.unpack_from(body)[7]
    assert flags == (wire.PARAM_SEED_SET | wire.PARAM_PENALTIES | wire.PARAM_LOGPROBS
                     | wire.PARAM_CONSTRAINT)
    got = wire.decode_invoke_body(body)
    assert got.params == p and got.prompt == "pets"
    # the block: after params (32), penalties (12), logprobs (4); kind, 0, len, text
    text = p.constraint.text.encode()
    assert body[48:52] == bytes([1, 0]) + len(text).to_bytes(2, "little")
    assert body[52:52 + len(text)] == text and json.loads(text) == PET  # key order kept


def test_unconstrained_bodies_are_byte_identical():
    """No response_format: the old layout, the flag clear, no block; the SDK's body is the
    one the encoder gave before the block existed (same parameters, no constraint)."""
    from zerolayer.client.invoke_body import build_invoke_body
    kw = dict(max_tokens=7, temperature=0.7, top_k=5, top_p=0.9, seed=11, stop=("x",))
    for fmt in (None, {"type": "text"}):
        body = build_invoke_body("hi", None, None, response_format=fmt, **kw)
        ref = wire.encode_invoke_body(SamplingParams(max_tokens=7, temperature=0.7, top_k=5,
                                                     top_p=0.9, seed=11, stop=("x",)),
                                      wire.PayloadKind.PROMPT, b"hi")
        assert body == ref
        assert not wire.PARAMS.unpack_from(body)[7] & wire.PARAM_CONSTRAINT
        assert len(body) == wire.PARAMS_LEN + 2 + 1 + 2


def test_json_object_block_and_response_format_shapes():
    assert from_response_format(None) is None
    assert from_response_format({"type": "text"}) is None
    c = from_response_format({"type": "json_object"})
    assert c == Constraint(ConstraintKind.JSON_OBJECT, "")
    body = wire.encode_invoke_body(SamplingParams(max_tokens=3, constraint=c),
                                   wire.PayloadKind.PROMPT, b"")
    assert body[32:36] == bytes([2, 0, 0, 0])
    assert wire.decode_invoke_body(body).params.constraint == c
    for bad, says in [({"type": "xml"}, "response_format.type"),
                      ({"type": "json_schema"}, "json_schema must be an object"),
                      ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
                      ("json", "must be an object")]:
        with pytest.raises(MalformedError, match=says):
            from_response_format(bad)  # type: ignore[arg-type]


def test_block_bounds_and_defects_are_malformed():
    big = {"type": "object", "description": "x" * MAX_CONSTRAINT_BYTES}
    from zerolayer.client.invoke_body import build_invoke_body
    with pytest.raises(MalformedError, match=f"at most {MAX_CONSTRAINT_BYTES} bytes"):
        build_invoke_body("hi", None, None, max_tokens=4, temperature=0.0, top_k=0, top_p=1.0,
                          seed=None, stop=(), response_format=rf(big))
    head = wire.PARAMS.pack(4, 0.0, 1.0, 0, 0, 2, 0, wire.PARAM_CONSTRAINT, 0)

    def body(block: bytes) -> bytes:
        return head + block

    n = MAX_CONSTRAINT_BYTES + 1
    cases = [(b"", "shorter than the constraint block"),
             (bytes([1, 0]) + n.to_bytes(2, "little") + b"{" * n, "at most 16384 bytes"),
             (bytes([1, 1, 2, 0]) + b"{}", "reserved byte"),
             (bytes([9, 0, 2, 0]) + b"{}", "unknown constraint kind 9"),
             (bytes([1, 0, 9, 0]) + b"{}", "runs past the body"),
             (bytes([1, 0, 2, 0]) + b"\xff{", "UTF-8"),
             (bytes([1, 0, 0, 0]), "needs a schema"),
             (bytes([2, 0, 2, 0]) + b"{}", "json_object carries no text")]
    for block, says in cases:
        with pytest.raises(MalformedError, match=says):
            wire.decode_invoke_body(body(block))
    ok = bytes([1, 0, 2, 0]) + b"{}"
    assert wire.decode_invoke_body(body(ok)).params.constraint == Constraint(
        ConstraintKind.JSON_SCHEMA, "{}")


# ------------------------------------------------------------------------------ the mask

def test_masked_sampling_draws_only_allowed_tokens():
    rng = np.random.default_rng(0)
    vocab = 1000
    for trial in range(20):
        row = rng.normal(size=vocab).astype(np.float32) * 3
        ok = rng.random(vocab) < (0.01 if trial % 2 else 0.3)
        ok[rng.integers(vocab)] = True
        words = np.zeros(mask_words(vocab), np.uint32)
        for t in np.nonzero(ok)[0]:
            words[t // 32] |= np.uint32(1 << (t % 32))
        assert (allowed(words, vocab) == ok).all()
        m = masked(row, words)
        assert (m[ok] == row[ok]).all() and np.isneginf(m[~ok]).all()
        assert sample(m, 0.0, 0, 1.0, 0.0) == int(np.flatnonzero(ok)[np.argmax(row[ok])])
        for u in np.linspace(0, 0.999, 7):
            for t, k, p in [(1.0, 0, 1.0), (1.5, 5, 1.0), (0.7, 0, 0.9)]:
                assert ok[sample(m, t, k, p, float(u))]


def test_grammars_compile_once_and_refuse_clearly(generator):
    g = Grammars(generator.tokenizer, generator.model.cfg.vocab, entries=2)
    for _ in range(3):
        g.matcher(constraint(CITY))
    assert g.compiled == 1
    g.matcher(constraint(PET))
    g.matcher(constraint(ANSWER))      # the oldest (CITY) leaves the bounded cache
    g.matcher(constraint(CITY))
    assert g.compiled == 4
    for schema, says in [(UNSATISFIABLE, "Unsatisfiable"), ({"type": "nope"}, "nope"),
                         ({"allOf": [{"type": "string"}, {"type": "integer"}]},
                          "Unsatisfiable")]:
        with pytest.raises(ValueError, match=f"response_format: .*{says}"):
            g.matcher(constraint(schema))
    with pytest.raises(ValueError, match="not valid JSON"):
        g.matcher(Constraint(ConstraintKind.JSON_SCHEMA, "{not json"))


# ------------------------------------------------------------------------------ the engine

def _run(eng: Engine) -> None:
    for _ in range(3000):
        if not eng.has_work:
            return
        eng.step()
    raise AssertionError("engine did not finish")


PROMPTS = ["Describe Paris as JSON.", "Describe a pet as JSON.", "Is the sky blue? JSON."]


def test_engine_outputs_validate_over_seeds_and_temperatures(generator):
    """16 constrained requests (3 schemas, greedy and sampled at 0.5..1.5, distinct seeds)
    and 2 free ones in the same batches: every constrained answer parses and validates; the
    free ones are what they are alone (a row without a mask is untouched)."""
    tok = generator.tokenizer
    rec = Recorder()
    eng = Engine(generator.model, tok, emit=rec, max_running=8, step_tokens=256)
    free_ids = np.array(tok.encode_chat([{"role": "user", "content": PROMPTS[0]}]), np.int32)
    solo = generator.complete(messages=[{"role": "user", "content": PROMPTS[0]}],
                              params=SamplingParams(max_tokens=12)).text
    temps = [0.0, 0.5, 1.0, 1.5]
    for k in range(16):
        s = k % 3
        ids = np.array(tok.encode_chat([{"role": "user", "content": PROMPTS[s]}]), np.int32)
        eng.submit(Admitted(k, SamplingParams(
            max_tokens=64, temperature=temps[k % 4], seed=100 + k,
            constraint=constraint(SCHEMAS[s]))), ids)
    eng.submit(Admitted("free", SamplingParams(max_tokens=12)), free_ids)
    eng.submit(Admitted("obj", SamplingParams(
        max_tokens=64, temperature=1.0, seed=5, constraint=from_response_format(
            {"type": "json_object"}))), free_ids)
    _run(eng)
    assert not rec.errors
    for k in range(16):
        assert rec.done[k][0] == "stop", (k, rec.text.get(k))
        jsonschema.validate(json.loads(rec.text[k]), SCHEMAS[k % 3])
    assert rec.done["obj"][0] == "stop" and isinstance(json.loads(rec.text["obj"]), dict)
    assert rec.text["free"] == solo
    assert eng.grammars.compiled == 4  # 3 schemas + json_object, each once
    eng.prefix.clear()


def test_engine_refuses_an_unsatisfiable_schema_before_it_starts(generator):
    rec = Recorder()
    eng = Engine(generator.model, generator.tokenizer, emit=rec)
    r = Admitted(1, SamplingParams(max_tokens=8, constraint=constraint(UNSATISFIABLE)))
    with pytest.raises(ValueError, match="response_format: .*Unsatisfiable"):
        eng.submit(r, [1, 2, 3])
    assert not eng.has_work


def test_logprobs_of_forbidden_tokens_are_json():
    """A constrained row's logprobs are of the masked distribution: an alternative the
    grammar forbids has -inf, which the edge sends as OpenAI's floor, -9999.0 (JSON has no
    -inf; starlette refuses to encode one)."""
    from zerolayer.daemon.programs.http_edge.logprobs import CompletionLogprobs, chat_logprobs
    from zerolayer.protocol.logprobs import TokenLogprob, TopLogprob
    t = TokenLogprob(5, b"{", -0.01, (TopLogprob(5, b"{", -0.01),
                                      TopLogprob(7, b"x", float("-inf"))))
    body = chat_logprobs([t])
    assert json.loads(json.dumps(body, allow_nan=False))["content"][0]["top_logprobs"][1][
        "logprob"] == -9999.0
    json.dumps(CompletionLogprobs().next([t]), allow_nan=False)


# ------------------------------------------------------------------------------ daemon + edge

@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from edge_proc import daemon_and_edge
    with daemon_and_edge(tmp_path_factory.mktemp("zl-structured"), "--cache-lease-s", "30") as pair:
        yield pair


def test_sdk_response_format_and_the_clear_error(stack):
    from zerolayer.client import Client
    d, _ = stack
    c = Client(d.addr, d.key_id, d.secret, timeout=60)
    msgs = [wire.ChatMessage("user", PROMPTS[1])]
    r = c.invoke(messages=msgs, max_tokens=64, temperature=0.8, seed=1,
                 response_format=rf(PET))
    assert r.finish_reason == "stop"
    jsonschema.validate(json.loads(r.text), PET)
    with c.stream(messages=msgs, max_tokens=64, temperature=0.8, seed=1,
                  response_format=rf(PET)) as s:
        assert "".join(s) == r.text
    with pytest.raises(MalformedError, match="response_format: .*Unsatisfiable"):
        c.invoke(messages=msgs, max_tokens=8, response_format=rf(UNSATISFIABLE))

    async def go():
        from zerolayer.client import AsyncClient
        async with AsyncClient(d.addr, d.key_id, d.secret, timeout=60) as ac:
            return await ac.invoke(messages=msgs, max_tokens=64, temperature=0.8, seed=1,
                                   response_format=rf(PET))
    import asyncio
    assert asyncio.run(go()).text == r.text


def test_openai_response_format_50_of_50(stack):
    """The bar for structured output: 50 seeded requests through the real openai package's
    response_format json_schema, all schema-valid (8 at a time: they share batches)."""
    import openai

    from test_http_edge import MODEL, TOKEN
    _, edge = stack
    client = openai.OpenAI(base_url=edge.base + "/v1", api_key=TOKEN, max_retries=0,
                           timeout=120)

    def one(i: int):
        s = i % 3
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPTS[s]}], max_tokens=64,
            temperature=[0.0, 0.6, 1.0, 1.3][i % 4], seed=i, response_format=rf(SCHEMAS[s]))
        return s, r.choices[0]

    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, range(50)))
    for s, choice in results:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[s])
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=64,
        temperature=0, response_format={"type": "json_object"}, stream=True)
    chunks = [c.choices[0] for c in r if c.choices]
    assert chunks[-1].finish_reason == "stop"
    assert isinstance(json.loads("".join(c.delta.content or "" for c in chunks)), dict)


def test_openai_refusals_name_response_format(stack):
    import openai

    from test_http_edge import MODEL, TOKEN
    _, edge = stack
    client = openai.OpenAI(base_url=edge.base + "/v1", api_key=TOKEN, max_retries=0,
                           timeout=120)
    msgs = [{"role": "user", "content": "hi"}]
    for fmt, says in [({"type": "xml"}, "response_format.type"),
                      ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
                      (rf(UNSATISFIABLE), "Unsatisfiable"),
                      (rf({"type": "nope"}), "nope")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                                           response_format=fmt)  # type: ignore[arg-type]
        assert e.value.status_code == 400
        err = e.value.body
        assert isinstance(err, dict) and err.get("param") == "response_format", err
        assert says in err["message"] and "response_format" in err["message"]
