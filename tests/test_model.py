"""The compiled forward pass against the float64 reference, on a tiny model and the real one."""
from __future__ import annotations

import numpy as np
import pytest

from zerolayer.gpu import gguf_loader
from zerolayer.gpu.errors import ContextOverflowError
from zerolayer.gpu.model import KERNEL_CLASSES, LlamaModel, StepInput
from zerolayer.gpu.ops import cpu_features, int8_matmul
from zerolayer.gpu.ops.int8_matmul import kernel_set
from zerolayer.gpu.reference import ReferenceLlama

REL_TOL = 1e-3  # max |ours - ref| / max |ref|, per step (the GPU check's forward tolerance too)


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


def _compare(path: str, prompt: list[int], steps: int = 16, isa: int = 0,
             kv=np.float32) -> list[float]:
    """Per-step relative logit errors; the float kernels unless isa says otherwise (the int8
    kernels quantize activations: tests/test_int8_matmul.py bounds them), and a float32 KV
    cache unless kv says otherwise (np.uint16: the default float16 cache)."""
    with kernel_set(isa):
        model = LlamaModel.load(path, max_seq_len=256, use_cache=False, kv_dtype=kv)
    ref = ReferenceLlama(model.reader, model.cfg)
    seq = model.new_sequence()
    logits = model.step([StepInput(seq, np.array(prompt, np.int32))])[0]  # batched prefill
    for t in prompt:
        ref_logits = ref.step(t)
    errs = [_rel(logits, ref_logits)]
    for _ in range(steps):
        tok = int(np.argmax(ref_logits))
        logits = model.step([StepInput(seq, np.array([tok], np.int32))])[0]
        ref_logits = ref.step(tok)
        errs.append(_rel(logits, ref_logits))
    return errs


@pytest.mark.parametrize("prompt_len", [3, 20])  # 20 takes the dequantize-to-tile prefill path
def test_tiny_model_matches_float64_reference(tiny_path, prompt_len):
    prompt = list(np.random.default_rng(prompt_len).integers(0, 200, prompt_len))
    errs = _compare(tiny_path, prompt)
    assert max(errs) < REL_TOL, errs


@pytest.mark.parametrize("kv", [np.float32, np.uint16], ids=["f32-kv", "f16-kv"])
def test_real_model_matches_float64_reference(model_path, generator, kv):
    """Also with the default float16 KV cache: the real model's keys and values rounded to 11
    bits stay within the bound (measured 4e-4; the tiny model's random weights, whose
    activations are far larger, are checked with the float32 cache)."""
    prompt = generator.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 2)
    errs = _compare(model_path, prompt, kv=kv)
    print("max relative logit error per step:", ["%.1e" % e for e in errs])
    assert len(errs) == 17 and max(errs) < REL_TOL, errs


def test_batched_decode_equals_separate_sequences(tiny_path):
    """N sequences at different positions in one step give each one's own logits."""
    model = LlamaModel.load(tiny_path)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 200, n).astype(np.int32) for n in (5, 70, 17)]  # 70: two KV blocks
    nxt = [rng.integers(0, 200, 4).astype(np.int32) for _ in prompts]
    alone = []
    for p, n in zip(prompts, nxt):
        s = model.new_sequence()
        model.step([StepInput(s, p)])
        alone.append([model.step([StepInput(s, n[i:i + 1])])[0] for i in range(len(n))])
        s.release()
    seqs = [model.new_sequence() for _ in prompts]
    model.step([StepInput(s, p) for s, p in zip(seqs, prompts)])  # mixed-length prefill
    for i in range(4):
        out = model.step([StepInput(s, n[i:i + 1]) for s, n in zip(seqs, nxt)])
        for j in range(len(prompts)):
            np.testing.assert_allclose(out[j], alone[j][i], rtol=0, atol=1e-4 * np.abs(alone[j][i]).max())


def test_a_timed_step_is_the_same_step_with_each_kernel_class_timed(tiny_path):
    """The forward's timing hook (benchmarks' per-kernel table) changes no result, and every
    kernel class of the step is counted."""
    model = LlamaModel.load(tiny_path)
    prompt = np.arange(1, 40, dtype=np.int32)
    plain, timed = model.new_sequence(), model.new_sequence()
    want = model.step([StepInput(plain, prompt)])
    ticks = np.zeros(len(KERNEL_CLASSES), np.int64)
    got = model.step([StepInput(timed, prompt)], ticks=ticks)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
    assert (ticks > 0).all(), dict(zip(KERNEL_CLASSES, ticks.tolist()))
    again = ticks.copy()
    model.step([StepInput(timed, prompt[:1])], ticks=ticks)       # it accumulates
    assert (ticks > again).all()


