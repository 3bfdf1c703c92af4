"""Each kernel against its float64 reference, on fresh random inputs.

Tolerances are relative to the largest reference value: float32 accumulation over at most a
few thousand terms stays well under 1e-5; attention and sampling under 1e-5 / 1e-9.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from numba import njit

from zerolayer.gpu import quant
from zerolayer.gpu.ops.attention import BLOCK_TOKENS, attention, attention_ref, kv_write
from zerolayer.gpu.ops.embedding import embed, embed_ref
from zerolayer.gpu.ops.exp_f32 import exp_f32
from zerolayer.gpu.ops.half import from_half_bits, half_bits
from zerolayer.gpu.ops.matmul import matmul, matmul_ref
from zerolayer.gpu.ops.rmsnorm import rmsnorm, rmsnorm_ref
from zerolayer.gpu.ops.rope import rope, rope_ref, rope_tables
from zerolayer.gpu.ops.sampling import filtered_distribution, sample, sample_probs_ref
from zerolayer.gpu.ops.swiglu import swiglu, swiglu_ref

rng = np.random.default_rng()  # fresh inputs every run; failures print the values
TOL = 1e-5


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def _weight(qt, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    # as GGUFReader hands them over: bytes for quantized types, float arrays for F16/F32
    raw = gguf.quants.quantize(w, qt) if qt not in (QT.F32, QT.F16) else w.astype(
        np.float16 if qt == QT.F16 else np.float32)
    dense = gguf.quants.dequantize(raw, qt).astype(np.float64).reshape(rows, cols)
    return quant.stack([quant.repack(raw, rows, cols, qt)]), dense


@pytest.mark.parametrize("qt", [QT.Q4_1, QT.Q4_0, QT.Q8_0, QT.F16, QT.F32])
@pytest.mark.parametrize("rows,cols", [(192, 576), (100, 64), (37, 96)])  # 100: a padded row group
@pytest.mark.parametrize("T", [1, 3, 8, 21, 37])  # 1: decode; 3, 8, 21: batched; 37: tile prefill path
def test_matmul(qt, rows, cols, T):
    wt, dense = _weight(qt, rows, cols)
    x = rng.standard_normal((T, cols)).astype(np.float32)
    y = np.full((T, rows), np.nan, np.float32)
    matmul(*wt.layer(0), x, y)
    assert rel(y, matmul_ref(dense, x)) < TOL


def test_repack_is_exact():
    """Every weight the kernels see equals gguf's own dequantization of the file bytes."""
    for qt in (QT.Q4_1, QT.Q4_0, QT.Q8_0, QT.F16):
        w = rng.standard_normal((70, 96)).astype(np.float32)
        raw = gguf.quants.quantize(w, qt) if qt != QT.F16 else w.astype(np.float16)
        fmt, a = quant.repack(raw, 70, 96, qt)
        np.testing.assert_array_equal(quant.dequantize(fmt, a, np.float64),
                                      gguf.quants.dequantize(raw, qt).astype(np.float64).reshape(70, 96))


@pytest.mark.parametrize("qt", [QT.Q8_0, QT.Q4_1, QT.F32])
def test_embedding(qt):
    wt, dense = _weight(qt, 130, 64)
    tokens = rng.integers(0, 130, 7).astype(np.int32)
    x = np.empty((7, 64), np.float32)
    embed(*wt.layer(0), tokens, x)
    assert rel(x, embed_ref(dense, tokens)) < TOL


def test_rmsnorm():
    x = rng.standard_normal((5, 576)).astype(np.float32) * 3
    w = rng.standard_normal(576).astype(np.float32)
    y = np.empty_like(x)
    rmsnorm(x, w, np.float32(1e-5), y)
    assert rel(y, rmsnorm_ref(x, w, 1e-5)) < TOL


def test_rope_rotates_adjacent_pairs():
    n_heads, hd, base = 12, 64, 100000.0
    pos = rng.integers(0, 4000, 6).astype(np.int32)
    x = rng.standard_normal((6, 8 + n_heads * hd)).astype(np.float32)
    cos, sin = rope_tables(4096, hd, base)
    ref = rope_ref(x[:, 8:], pos, n_heads, hd, base)
    rope(x, 8, pos, cos, sin, n_heads, hd)
    assert rel(x[:, 8:], ref) < TOL


def test_swiglu():
    gu = rng.standard_normal((4, 2 * 96)).astype(np.float32) * 4
    h = np.empty((4, 96), np.float32)
    swiglu(gu, h)
    assert rel(h, swiglu_ref(gu[:, :96], gu[:, 96:])) < TOL


@njit(fastmath=True, cache=True)
def _exp_loop(x, out):
    """exp_f32 as the kernels call it: in a fastmath loop (its own float semantics must hold)."""
    for i in range(x.shape[0]):
        out[i] = exp_f32(x[i])


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def test_exp_f32_against_float64():
    x = np.concatenate([np.linspace(-20, 20, 200_001), np.linspace(-87, 88, 200_001)])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    _exp_loop(x, out)
    ref = np.exp(x.astype(np.float64)).astype(np.float32)
    u = _ulps(out, ref)
    assert u[:200_001].max() <= 1
    assert u.max() <= 4
    # the softmax's finite "minus infinity" and SiLU's large |g| stay finite and ordered
    edge = np.array([-1e30, -200.0, -87.4, 0.0, 88.5, 1e30], np.float32)
    e = np.empty_like(edge)
    _exp_loop(edge, e)
    assert e[0] == e[1] == e[2] == 0.0 and e[3] == 1.0
    assert np.isfinite(e).all() and e[4] == e[5] > 1e38


