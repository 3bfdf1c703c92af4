"""gpu/ops/attention_block.py's register-blocked kernels against float64, for both vector
widths this CPU runs (AVX2's 8 floats and, where it has AVX-512, 16), every head count a call
takes, float16 and float32 blocks, and partial last blocks. The attention that uses them is
tested in tests/test_ops.py (with the host's width only)."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from zerolayer.gpu.ops import attention_block as ab
from zerolayer.gpu.ops import cpu_features
from zerolayer.gpu.ops.half import from_half_bits, half_bits

WIDTHS = [8] + ([16] if "avx512f" in cpu_features.host_features() else [])
_CALLERS = {}


def _callers(V):
    """njit wrappers around kernels(V) (an intrinsic is only callable from compiled code)."""
    if V not in _CALLERS:
        scores, pv = ab.kernels(V)

        @njit
        def call_scores(gc, hd, kpool, koff, q, qoff, sc, soff):
            scores(gc, hd, kpool, koff, q, qoff, sc, soff)

        @njit
        def call_pv(gc, ns, vpool, voff, hd, p, poff, o, ooff):
            pv(gc, ns, vpool, voff, hd, p, poff, o, ooff)

        _CALLERS[V] = call_scores, call_pv
    return _CALLERS[V]


def _pool(a, f16):
    """A block as the pools hold it, and the float64 values the kernels see."""
    if f16:
        bits = half_bits(a)
        return bits, from_half_bits(bits).astype(np.float64)
    a = a.astype(np.float32)
    return a, a.astype(np.float64)


@pytest.mark.parametrize("V", WIDTHS)
@pytest.mark.parametrize("f16", [False, True], ids=["f32", "f16"])
@pytest.mark.parametrize("hd", [64, 128])
def test_block_scores(V, f16, hd):
    rng = np.random.default_rng(V * 1000 + hd + f16)
    call_scores, _ = _callers(V)
    nblk = 3
    kpool, k64 = _pool(rng.standard_normal((nblk, hd, ab.POS)), f16)
    for gc in range(1, ab.group_max(V) + 1):
        for blk in (0, 2):
            q = rng.standard_normal((gc + 1, hd)).astype(np.float32)  # row 0 unused: qoff
            sc = np.full((gc + 2, ab.POS), np.nan, np.float32)
            call_scores(gc, hd, kpool, blk * hd * ab.POS, q, hd, sc, ab.POS)
            want = q[1:].astype(np.float64) @ k64[blk]
            np.testing.assert_allclose(sc[1:gc + 1], want, rtol=1e-5, atol=1e-4)
            assert np.isnan(sc[0]).all() and np.isnan(sc[gc + 1]).all()  # nothing else written


@pytest.mark.parametrize("V", WIDTHS)
@pytest.mark.parametrize("f16", [False, True], ids=["f32", "f16"])
@pytest.mark.parametrize("hd", [64, 128])
def test_block_pv(V, f16, hd):
    rng = np.random.default_rng(V * 1000 + hd + f16 + 7)
    _, call_pv = _callers(V)
    vpool, v64 = _pool(rng.standard_normal((2, ab.POS, hd)), f16)
    for gc in range(1, ab.group_max(V) + 1):
        for ns in (1, 37, ab.POS):
            for d0 in range(0, hd, ab.DIMS):
                p = rng.random((gc, ab.POS)).astype(np.float32)
                o = rng.standard_normal((gc, hd)).astype(np.float32)
                o0 = o.copy()
                vp = vpool.copy()  # positions at and past ns must never count (a stale
                vp[1, ns:] = 0x7E00 if f16 else np.nan  # tail of a reused block): NaN there
                call_pv(gc, ns, vp, ab.POS * hd + d0, hd, p, 0, o, d0)
                want = o0.astype(np.float64)
                want[:, d0:d0 + ab.DIMS] += p[:, :ns].astype(np.float64) @ v64[1, :ns, d0:d0 + ab.DIMS]
                np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-4)
                assert np.array_equal(o[:, :d0], o0[:, :d0])
                assert np.array_equal(o[:, d0 + ab.DIMS:], o0[:, d0 + ab.DIMS:])


def test_host_width_is_what_attention_uses():
    assert ab.V == (16 if "avx512f" in cpu_features.host_features() else 8)
    assert ab.GMAX == ab.group_max(ab.V) == (4 if ab.V == 16 else 2)
