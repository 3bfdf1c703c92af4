"""Quantized weights to dense float16 rows, and float32 activations to float16: the inputs
of the tensor-core GEMMs (tensor_gemm.py) that run the matmuls of large prefill steps.

A weight arrives row-interleaved (gpu/quant.py):

    qs[g, b, j, l], d[g, b, l], m[g, b, l]      row g*LANES + l, block b, w = d*q + m

with the bytes in the device layout (weight_layout.py): qs[g, b, l >> 2, j, l & 3].

and leaves as out[r, k] = fp16(d * q + m), row-major, rows past out.shape[0] (the padding
of the last row group) skipped. A thread owns one (g, b, l): for each byte j the LANES
threads of a group read LANES contiguous bytes (coalesced), and each thread writes its block
of the row as one contiguous run (whole 32-byte sectors). d * q is exact in float32 (see
gpu/quant.py), so with or without a fused multiply-add the float32 value equals the CPU's
``quant.dequantize`` bit for bit; the one rounding is the store to float16 (round to
nearest even on the device and in numpy alike).

float16 rather than bfloat16: the dequantized weights and the activations here (after
rmsnorm, attention, SwiGLU) sit well inside float16's range, and float16 keeps 3 more
mantissa bits.
"""
# mypy reads Numba's device intrinsics (cuda.grid(1)) through their host-side stubs and
# misreports them inside kernels; that code is that and nothing else here.
# mypy: disable-error-code="call-arg, call-overload"
from __future__ import annotations

from numba import float32

from ..quant import FMT_F32, FMT_Q4, LANES, QK
from ._cuda_shim import cuda, grid_1d, kernel

_QSIG = "void(uint8[:, :, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], float16[:, ::1])"
_HSIG = "void(float32[:, ::1], float16[:, ::1])"


@kernel([_QSIG])
def _dequant_q4(qs, d, m, out):
    """Q4: byte j of a 32-weight block holds weight j (low nibble) and 16 + j (high)."""
    R = out.shape[0]
    nb = d.shape[1]
    n = d.shape[0] * nb * LANES
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        l = e % LANES
        b = (e // LANES) % nb
        g = e // (LANES * nb)
        r = g * LANES + l
        if r < R:
            db = d[g, b, l]
            mb = m[g, b, l]
            k0 = b * QK
            for j in range(QK // 2):
                q = qs[g, b, l >> 2, j, l & 3]
                out[r, k0 + j] = db * float32(q & 15) + mb
                out[r, k0 + QK // 2 + j] = db * float32(q >> 4) + mb


@kernel([_QSIG])
def _dequant_q8(qs, d, m, out):
    """Bytes, one weight each, in blocks of qs.shape[3] (32: Q8_0, Q5_*; 16: Q6_K)."""
    R = out.shape[0]
    nb = d.shape[1]
    BS = qs.shape[3]
    n = d.shape[0] * nb * LANES
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        l = e % LANES
        b = (e // LANES) % nb
        g = e // (LANES * nb)
        r = g * LANES + l
        if r < R:
            db = d[g, b, l]
            mb = m[g, b, l]
            k0 = b * BS
            for j in range(BS):
                out[r, k0 + j] = db * float32(qs[g, b, l >> 2, j, l & 3]) + mb


@kernel([_HSIG])
def _to_half(x, y):
    """y[t, k] = fp16(x[t, k]) over y's shape (x may have more rows)."""
    K = y.shape[1]
    n = y.shape[0] * K
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        y[e // K, e % K] = x[e // K, e % K]


def dequantize(fmt, qs, d, m, w, out, stream=0):
    """out[R, K] (float16, R <= the weight's padded rows) = one layer's weight (gpu/quant.py
    arrays, on the device), row-major."""
    R = out.shape[0]
    if not R:
        return
    if fmt == FMT_F32:
        to_half(w, out, stream)
        return
    n = d.shape[0] * d.shape[1] * LANES
    blocks, threads = grid_1d(n)
    k = _dequant_q4 if fmt == FMT_Q4 else _dequant_q8
    k[blocks, threads, stream](qs, d, m, out)


def to_half(x, y, stream=0):
    """y (float16) = x (float32) over y's rows."""
    n = y.shape[0] * y.shape[1]
    if n:
        blocks, threads = grid_1d(n)
        _to_half[blocks, threads, stream](x, y)
