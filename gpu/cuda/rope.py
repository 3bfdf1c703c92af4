"""Rotary embedding on the GPU, adjacent pairs (llama.cpp's 'normal' mode); twin of
gpu/ops/rope.py. One thread per (token, head, pair), in place."""
from __future__ import annotations

from ._cuda_shim import DeviceArray, StreamArg, cuda, grid_1d, kernel

THREADS = 256


@kernel(["void(float32[:, ::1], int64, int32[::1], float32[:, ::1], float32[:, ::1], int64, int64)"])
def _rope(x, col0, pos, cos, sin, n_heads, head_dim):
    half = head_dim // 2
    per_tok = n_heads * half
    n = x.shape[0] * per_tok
    for k in range(cuda.grid(1), n, cuda.gridsize(1)):
        t = k // per_tok
        r = k % per_tok
        h = r // half
        i = r % half
        p = pos[t]
        c = cos[p, i]
        s = sin[p, i]
        o = col0 + h * head_dim + 2 * i
        a = x[t, o]
        b = x[t, o + 1]
        x[t, o] = a * c - b * s
        x[t, o + 1] = a * s + b * c


def rope(x: DeviceArray, col0: int, pos: DeviceArray, cos: DeviceArray, sin: DeviceArray,
         n_heads: int, head_dim: int, threads: int = THREADS, stream: StreamArg = 0) -> None:
    """In place on heads [col0, col0 + n_heads*head_dim) of x[T, :]; token t at pos[t]."""
    n = x.shape[0] * n_heads * (head_dim // 2)
    if n:
        blocks, threads = grid_1d(n, threads)
        _rope[blocks, threads, stream](x, col0, pos, cos, sin, n_heads, head_dim)
