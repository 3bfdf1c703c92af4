"""matmul on the GPU: y[T, R] = x[T, K] @ W[R, K]^T, dequantizing W on the fly; twin of
gpu/ops/matmul.py over the same row-interleaved arrays (gpu/quant.py):

    qs[g, b, j, l], d[g, b, l], m[g, b, l]      row g*LANES + l, block b, w = d*q + m

with the bytes in the device layout (weight_layout.py): qs[g, b, l >> 2, j, l & 3].

Quantized (Q4, Q8, Q8_16): a block of LANES x KSPLIT threads owns one row group g and TT tokens.
Thread (l, s) owns row g*LANES + l and the blocks b = s, s + KSPLIT, ...: for a fixed
(g, b, j) a row quad's 4 bytes are contiguous and a warp's loads touch 8 of them, which the
next positions j read again from L1. Per block b it
accumulates sum_j q_j x_j and sum_j x_j, applies d and m once, and the KSPLIT partial sums
meet in shared memory. TT (tokens per thread block) is a compile-time constant so the
per-token accumulators stay in registers: TT=1 for decode, TT=8 otherwise.

The byte kernel serves FMT_Q8 (Q8_0, Q5_0, Q5_1, Q5_K: 32-byte blocks) and FMT_Q8_16 (Q6_K:
16-byte blocks); the block length BS is a compile-time constant too (one variant each), so
the j loop unrolls as before. Q4_K is FMT_Q4 and runs the Q4 kernel.

F32: one warp per row, lanes striding over K (coalesced); the lanes' partial sums meet in
shared memory, where lane tt adds up token tt (one barrier, no shuffles).
"""
from __future__ import annotations

from numba import float32

from ..quant import FMT_F32, FMT_Q4, LANES, QK, QK_16
from ._cuda_shim import WARP, cuda, device, kernel

KSPLIT = 4          # threads per row (split over K blocks): 256 threads per thread block
TOKEN_TILES = (1, 8)  # TT variants compiled; a step of T tokens uses 1 if T == 1 else 8
F32_ROWS = 8        # rows (warps) per thread block for F32 weights
_WARP_PAD = WARP + 1  # shared-memory row stride: no bank conflicts (a constant for Numba)

_QSIG = ("void(uint8[:, :, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], "
         "float32[:, ::1], float32[:, ::1])")
_FSIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"


def _make_quant(TT, BS):
    """The kernel for TT-token tiles of a quant format: BS 0 for Q4's nibbles (16 bytes a
    32-element block, element j beside j + 16), else a byte a value in BS-byte blocks."""
    NJ = 16 if BS == 0 else BS   # bytes a row has in one block: qs.shape[3]
    name = f"matmul._q4_tt{TT}" if BS == 0 else (
        f"matmul._q8_tt{TT}" if BS == QK else f"matmul._q8b{BS}_tt{TT}")

    @kernel([_QSIG], name=name)
    def quant(qs, d, m, x, y):
        g = cuda.blockIdx.x
        t0 = cuda.blockIdx.y * TT
        l = cuda.threadIdx.x
        s = cuda.threadIdx.y
        lq = l >> 2  # type: ignore[operator]  # (the stubs type threadIdx.x as a method)
        li = l & 3  # type: ignore[operator]
        T = x.shape[0]
        R = y.shape[1]
        nb = d.shape[1]
        acc = cuda.local.array(TT, float32)
        qa = cuda.local.array(TT, float32)
        xsum = cuda.local.array(TT, float32)
        for tt in range(TT):
            acc[tt] = float32(0.0)
        for b in range(s, nb, KSPLIT):
            for tt in range(TT):
                qa[tt] = float32(0.0)
                xsum[tt] = float32(0.0)
            for j in range(NJ):
                if BS == 0:
                    q = qs[g, b, lq, j, li]
                    lo = float32(q & 15)
                    hi = float32(q >> 4)
                    for tt in range(TT):
                        t = min(t0 + tt, T - 1)  # past the end: the last token, not stored
                        xl = x[t, b * QK + j]
                        xh = x[t, b * QK + 16 + j]
                        qa[tt] += lo * xl + hi * xh
                        xsum[tt] += xl + xh
                else:
                    qv = float32(qs[g, b, lq, j, li])
                    for tt in range(TT):
                        t = min(t0 + tt, T - 1)
                        xv = x[t, b * BS + j]
                        qa[tt] += qv * xv
                        xsum[tt] += xv
            db = d[g, b, l]
            mb = m[g, b, l]
            for tt in range(TT):
                acc[tt] += db * qa[tt] + mb * xsum[tt]
        red = cuda.shared.array((KSPLIT, TT, LANES), float32)
        _reduce_store(red, acc, g, t0, l, s, T, R, y)

    return quant


