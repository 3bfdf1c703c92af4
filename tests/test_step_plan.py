"""gpu/cuda/step_plan.py: the bytes a fused step moves, from the model's own weights.

The plan is what the GPU check divides by each stage's device time, so its weight bytes must
be the bytes the kernel reads: every layer's quantized bytes, scales and offsets (or float32
rows), once per token tile; the scales at the type the kernel reads them as (float16 where
the file's own are, float32 for the K-quants). Checked here against the loaded arrays of a
tiny GGUF in several formats, with no CUDA involved.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from test_quant_formats import gguf_weight
from tiny_gguf import write_tiny_llama
from zerolayer.gpu import quant
from zerolayer.gpu.cuda import step_plan
from zerolayer.gpu.cuda.step_geometry import scale_type
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
    """The weight's bytes with its scales as float16 (this model's formats all have them)."""
    return int(wt.qs.nbytes + wt.w.nbytes + (wt.d.size + wt.m.size) * 2)


@pytest.mark.parametrize("qt,scales", [(QT.Q4_0, np.float16), (QT.Q4_1, np.float16),
                                       (QT.Q8_0, np.float16), (QT.Q5_1, np.float16),
                                       (QT.Q4_K, np.float32), (QT.Q6_K, np.float32)],
                         ids=lambda v: getattr(v, "name", getattr(v, "__name__", "")))
def test_the_kernel_reads_the_files_own_f16_scales_as_float16(qt, scales):
    """The types whose (d, m) are the file's f16 values (or exact multiples of them) are read
    as float16, every value unchanged; the K-quants' d_sb * sc products keep float32; one
    weight of float32 scales makes the whole model's kernel float32."""
    rng = np.random.default_rng(int(qt))
    rows, cols = 2 * quant.LANES, 512
    wt = quant.stack([quant.repack(gguf_weight(qt, rows, cols, rng), rows, cols, qt)])
    assert scale_type([wt]) is scales
    if scales is np.float16:
        assert np.array_equal(wt.d.astype(np.float16).astype(np.float32), wt.d)
        f32 = quant.stack([quant.repack(gguf_weight(QT.F32, rows, cols, rng), rows, cols, QT.F32)])
        k = quant.stack([quant.repack(gguf_weight(QT.Q4_K, rows, cols, rng), rows, cols, QT.Q4_K)])
        assert scale_type([wt, f32]) is np.float16 and scale_type([wt, k]) is np.float32


def test_a_scale_past_float16s_range_keeps_float32():
    assert quant.f16_exact(np.array([1.5, -65504.0], np.float32))
    assert not quant.f16_exact(np.array([1.5, 70000.0], np.float32))
    assert not quant.f16_exact(np.array([1.0 + 2.0 ** -12], np.float32))


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


# ------------------------------------------------------------ the model's prediction

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from zerolayer.gpu.cuda import step_shapes  # noqa: E402
from zerolayer.gpu.cuda.step_geometry import KERNEL, Geometry  # noqa: E402

DEVICES = [step_plan.H100_SXM, step_plan.H200]
MODELS = sorted(step_shapes.SHAPES)
WEIGHT_STAGES = ("A qkv+rope+kv", "C o-proj+residual", "D gate|up+swiglu", "E down+residual",
                 "lm head+argmax")


def _kind(name: str) -> str:
    return name.split(".", 1)[-1] if name.startswith("L") else name


def test_the_synthetic_shapes_have_the_bundled_files_bytes():
    """SmolLM2-135M's shapes in the bundled file's formats: the 98.2 MB a decode step reads
    with float16 scales (docs/BENCHMARKS.md), and Llama-3.2-1B's stages in its own shapes."""
    cfg, w = step_shapes.synthetic("smollm2-135m")
    stages = step_plan.plan(cfg, w, tokens=1, context=128)
    assert round(sum(s.weight_bytes for s in stages) / 1e6, 1) == 98.2
    cfg, w = step_shapes.synthetic("llama-3.2-1b")
    stages = step_plan.plan(cfg, w, tokens=1, context=128)
    assert len(stages) == 2 + 5 * 16
    # 3072 Q|K|V rows: 192 items of 16 rows, K (64 blocks) split in 2 for >= 264 items
    assert (stages[1].items, stages[1].k_splits) == (384, 2)


