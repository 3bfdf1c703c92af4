"""matmul: y[t, r] = sum_k W[r, k] * x[t, k], dequantizing W on the fly.

Quantized weights are stored *row-interleaved* (see gpu/quant.py): groups of LANES rows
with the bytes of one block column of all LANES rows contiguous. The innermost loop then
runs over rows — a long, branch-free loop with no reduction, which LLVM turns into plain
AVX2 code. (The natural layout, a 16-byte inner loop per block, leaves LLVM with a short
horizontal reduction per block that it doesn't vectorize: measured 14x slower here.)

Nibbles are split with float arithmetic (hi = floor(v/16), lo = v - 16 hi) rather than
integer shifts, because numba widens small-integer arithmetic to int64, whose conversion to
float has no AVX2 instruction.

Byte formats (FMT_Q8: Q8_0, Q5_0, Q5_1, Q5_K; FMT_Q8_16: Q6_K) share one kernel: the block
length is the qs array's block axis (32 or 16 bytes), so Q6_K's 16-weight scales need no
code of their own. Q4_K is FMT_Q4 (its sub-block scales are expanded at load time).

* decode (T small): per block, each row's partial sum over the 32 weights accumulates in
  ``bacc``; the block scale d and offset m (times the block sum of x) are applied once per
  block. The dequantized block is reused for every token of the batch.
* prefill (T large): a group's rows are dequantized once into a float32 tile, then dotted
  with every token, four tokens per pass so each weight load feeds four FMAs.

Weights prepared for the int8 kernels (format codes >= int8_matmul.FMT_I8, see
gpu/ops/int8_matmul.py and gpu/ops/cpu_features.py) go to ``int8_matmul`` instead: the
activations are quantized to 8 bits per block and multiplied with integer dot products.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit, prange
from numba.extending import overload

from ..quant import (
    FMT_F32,
    FMT_Q4,
    LANES,
    LF_BLK,
    LF_CODE,
    LF_DN,
    LF_DOFF,
    LF_G0,
    LF_G1,
    LF_MN,
    LF_MOFF,
    LF_NB,
    LF_QN,
    LF_QOFF,
    QK,
)
from .int8_matmul import FMT_I8, int8_matmul, int8_matmul_layout

TILE_MIN_TOKENS = 32  # at and above this many tokens, dequantize to a tile first (measured crossover)


@njit(fastmath=True, cache=True, nogil=True)
def _block_sums(x, bs):
    """Sums of x over each block of bs weights."""
    T, K = x.shape
    nb = K // bs
    xs = np.zeros((T, nb), np.float32)
    for t in range(T):
        for b in range(nb):
            s = np.float32(0.0)
            for j in range(bs):
                s += x[t, b * bs + j]
            xs[t, b] = s
    return xs


@njit(fastmath=True, cache=True, nogil=True)
def _scale_block(db, mb, xsb, bacc, out):
    """out += d * (sum of q x over the block) + m * (sum of x over the block), per row."""
    for l in range(LANES):
        out[l] += db[l] * bacc[l] + mb[l] * xsb


@njit(fastmath=True, cache=True, nogil=True)
def _q4_group(qs, d, m, g, x, xs, out, lo, hi, bacc):
    """out[t, l] = row (g*LANES + l) of a Q4 weight dotted with x[t]."""
    T = x.shape[0]
    nb = d.shape[1]
    out[:, :] = 0
    for b in range(nb):
        bacc[:, :] = 0
        for j in range(16):
            q = qs[g, b, j]
            for l in range(LANES):
                v = np.float32(q[l])
                h = np.floor(v * np.float32(0.0625))
                hi[l] = h
                lo[l] = v - np.float32(16.0) * h
            for t in range(T):
                xl = x[t, b * QK + j]
                xh = x[t, b * QK + 16 + j]
                acc = bacc[t]
                for l in range(LANES):
                    acc[l] += lo[l] * xl + hi[l] * xh
        for t in range(T):
            _scale_block(d[g, b], m[g, b], xs[t, b], bacc[t], out[t])


@njit(fastmath=True, cache=True, nogil=True)
def _q4_group1(qs, d, m, g, x, xs, out, bacc):
    """_q4_group for a single token: the decode hot path, kept free of the token loop."""
    nb = d.shape[1]
    out[:] = 0
    for b in range(nb):
        bacc[:] = 0
        for j in range(16):
            xl = x[b * QK + j]
            xh = x[b * QK + 16 + j]
            q = qs[g, b, j]
            for l in range(LANES):
                v = np.float32(q[l])
                h = np.floor(v * np.float32(0.0625))
                bacc[l] += (v - np.float32(16.0) * h) * xl + h * xh
        _scale_block(d[g, b], m[g, b], xs[b], bacc, out)


@njit(fastmath=True, cache=True, nogil=True)
def _q8_group1(qs, d, m, g, x, xs, out, bacc):
    nb = d.shape[1]
    bs = qs.shape[2]  # 32 (FMT_Q8) or 16 (FMT_Q8_16): a multiple of 4
    out[:] = 0
    for b in range(nb):
        bacc[:] = 0
        for j in range(0, bs, 4):  # 4 rows of bytes per pass: one bacc load/store per 4 FMAs
            x0 = x[b * bs + j]
            x1 = x[b * bs + j + 1]
            x2 = x[b * bs + j + 2]
            x3 = x[b * bs + j + 3]
            q0 = qs[g, b, j]
            q1 = qs[g, b, j + 1]
            q2 = qs[g, b, j + 2]
            q3 = qs[g, b, j + 3]
            for l in range(LANES):
                bacc[l] += (np.float32(q0[l]) * x0 + np.float32(q1[l]) * x1) + \
                    (np.float32(q2[l]) * x2 + np.float32(q3[l]) * x3)
        _scale_block(d[g, b], m[g, b], xs[b], bacc, out)


@njit(fastmath=True, cache=True, nogil=True)
def _q8_group(qs, d, m, g, x, xs, out, bacc):
    T = x.shape[0]
    nb = d.shape[1]
    bs = qs.shape[2]
    out[:, :] = 0
    for b in range(nb):
        bacc[:, :] = 0
        for j in range(bs):
            q = qs[g, b, j]
            for t in range(T):
                xv = x[t, b * bs + j]
                acc = bacc[t]
                for l in range(LANES):
                    acc[l] += np.float32(q[l]) * xv
        for t in range(T):
            _scale_block(d[g, b], m[g, b], xs[t, b], bacc[t], out[t])


@njit(fastmath=True, cache=True, nogil=True)
def dequant_lane(fmt, qs, d, m, g, l, row):
    """Row g*LANES + l of a quantized weight as float32 into row[:K]."""
    for b in range(d.shape[1]):
        db = d[g, b, l]
        mb = m[g, b, l]
        if fmt == FMT_Q4:
            for j in range(16):
                v = np.float32(qs[g, b, j, l])
                h = np.floor(v * np.float32(0.0625))
                row[b * QK + j] = (v - np.float32(16.0) * h) * db + mb
                row[b * QK + 16 + j] = h * db + mb
        else:
            bs = qs.shape[2]
            for j in range(bs):
                row[b * bs + j] = np.float32(qs[g, b, j, l]) * db + mb


@njit(fastmath=True, cache=True, nogil=True)
def dequant_group(fmt, qs, d, m, g, tile):
    """The LANES rows of group g as float32 rows: tile[l, k]. Row by row, so the stores are
    contiguous (the strided reads of qs stay within a few cache lines per block)."""
    for l in range(LANES):
        dequant_lane(fmt, qs, d, m, g, l, tile[l])


@njit(fastmath=True, cache=True, nogil=True)
def _row_dots(row, rr, r0, x, t0, y):
    """One row against tokens t0.. (the remainder of the 2x4 blocking)."""
    for t in range(t0, x.shape[0]):
        xt = x[t]
        s = np.float32(0.0)
        for k in range(x.shape[1]):
            s += row[k] * xt[k]
        y[t, r0 + rr] = s


@njit(fastmath=True, cache=True, nogil=True)
def _tile_dots(tile, nrows, r0, x, y):
    """y[:, r0:r0+nrows] = x @ tile[:nrows].T, blocked 2 rows x 4 tokens: 8 accumulators
    fed by 6 loads per 8 FMAs, so the loop is bound by FMAs rather than by loads."""
    T, K = x.shape
    for rr in range(0, nrows - 1, 2):
        a = tile[rr]
        b = tile[rr + 1]
        t = 0
        while t + 4 <= T:
            x0 = x[t]
            x1 = x[t + 1]
            x2 = x[t + 2]
            x3 = x[t + 3]
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = np.float32(0.0)
            for k in range(K):
                wa = a[k]
                wb = b[k]
                s00 += wa * x0[k]
                s01 += wa * x1[k]
                s02 += wa * x2[k]
                s03 += wa * x3[k]
                s10 += wb * x0[k]
                s11 += wb * x1[k]
                s12 += wb * x2[k]
                s13 += wb * x3[k]
            y[t, r0 + rr] = s00
            y[t + 1, r0 + rr] = s01
            y[t + 2, r0 + rr] = s02
            y[t + 3, r0 + rr] = s03
            y[t, r0 + rr + 1] = s10
            y[t + 1, r0 + rr + 1] = s11
            y[t + 2, r0 + rr + 1] = s12
            y[t + 3, r0 + rr + 1] = s13
            t += 4
        _row_dots(a, rr, r0, x, t, y)
        _row_dots(b, rr + 1, r0, x, t, y)
    if nrows % 2:
        _row_dots(tile[nrows - 1], nrows - 1, r0, x, 0, y)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _matmul_f32(w, x, y):
    T, K = x.shape
    R = y.shape[1]
    nchunks = (R + LANES - 1) // LANES
    for c in prange(nchunks):
        r0 = c * LANES
        nrows = min(R, r0 + LANES) - r0
        _tile_dots(w[r0:r0 + nrows], nrows, r0, x, y)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def matmul(fmt, qs, d, m, w, x, y):
    """y[T, R] = x[T, K] @ W[R, K].T for one layer's weight arrays (see gpu/quant.py).

    R = y.shape[1] may be smaller than the padded row count of a quantized weight.
    """
    if fmt == FMT_F32:
        _matmul_f32(w, x, y)
        return
    if fmt >= FMT_I8:
        int8_matmul(fmt, qs, d, m, x, y)
        return
    T, K = x.shape
    R = y.shape[1]
    G = d.shape[0]
    if T >= TILE_MIN_TOKENS:
        for g in prange(G):
            tile = np.empty((LANES, K), np.float32)
            dequant_group(fmt, qs, d, m, g, tile)
            r0 = g * LANES
            _tile_dots(tile, min(R, r0 + LANES) - r0, r0, x, y)
        return
    xs = _block_sums(x, QK if fmt == FMT_Q4 else qs.shape[2])
    if T == 1:
        x0 = x[0]
        xs0 = xs[0]
        for g in prange(G):
            out = np.empty(LANES, np.float32)
            bacc = np.empty(LANES, np.float32)
            if fmt == FMT_Q4:
                _q4_group1(qs, d, m, g, x0, xs0, out, bacc)
            else:
                _q8_group1(qs, d, m, g, x0, xs0, out, bacc)
            r0 = g * LANES
            for l in range(min(R, r0 + LANES) - r0):
                y[0, r0 + l] = out[l]
        return
    for g in prange(G):
        out = np.empty((T, LANES), np.float32)
        bacc = np.empty((T, LANES), np.float32)
        if fmt == FMT_Q4:
            lo = np.empty(LANES, np.float32)
            hi = np.empty(LANES, np.float32)
            _q4_group(qs, d, m, g, x, xs, out, lo, hi, bacc)
        else:
            _q8_group(qs, d, m, g, x, xs, out, bacc)
        r0 = g * LANES
        n = min(R, r0 + LANES) - r0
        for t in range(T):
            for l in range(n):
                y[t, r0 + l] = out[t, l]


def matmul_ref(w: npt.ArrayLike, x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """float64 reference over dense weights."""
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def _layer_matmul(w, layer, x, y):
    """layer_matmul's body, chosen by the weight's type (see the overload)."""
    raise NotImplementedError


@overload(_layer_matmul, jit_options={"cache": True, "nogil": True})  # type: ignore[typeddict-unknown-key]
def _layer_matmul_typed(w, layer, x, y):
    # prepared int8 weights are flat slots ([L, n] arrays); the float kernels' are [L, G, ...]
    if w.types[1].ndim == 2:
        def segments(w, layer, x, y):
            lf = w[5]
            R = y.shape[1]
            for s in range(lf.shape[1]):
                c = lf[layer, s]
                if c[LF_CODE] < 0:
                    break
                r1 = min(R, c[LF_G1] * LANES)
                int8_matmul_layout(c[LF_CODE], c[LF_NB], c[LF_BLK], c[LF_G1] - c[LF_G0],
                                   w[1][layer, c[LF_QOFF]:c[LF_QOFF] + c[LF_QN]],
                                   w[2][layer, c[LF_DOFF]:c[LF_DOFF] + c[LF_DN]],
                                   w[3][layer, c[LF_MOFF]:c[LF_MOFF] + c[LF_MN]],
                                   x, y[:, c[LF_G0] * LANES:r1])
        return segments

    def whole(w, layer, x, y):
        matmul(w[5][layer, 0, LF_CODE], w[1][layer], w[2][layer], w[3][layer], w[4][layer], x, y)
    return whole


@njit(cache=True, nogil=True)
def layer_matmul(w, layer, x, y):
    """y = x @ W.T for one layer of a stacked weight w (gpu/quant.py's Weight with its
    layer table lf filled in: Weight.layers()). A prepared int8 weight runs segment by
    segment, each in its own format and into its own rows of y
    (gpu/ops/int8_matmul.py's prepare)."""
    _layer_matmul(w, layer, x, y)
