"""Token embedding lookup on the GPU: one thread per output element, dequantizing from the
row-interleaved layout of gpu/quant.py, its bytes as weight_layout.py puts them on the
device; twin of gpu/ops/embedding.py.

Q4: element 32b + j of a row is the low nibble of byte j (j < 16) or the high nibble of byte
j - 16; Q8 / Q8_16: byte j of blocks of 32 / 16. w = d * q + m with d, m per (row, block).
"""
from __future__ import annotations

from numba import float32

from ..quant import FMT_F32, FMT_Q4, LANES, QK
from ._cuda_shim import DeviceArray, StreamArg, cuda, grid_1d, kernel

THREADS = 256


@kernel(["void(uint8[:, :, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], int32[::1], float32[:, ::1])"])
def _embed_q4(qs, d, m, tokens, x):
    K = x.shape[1]
    n = x.shape[0] * K
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        t = e // K
        k = e % K
        r = tokens[t]
        g = r // LANES
        l = r % LANES
        b = k // QK
        j = k % QK
        if j < 16:
            q = float32(qs[g, b, l >> 2, j, l & 3] & 15)
        else:
            q = float32(qs[g, b, l >> 2, j - 16, l & 3] >> 4)
        x[t, k] = q * d[g, b, l] + m[g, b, l]


@kernel(["void(uint8[:, :, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], int32[::1], float32[:, ::1])"])
def _embed_q8(qs, d, m, tokens, x):
    K = x.shape[1]
    n = x.shape[0] * K
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        t = e // K
        k = e % K
        r = tokens[t]
        g = r // LANES
        l = r % LANES
        bs = qs.shape[3]  # 32 (FMT_Q8) or 16 (FMT_Q8_16)
        b = k // bs
        x[t, k] = float32(qs[g, b, l >> 2, k % bs, l & 3]) * d[g, b, l] + m[g, b, l]


@kernel(["void(float32[:, ::1], int32[::1], float32[:, ::1])"])
def _embed_f32(w, tokens, x):
    K = x.shape[1]
    n = x.shape[0] * K
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        x[e // K, e % K] = w[tokens[e // K], e % K]


def embed(fmt: int, qs: DeviceArray | None, d: DeviceArray | None, m: DeviceArray | None,
          w: DeviceArray | None,
          tokens: DeviceArray, x: DeviceArray, threads: int = THREADS, stream: StreamArg = 0) -> None:
    """x[T, K] = rows tokens[t] of one weight (its layer-0 arrays, as in the CPU twin)."""
    n = x.shape[0] * x.shape[1]
    if not n:
        return
    cfg = grid_1d(n, threads) + (stream,)
    if fmt == FMT_F32:
        _embed_f32[cfg](w, tokens, x)
    elif fmt == FMT_Q4:
        _embed_q4[cfg](qs, d, m, tokens, x)
    else:
        _embed_q8[cfg](qs, d, m, tokens, x)
