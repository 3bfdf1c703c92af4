#!/usr/bin/env python
"""llguidance against xgrammar at the bundled model's vocabulary: tokenizer setup, grammar
compile and per-token mask; see bench/README.md ("bench_grammar_libs.py").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import pct  # noqa: E402  (stdlib only: it imports in the libraries' venv)

ITEM = {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"},
                                         "price": {"type": "number"}},
        "required": ["sku", "qty", "price"], "additionalProperties": False}
SCHEMAS = {  # name: (schema, a valid answer)
    "person": ({"type": "object",
                "properties": {"name": {"type": "string", "maxLength": 20},
                               "age": {"type": "integer", "minimum": 0, "maximum": 150},
                               "email": {"type": "string", "format": "email"}},
                "required": ["name", "age"], "additionalProperties": False},
               '{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org"}'),
    "order": ({"type": "object",
               "properties": {"id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                              "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": ITEM},
                              "status": {"enum": ["new", "paid", "shipped"]}},
               "required": ["id", "items", "status"], "additionalProperties": False},
              '{"id": "ABC-1234", "items": [{"sku": "x-1", "qty": 2, "price": 9.5}, '
              '{"sku": "y-22", "qty": 1, "price": 120.25}], "status": "paid"}'),
    "json_object": ({"type": "object"}, '{"a": [1, 2, {"b": null}], "c": "some text here", "d": true}'),
}


def dump_vocab(path: str) -> None:
    from zerolayer.gpu.gguf_loader import default_model_path
    from zerolayer.gpu.tokenizer import Tokenizer
    tok = Tokenizer.from_path(default_model_path())
    out = {"tokens": [tok.token_bytes(i).hex() for i in range(tok.vocab_size)],
           "special": sorted(tok.special_ids), "eos": sorted(tok.eos_ids)}
    Path(path).write_text(json.dumps(out))
    print(f"{tok.vocab_size} tokens -> {path}")


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.2f} ms"


def measure(compile_schema, start, tokenize, fill, consume) -> None:
    """Per schema: compile_schema(json) five times, timed; then along the sample's tokens
    (tokenize(text)), fill(matcher) timed before each consume(matcher, token)."""
    for name, (schema, sample) in SCHEMAS.items():
        comp = []
        for _ in range(5):
            t0 = time.perf_counter()
            g = compile_schema(json.dumps(schema))
            comp.append(time.perf_counter() - t0)
        m, ids, steps = start(g), tokenize(sample), []
        for t in ids:
            t0 = time.perf_counter()
            fill(m)
            steps.append(time.perf_counter() - t0)
            assert consume(m, t), (name, t)
        print(f"  {name}: compile {ms(comp)}, mask {statistics.median(steps) * 1e6:.0f} µs "
              f"(p90 {pct(steps, 90) * 1e6:.0f}) over {len(ids)} tokens")


def bench_llguidance(vocab: dict) -> None:
    import llguidance
    import llguidance.numpy as lnp
    special = set(vocab["special"])
    toks = [(b"\xff" if i in special else b"") + bytes.fromhex(t) for i, t in enumerate(vocab["tokens"])]

    class W:
        eos_token_id = vocab["eos"][0]
        bos_token_id = None
        tokens = toks
        special_token_ids = vocab["special"]

        def __call__(self, s):  # tokenization is only for the sample below
            return []
    t0 = time.perf_counter()
    lt = llguidance.LLTokenizer(llguidance.TokenizerWrapper(W()), eos_token=vocab["eos"])
    print(f"llguidance {getattr(llguidance, '__version__', '')}: tokenizer "
          f"{ms([time.perf_counter() - t0])}")

    def compile_schema(s: str):  # the grammar and a matcher over it: what a request costs
        m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(s))
        assert not m.is_error(), m.get_error()
        return m
    mask = lnp.allocate_token_bitmask(1, lt.vocab_size)
    measure(compile_schema, lambda m: m, lt.greedy_tokenize,
            lambda m: lnp.fill_next_token_bitmask(m, mask, 0), lambda m, t: m.consume_token(t))


def bench_xgrammar(vocab: dict) -> None:
    import xgrammar as xgr
    toks = [bytes.fromhex(t) for t in vocab["tokens"]]
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(toks, xgr.VocabType.RAW, vocab_size=len(toks),
                             stop_token_ids=vocab["eos"])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    print(f"xgrammar: tokenizer {ms([time.perf_counter() - t0])}")
    by = {t: k for k, t in enumerate(toks) if t}

    def tokenize(text: str) -> list[int]:  # the longest vocabulary match at each point
        data, ids, i = text.encode(), [], 0
        while i < len(data):
            j = next((j for j in range(min(len(data), i + 32), i, -1) if data[i:j] in by), None)
            if j is None:
                raise SystemExit(f"no token at {i}")
            ids.append(by[data[i:j]])
            i = j
        return ids
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    measure(lambda s: compiler.compile_json_schema(s, any_whitespace=False), xgr.GrammarMatcher,
            tokenize, lambda m: m.fill_next_token_bitmask(mask, 0), lambda m, t: m.accept_token(t))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump-vocab")
    ap.add_argument("--vocab", default="/tmp/zl-vocab.json")
    ap.add_argument("--lib", default="both")
    a = ap.parse_args()
    if a.dump_vocab:
        return dump_vocab(a.dump_vocab)
    vocab = json.loads(Path(a.vocab).read_text())
    for lib, fn in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar)):
        if a.lib in (lib, "both"):
            fn(vocab)


if __name__ == "__main__":
    main()
