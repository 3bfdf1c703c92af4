"""Rotary position embedding in llama.cpp's convention for GGUF Llama weights.

llama.cpp's converter permutes the rows of Q and K so that the rotation applies to
*adjacent* pairs (2i, 2i+1) of each head, with angle pos * base^(-2i / head_dim). We keep the
file's weights as they are and rotate adjacent pairs (the 'normal' mode of ggml_rope).
"""
from __future__ import annotations

import numpy as np
from numba import njit


def rope_tables(max_pos: int, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [max_pos, head_dim/2], computed in float64 and stored as float32."""
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


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


def rope_ref(x: np.ndarray, pos: np.ndarray, n_heads: int, head_dim: int, base: float) -> np.ndarray:
    x = np.asarray(x, np.float64).reshape(len(pos), n_heads, head_dim // 2, 2)
    inv = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.asarray(pos, np.float64)[:, None, None] * inv[None, None, :]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., 0], x[..., 1]
    return np.stack([a * c - b * s, a * s + b * c], -1).reshape(len(pos), n_heads * head_dim)
