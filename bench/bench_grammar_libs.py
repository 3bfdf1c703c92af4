#!/usr/bin/env python
"""llguidance against xgrammar at the bundled model's vocabulary: what choosing one costs.

    .venv/bin/python bench/bench_grammar_libs.py --dump-vocab /tmp/zl-vocab.json
    PY -m bench_grammar_libs --vocab /tmp/zl-vocab.json [--lib llguidance|xgrammar|both]

The vocabulary (every token's raw bytes, the EOS ids) comes from the bundled GGUF through
gpu/tokenizer.py, dumped once by the project's venv, so the libraries can be measured from a
scratch venv that holds xgrammar (which pulls torch and CUDA wheels; the project's venv must
not). Per library and schema: the tokenizer setup once, the grammar compile (median of 5,
fresh each time), and the per-token mask along one valid answer (the schema's sample,
tokenized greedily by the library itself, each step: mask, then consume the token).
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

SCHEMAS = {
    "person": ({"type": "object",
                "properties": {"name": {"type": "string", "maxLength": 20},
                               "age": {"type": "integer", "minimum": 0, "maximum": 150},
                               "email": {"type": "string", "format": "email"}},
                "required": ["name", "age"], "additionalProperties": False},
               '{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org"}'),
    "order": ({"type": "object",
               "properties": {"id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                              "items": {"type": "array", "minItems": 1, "maxItems": 5,
                                        "items": {"type": "object",
                                                  "properties": {
                                                      "sku": {"type": "string"},
                                                      "qty": {"type": "integer"},
                                                      "price": {"type": "number"}},
                                                  "required": ["sku", "qty", "price"],
                                                  "additionalProperties": False}},
                              "status": {"enum": ["new", "paid", "shipped"]}},
               "required": ["id", "items", "status"], "additionalProperties": False},
              '{"id": "ABC-1234", "items": [{"sku": "x-1", "qty": 2, "price": 9.5}, '
              '{"sku": "y-22", "qty": 1, "price": 120.25}], "status": "paid"}'),
    "json_object": ({"type": "object"},
                    '{"a": [1, 2, {"b": null}], "c": "some text here", "d": true}'),
}


def dump_vocab(path: str) -> None:
    sys.path.insert(0, ".")
    from zerolayer.gpu.gguf_loader import default_model_path
    from zerolayer.gpu.tokenizer import Tokenizer
    tok = Tokenizer.from_path(default_model_path())
    out = {"tokens": [tok.token_bytes(i).hex() for i in range(tok.vocab_size)],
           "special": sorted(tok.special_ids), "eos": sorted(tok.eos_ids)}
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"{tok.vocab_size} tokens -> {path}")


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.2f} ms"


def us(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e6:.0f} µs (p90 {pct(xs, 90) * 1e6:.0f})"


def bench_llguidance(vocab: dict) -> None:
    import llguidance
    import llguidance.numpy as lnp
    toks = [bytes.fromhex(t) for t in vocab["tokens"]]
    toks = [b"\xff" + t if i in set(vocab["special"]) else t for i, t in enumerate(toks)]

    class W:
        eos_token_id = vocab["eos"][0]
        bos_token_id = None
        tokens = toks
        special_token_ids = vocab["special"]

        def __call__(self, s):  # tokenization is only for the sample below
            return []
    t0 = time.perf_counter()
    lt = llguidance.LLTokenizer(llguidance.TokenizerWrapper(W()), eos_token=vocab["eos"])
    print(f"llguidance {llguidance.__version__ if hasattr(llguidance, '__version__') else ''}:"
          f" tokenizer {ms([time.perf_counter() - t0])}")
    for name, (schema, sample) in SCHEMAS.items():
        comp = []
        for _ in range(5):
            t0 = time.perf_counter()
            g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
            m = llguidance.LLMatcher(lt, g)
            assert not m.is_error(), m.get_error()
            comp.append(time.perf_counter() - t0)
        ids = lt.greedy_tokenize(sample)
        mask = lnp.allocate_token_bitmask(1, lt.vocab_size)
        steps = []
        for t in ids:
            t0 = time.perf_counter()
            lnp.fill_next_token_bitmask(m, mask, 0)
            steps.append(time.perf_counter() - t0)
            assert m.consume_token(t), (name, m.get_error())
        print(f"  {name}: compile {ms(comp)}, mask {us(steps)} over {len(ids)} tokens")


def bench_xgrammar(vocab: dict) -> None:
    import xgrammar as xgr
    toks = [bytes.fromhex(t) for t in vocab["tokens"]]
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(toks, xgr.VocabType.RAW, vocab_size=len(toks),
                             stop_token_ids=vocab["eos"])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    print(f"xgrammar: tokenizer {ms([time.perf_counter() - t0])}")
    for name, (schema, sample) in SCHEMAS.items():
        comp = []
        for _ in range(5):
            t0 = time.perf_counter()
            cg = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            comp.append(time.perf_counter() - t0)
        m = xgr.GrammarMatcher(cg)
        mask = xgr.allocate_token_bitmask(1, info.vocab_size)
        # a valid answer's tokens: the longest vocabulary match at each point
        data, ids, i = sample.encode(), [], 0
        by = {t: k for k, t in enumerate(toks) if t}
        while i < len(data):
            for j in range(min(len(data), i + 32), i, -1):
                if data[i:j] in by:
                    ids.append(by[data[i:j]])
                    i = j
                    break
            else:
                raise SystemExit(f"no token at {i}")
        steps = []
        for t in ids:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(mask, 0)
            steps.append(time.perf_counter() - t0)
            assert m.accept_token(t), (name, t)
        print(f"  {name}: compile {ms(comp)}, mask {us(steps)} over {len(ids)} tokens")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump-vocab")
    ap.add_argument("--vocab", default="/tmp/zl-vocab.json")
    ap.add_argument("--lib", default="both")
    a = ap.parse_args()
    if a.dump_vocab:
        return dump_vocab(a.dump_vocab)
    with open(a.vocab) as f:
        vocab = json.load(f)
    if a.lib in ("llguidance", "both"):
        bench_llguidance(vocab)
    if a.lib in ("xgrammar", "both"):
        bench_xgrammar(vocab)


if __name__ == "__main__":
    main()
