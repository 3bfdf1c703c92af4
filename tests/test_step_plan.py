"""gpu/cuda/step_plan.py: the bytes a fused step moves, from the model's own weights.

The plan is what the GPU check divides by each stage's device time, so its weight bytes must
be the bytes the kernel reads: every layer's quantized bytes, scales and offsets (or float32
rows), once per token tile. Checked here against the loaded arrays of a tiny GGUF in several
formats, with no CUDA involved.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from tiny_gguf import write_tiny_llama
from zerolayer.gpu.cuda import step_plan
from zerolayer.gpu.gguf_loader import load_weights, open_gguf, read_config

SHAPES = dict(n_layer=3, d=64, ff=128, n_head=4, n_kv=2, hd=16, vocab=200, ctx=256)


def _model(tmp_path):
    path = str(tmp_path / "m.gguf")
    write_tiny_llama(path, config=SHAPES, tied=True, override={
        "attn_q": QT.Q4_1, "attn_k": QT.Q4_1, "attn_v": QT.Q4_1, "attn_output": QT.F16,
        "ffn_gate": QT.Q8_0, "ffn_up": QT.Q8_0, "ffn_down": QT.Q4_0})
    reader = open_gguf(path)
    cfg = read_config(reader)
    return cfg, load_weights(reader, cfg)


def _nbytes(wt) -> int:
    return sum(int(a.nbytes) for a in (wt.qs, wt.d, wt.m, wt.w))


def test_a_decode_step_reads_every_weight_once(tmp_path):
    cfg, w = _model(tmp_path)
    stages = step_plan.plan(cfg, w, tokens=1, context=10)
    assert len(stages) == 2 + 5 * cfg.n_layer
    layers = sum(_nbytes(x) for x in (w.wqkv, w.wo, w.wgu, w.wdown))
    assert sum(s.weight_bytes for s in stages) == layers + _nbytes(w.output)
    assert all(s.items >= 1 for s in stages)


def test_token_tiles_reread_the_weights_and_attention_grows_with_context(tmp_path):
    cfg, w = _model(tmp_path)
    one = step_plan.plan(cfg, w, tokens=1, context=10)
    eight = step_plan.plan(cfg, w, tokens=8, context=10)
    # 8 tokens are 2 tiles of 4: each layer weight twice, the LM head twice (8 rows)
    assert sum(s.weight_bytes for s in eight) == 2 * sum(s.weight_bytes for s in one)
    att = [s for s in one if s.name.endswith("attention")]
    longer = [s for s in step_plan.plan(cfg, w, tokens=1, context=100) if s.name.endswith("attention")]
    kv_row = 2 * cfg.n_kv * cfg.head_dim * 4
    assert longer[0].other_bytes - att[0].other_bytes == 90 * kv_row


def test_a_prefill_wants_one_logit_row(tmp_path):
    cfg, w = _model(tmp_path)
    head = step_plan.plan(cfg, w, tokens=16, context=0, prefill=True)[-1]
    assert head.weight_bytes == _nbytes(w.output)
    assert np.isclose(head.other_bytes, (cfg.d_model + cfg.vocab) * 4)