@device
def _reduce_store(red, acc, g, t0, l, s, T, R, y):
    """Sum the KSPLIT partial sums of each (token, row) in shared memory and store them."""
    TT = red.shape[1]
    for tt in range(TT):
        red[s, tt, l] = acc[tt]
    cuda.syncthreads()
    r = g * LANES + l
    if s == 0 and r < R:
        for tt in range(TT):
            t = t0 + tt
            if t < T:
                v = red[0, tt, l]
                for k in range(1, KSPLIT):
                    v += red[k, tt, l]
                y[t, r] = v


def _make_f32(TT):
    @kernel([_FSIG], name=f"matmul._f32_tt{TT}")
    def f32(w, x, y):
        lane = cuda.threadIdx.x
        wy = cuda.threadIdx.y
        T = x.shape[0]
        R = y.shape[1]
        K = x.shape[1]
        r = cuda.blockIdx.x * F32_ROWS + wy
        rr = min(r, R - 1)  # a row past the end recomputes the last row, never stored
        t0 = cuda.blockIdx.y * TT
        acc = cuda.local.array(TT, float32)
        for tt in range(TT):
            acc[tt] = float32(0.0)
        for k in range(lane, K, WARP):
            wv = w[rr, k]
            for tt in range(TT):
                acc[tt] += wv * x[min(t0 + tt, T - 1), k]
        # lanes' partial sums meet in shared memory; lane tt of the warp adds up token tt
        part = cuda.shared.array((F32_ROWS, TT, _WARP_PAD), float32)
        for tt in range(TT):
            part[wy, tt, lane] = acc[tt]
        cuda.syncthreads()
        if lane < TT and r < R and t0 + lane < T:
            v = float32(0.0)
            for k in range(WARP):
                v += part[wy, lane, k]
            y[t0 + lane, r] = v

    return f32


_Q4 = {TT: _make_quant(TT, 0) for TT in TOKEN_TILES}
_Q8 = {(TT, BS): _make_quant(TT, BS) for TT in TOKEN_TILES for BS in (QK, QK_16)}
_F32 = {TT: _make_f32(TT) for TT in TOKEN_TILES}


def matmul(fmt, qs, d, m, w, x, y, stream=0):
    """y[T, R] = x[T, K] @ W[R, K].T for one layer's weight arrays (see gpu/quant.py), on
    device arrays. R = y.shape[1] may be smaller than a quantized weight's padded rows."""
    T = x.shape[0]
    R = y.shape[1]
    if not T or not R:
        return
    TT = 1 if T == 1 else TOKEN_TILES[-1]
    nt = (T + TT - 1) // TT
    if fmt == FMT_F32:
        _F32[TT][((R + F32_ROWS - 1) // F32_ROWS, nt), (WARP, F32_ROWS), stream](w, x, y)
    elif fmt == FMT_Q4:
        _Q4[TT][(d.shape[0], nt), (LANES, KSPLIT), stream](qs, d, m, x, y)
    else:
        _Q8[TT, qs.shape[3]][(d.shape[0], nt), (LANES, KSPLIT), stream](qs, d, m, x, y)