@pytest.mark.parametrize("pool", [np.float32, np.uint16], ids=["f32", "f16"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("n_head,n_kv,hd", [(9, 3, 64), (8, 1, 128), (6, 6, 64), (10, 2, 32)],
                         ids=["gqa3-hd64", "gqa8-hd128", "mha-hd64", "gqa5-hd32-plain"])
def test_paged_attention_mixed_prefill_and_decode(splits, pool, n_head, n_kv, hd):
    """Three sequences in one call: a prefill chunk, and two decodes at other positions,
    with non-contiguous KV blocks; over float32 pools and over float16 ones (uint16 bits, the
    CPU model's cache), whose reference sees the keys and values rounded to float16. Head
    dims 64 and 128 run the register-blocked block kernels (GQA groups of 3, of 8: more
    heads than one call takes, and 1), 32 the plain loops."""
    L, layer = 2, 1
    lengths = [70, 1, 150]   # tokens written so far, per sequence (prefill starts at 0)
    new = [70, 1, 1]         # the new tokens of this step: seq 0 prefills 70 positions
    n_blocks = 12
    k_pool = np.zeros((n_blocks, L, n_kv, hd, BLOCK_TOKENS), pool)
    v_pool = np.zeros((n_blocks, L, n_kv, BLOCK_TOKENS, hd), pool)
    stored = (lambda a: a) if pool == np.float32 else (lambda a: from_half_bits(half_bits(a)))
    perm = rng.permutation(n_blocks).astype(np.int32)
    tables = np.stack([perm[0:3], perm[3:6], perm[6:9]])
    # history of sequences 1 and 2 (all but their last position) via kv_write too
    hist = {}
    for s, n in enumerate(lengths):
        k = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
        v = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
        hist[s] = (k, v)
        if n - new[s] > 0:
            prev = np.zeros((n - new[s], (n_head + 2 * n_kv) * hd), np.float32)
            prev[:, n_head * hd:(n_head + n_kv) * hd] = k[:n - new[s]]
            prev[:, (n_head + n_kv) * hd:] = v[:n - new[s]]
            kv_write(prev, k_pool, v_pool, layer, np.full(n - new[s], s, np.int32),
                     np.arange(n - new[s], dtype=np.int32), tables, n_head, n_kv, hd)
    rows, tok_seq, tok_pos = [], [], []
    for s, n in enumerate(lengths):
        for p in range(n - new[s], n):
            q = rng.standard_normal(n_head * hd).astype(np.float32)
            rows.append(np.concatenate([q, hist[s][0][p], hist[s][1][p]]))
            tok_seq.append(s)
            tok_pos.append(p)
    qkv = np.stack(rows).astype(np.float32)
    tok_seq = np.array(tok_seq, np.int32)
    tok_pos = np.array(tok_pos, np.int32)
    kv_write(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, tables, n_head, n_kv, hd)
    k_last = k_pool[tables[2, 2], layer, :, :, 150 - 1 - 2 * BLOCK_TOKENS]  # seq 2's new key
    want = hist[2][0][149].reshape(n_kv, hd)
    assert np.array_equal(k_last, want if pool == np.float32 else half_bits(want))
    out = np.full((len(rows), n_head * hd), np.nan, np.float32)
    attention(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, tables, n_head, n_kv, hd, splits, out)
    i = 0
    for s in range(len(lengths)):
        q = qkv[i:i + new[s], :n_head * hd]
        ref = attention_ref(q, stored(hist[s][0]), stored(hist[s][1]), n_head, n_kv)
        assert rel(out[i:i + new[s]], ref) < TOL, s
        i += new[s]


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 40, 1.0), (0.8, 0, 0.9),
                                                     (1.3, 50, 0.5), (0.5, 0, 0.999)])
def test_sampling_distribution_matches_reference(temperature, top_k, top_p):
    logits = (rng.standard_normal(5000) * 3).astype(np.float32)
    ref = sample_probs_ref(logits, temperature, top_k, top_p)
    ids, p = filtered_distribution(logits, temperature, top_k, top_p)
    ours = np.zeros_like(ref)
    ours[ids] = p
    assert np.abs(ours - ref).max() < 1e-9
    cdf = np.cumsum(ref)  # the draw: inverse CDF in ascending token id (as on the device)
    for u in rng.random(50):
        tok = sample(logits, temperature, top_k, top_p, u)
        assert ref[tok] > 0
        assert tok == min(int(np.searchsorted(cdf, u, side="right")), int(np.flatnonzero(ref)[-1]))


def test_greedy_is_argmax():
    logits = rng.standard_normal(1000).astype(np.float32)
    assert sample(logits, 0.0, 0, 1.0, 0.5) == int(np.argmax(logits))
    assert sample(logits, 0.9, 1, 1.0, 0.99) == int(np.argmax(logits))
