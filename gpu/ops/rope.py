"""Rotary position embedding in llama.cpp's convention for GGUF Llama weights.

llama.cpp's converter permutes the rows of Q and K of a `llama` model so that the rotation
applies to *adjacent* pairs (2i, 2i+1) of each head, with angle pos * base^(-2i / head_dim)
(ggml's 'normal' mode). We keep the file's weights as they are and rotate adjacent pairs.

Other architectures (`qwen2`) are converted without that permutation and rotate the two
*halves* of a head: pairs (i, i + head_dim/2) (ggml's 'neox' mode). The loader turns them
into the first kind by permuting the rows of Wq and Wk (and their biases) within each head
(gguf_loader.neox_pair_order): a row permutation is exact for every weight format, q.k is the same
sum in another order, so one kernel serves both.

The angle of pair i at position p, as ggml_rope_ext computes it without YaRN:

    theta = p * freq_scale * base^(-2i / head_dim) / freq_factors[i]

cos and sin scaled by attn_factor. freq_scale is 1 / `rope.scaling.factor` (linear
scaling), freq_factors the tensor `rope_freqs.weight` (Llama 3.1's per-dimension divisors),
attn_factor `rope.scaling.attn_factor`; all 1 by default. They only change the tables.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit


def rope_angles(max_pos: int, head_dim: int, base: float, freq_scale: float = 1.0,
                freq_factors: npt.NDArray[np.float32] | None = None) -> npt.NDArray[np.float64]:
    """theta [max_pos, head_dim/2] in float64."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if freq_factors is not None and len(freq_factors):
        inv = inv / np.asarray(freq_factors, np.float64)
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv[None, :]
    if freq_scale != 1.0:
        ang = ang * freq_scale
    return ang


def rope_tables(max_pos: int, head_dim: int, base: float, freq_scale: float = 1.0,
                freq_factors: npt.NDArray[np.float32] | None = None,
                attn_factor: float = 1.0) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """cos/sin [max_pos, head_dim/2], computed in float64 and stored as float32."""
    ang = rope_angles(max_pos, head_dim, base, freq_scale, freq_factors)
    c, s = np.cos(ang), np.sin(ang)
    if attn_factor != 1.0:
        c, s = c * attn_factor, s * attn_factor
    return c.astype(np.float32), s.astype(np.float32)


@njit(fastmath=True, cache=True, nogil=True)
def rope(x, col0, pos, cos, sin, n_heads, head_dim):
    """In place on the n_heads heads of x[T, :] starting at column col0; token t at pos[t]."""
    half = head_dim // 2
    for t in range(x.shape[0]):
        p = pos[t]
        for h in range(n_heads):
            o = col0 + h * head_dim
            for i in range(half):
                c = cos[p, i]
                s = sin[p, i]
                a = x[t, o + 2 * i]
                b = x[t, o + 2 * i + 1]
                x[t, o + 2 * i] = a * c - b * s
                x[t, o + 2 * i + 1] = a * s + b * c


def rope_ref(x: npt.ArrayLike, pos: npt.NDArray[np.int32], n_heads: int,
             head_dim: int, base: float, *, neox: bool = False, freq_scale: float = 1.0,
             freq_factors: npt.NDArray[np.float32] | None = None,
             attn_factor: float = 1.0) -> npt.NDArray[np.float64]:
    """float64 rotation of x [T, n_heads*head_dim]: adjacent pairs, or halves with neox."""
    T = len(pos)
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if freq_factors is not None and len(freq_factors):
        inv = inv / np.asarray(freq_factors, np.float64)
    ang = np.asarray(pos, np.float64)[:, None, None] * freq_scale * inv[None, None, :]
    c, s = attn_factor * np.cos(ang), attn_factor * np.sin(ang)
    if neox:
        x = np.asarray(x, np.float64).reshape(T, n_heads, 2, head_dim // 2)
        a, b = x[:, :, 0], x[:, :, 1]
        return np.concatenate([a * c - b * s, a * s + b * c], -1).reshape(T, n_heads * head_dim)
    x = np.asarray(x, np.float64).reshape(T, n_heads, head_dim // 2, 2)
    a, b = x[..., 0], x[..., 1]
    return np.stack([a * c - b * s, a * s + b * c], -1).reshape(T, n_heads * head_dim)