def test_context_overflow_is_a_typed_error(tiny_path):
    model = LlamaModel.load(tiny_path, max_seq_len=64)
    s = model.new_sequence()
    model.step([StepInput(s, np.zeros(60, np.int32))])
    with pytest.raises(ContextOverflowError) as e:
        model.step([StepInput(s, np.zeros(5, np.int32))])
    assert e.value.needed == 65 and e.value.limit == 64
    assert s.length == 60  # nothing was written
    logits = model.step([StepInput(s, np.zeros(4, np.int32))])  # still usable up to the limit
    assert np.isfinite(logits).all()


def test_released_blocks_are_reused(tiny_path):
    model = LlamaModel.load(tiny_path, max_seq_len=128, kv_blocks=4)
    for _ in range(10):  # more sequences than the arena could hold at once
        s = model.new_sequence()
        model.step([StepInput(s, np.arange(100, dtype=np.int32) % 200)])
        s.release()
    assert model.arena.free_blocks == 4


def test_config_from_gguf(model_path):
    cfg = gguf_loader.read_config(gguf_loader.open_gguf(model_path))
    shape = (cfg.n_layer, cfg.d_model, cfg.n_ff, cfg.n_head, cfg.n_kv, cfg.head_dim)
    assert shape == (30, 576, 1536, 9, 3, 64)
    assert cfg.rope_base == 100000.0 and cfg.vocab == 49152


def test_repacked_model_cache_round_trip(tmp_path, tiny_path):
    import os
    import shutil
    p = str(tmp_path / "m.gguf")
    shutil.copy(tiny_path, p)
    fresh = LlamaModel.load(p, use_cache=False)
    first = LlamaModel.load(p)    # builds the cache
    cached = LlamaModel.load(p)   # reads it
    assert cached.tokenizer_meta == fresh.tokenizer_meta == first.tokenizer_meta
    assert cached.cfg == fresh.cfg
    logits = []
    for m in (fresh, cached):
        s = m.new_sequence()
        logits.append(m.step([StepInput(s, np.arange(20, dtype=np.int32))]))
    np.testing.assert_array_equal(logits[0], logits[1])
    from zerolayer.gpu import model_cache
    d = model_cache.cache_dir(p)
    os.utime(p, ns=(0, 0))        # a changed file gets a new key: never stale
    assert model_cache.cache_dir(p) != d and model_cache.load(p) is None
    LlamaModel.load(p)            # the new version's cache replaces the old one
    assert not os.path.exists(d) and model_cache.load(p) is not None


@pytest.mark.skipif(not int8_matmul.ISAS, reason="no int8 kernel set on this CPU")
def test_int8_layout_cache_round_trip(tmp_path, tiny_path):
    """The int8 kernels' weights (packed bits, float16 scales) are cached beside the model
    once per kernel set, then memory-mapped: the same logits as a fresh re-pack."""
    import shutil

    from zerolayer.gpu import model_cache
    p = str(tmp_path / "m.gguf")
    shutil.copy(tiny_path, p)
    out = []
    with kernel_set(int8_matmul.ISAS[0]):
        key = cpu_features.layout_key()
        fresh = LlamaModel.load(p, use_cache=False)
        assert model_cache.load_prepared(p, key) is None
        LlamaModel.load(p)                              # re-packs and saves
        cached = model_cache.load_prepared(p, key)
        assert cached is not None and set(cached) == set(int8_matmul.MATMUL_WEIGHTS)
        model = LlamaModel.load(p)                      # maps the saved layout
        assert all(isinstance(w.qs, np.memmap) or w.qs.size == 0 for w in model.prepared.values())
        for m in (fresh, model):
            s = m.new_sequence()
            out.append(m.step([StepInput(s, np.arange(20, dtype=np.int32))]))
    np.testing.assert_array_equal(out[0], out[1])
    for k, w in cached.items():
        assert w.fmt == fresh.prepared[k].fmt and np.array_equal(w.qs, fresh.prepared[k].qs)
    with kernel_set(0):                                 # the float kernels: nothing of it
        assert all(not int8_matmul.is_int8(w.fmt) for w in LlamaModel.load(p).prepared.values())