def _two_per_sm(g: Geometry, dev, model: str, context: int) -> list[str]:
    """The stages of a batch-1 decode step with fewer than 2 work items per SM; attention,
    whose work is the KV blocks of the context, only where it has fewer than two items per
    SM while it could have (one KV block of one KV head an item)."""
    cfg, w = step_shapes.synthetic(model)
    short: dict[str, str] = {}
    for s in step_plan.plan(cfg, w, 1, context, sms=dev.sms, geometry=g):
        need = 2 * dev.sms
        if s.kind == "attention":
            need = min(need, cfg.n_kv * -(-(context + 1) // step_plan.BLOCK_TOKENS))
        if s.kind != "embed" and s.items < need:
            short[_kind(s.name)] = f"{s.items} items < {need}"
    return [f"{k}: {v}" for k, v in short.items()]


@pytest.mark.parametrize("model", MODELS)
def test_a_geometry_exists_that_gives_every_stage_two_items_per_sm(model):
    """The rule below is reachable: the proposed cut (step_shapes.PROPOSED) meets it on both
    devices, at a short and a long context."""
    for dev in DEVICES:
        for context in (128, 4096):
            assert _two_per_sm(step_shapes.PROPOSED, dev, model, context) == [], (dev, context)


@pytest.mark.parametrize("model", MODELS)
def test_the_kernel_gives_every_stage_two_items_per_sm_at_batch_1(model):
    short = {(d.name, c): _two_per_sm(KERNEL, d, model, c) for d in DEVICES for c in (128, 4096)}
    assert not any(short.values()), short


def test_the_kernel_has_at_most_3_grid_syncs_per_layer():
    assert KERNEL.grid_syncs_per_layer <= 3


def test_the_kernel_syncs_after_the_stages_its_geometry_says():
    """The count the prediction charges: one barrier after the embedding and after each
    stage of a layer that barrier_after marks (step_kernel.step reads the same tuple); the
    other boundaries are ready-counter waits, charged apart."""
    assert len(KERNEL.barrier_after) == KERNEL.stages_per_layer
    assert sum(KERNEL.barrier_after) == KERNEL.grid_syncs_per_layer
    assert step_plan.grid_syncs(30) == 1 + KERNEL.grid_syncs_per_layer * 30
    assert step_plan.counter_waits(30) == (KERNEL.stages_per_layer - KERNEL.grid_syncs_per_layer) * 30
    # the stages a reader may overlap: attention after Q|K|V, down after gate|up; never the
    # full-row readers (gate|up and the next layer's Q|K|V need all of x)
    assert KERNEL.barrier_after[2] and KERNEL.barrier_after[4]


@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.name)
def test_no_stage_is_predicted_faster_than_its_bytes_at_hbm_bandwidth(dev):
    for model in MODELS:
        cfg, w = step_shapes.synthetic(model)
        p = step_plan.predict(cfg, w, 1, 128, dev)
        for s, t in p.stages:
            assert t >= s.weight_bytes / dev.hbm_bytes_s, (model, s.name)
        assert p.total_s > sum(s.bytes for s, _ in p.stages) / dev.hbm_bytes_s


def test_split_k_takes_just_enough_slices_for_two_items_per_sm():
    """Every matmul stage of a batch-1 step: K slices only while its (tile, row group) items
    are fewer than 2 per SM, and no more slices than that needs (each costs a reduction)."""
    for model in MODELS:
        cfg, w = step_shapes.synthetic(model)
        target = KERNEL.matmul_items_per_sm * 132
        for s in step_plan.plan(cfg, w, 1, 128, sms=132):
            if s.kind != "matmul":
                continue
            row_items = s.items // s.k_splits
            assert 1 <= s.k_splits <= KERNEL.k_splits, s
            assert s.k_splits == 1 or (s.k_splits - 1) * row_items < target, s
    cfg, w = step_shapes.synthetic("smollm2-135m")
    head = step_plan.plan(cfg, w, 1, 128, sms=132)[-1]
    assert head.k_splits == 1 and head.items == 49152 // KERNEL.rows_per_item


def test_more_bytes_in_flight_more_items_and_fewer_barriers_predict_less_time():
    cfg, w = step_shapes.synthetic("smollm2-135m")
    dev = step_plan.H100_SXM

    def total(g):
        return step_plan.predict(cfg, w, 1, 128, dev, g).total_s
    base = total(KERNEL)
    assert total(replace(KERNEL, loads_in_flight=4)) < base      # 4x the bytes in flight
    assert total(replace(KERNEL, prefetch_bytes=0)) > base       # nothing warmed in L2
    assert total(replace(KERNEL, rows_per_item=64, k_splits=1)) > base  # a 4th of the items
    assert total(replace(KERNEL, grid_syncs_per_layer=5, barrier_after=(True,) * 5)) > base
    # and a faster memory never predicts a slower step
    assert (step_plan.predict(cfg, w, 1, 128, step_plan.H200).total_s
            <= step_plan.predict(cfg, w, 1, 128, dev).total_s)


def test_the_printout_says_it_is_a_model(capsys):
    step_plan.main(["--shapes", "llama-3.2-1b", "--device", "h200"])
    out = capsys.readouterr().out
    assert "a model, not a measurement" in out and "H200" in out
    assert "| **step** |" in out and out.count("\n| ") >= 9


def test_the_stages_after_a_grid_barrier_are_the_ones_the_kernel_warms():
    """step_kernel warms L2 before each grid barrier with the next matmul stage's first
    items: A (after the embedding and each E), C, D and the LM head; B and E follow ready
    counters."""
    cfg, w = step_shapes.synthetic("smollm2-135m")
    stages = step_plan.plan(cfg, w, 1, 128)
    warmed = {_kind(s.name) for s in stages if s.after_barrier}
    assert warmed == {"A qkv+rope+kv", "C o-proj+residual", "D gate|up+swiglu",
                      "lm head+argmax"}, warmed
    assert all(s.after_barrier for s in stages if _kind(s.name) == "A qkv+rope+kv")
