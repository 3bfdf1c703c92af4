"""matmul: y[t, r] = sum_k W[r, k] * x[t, k], dequantizing W on the fly.

Quantized weights are stored *row-interleaved* (see gpu/quant.py): groups of LANES rows
with the bytes of one block column of all LANES rows contiguous. The innermost loop then
runs over rows — a long, branch-free loop with no reduction, which LLVM turns into plain
AVX2 code. (The natural layout, a 16-byte inner loop per block, leaves LLVM with a short
horizontal reduction per block that it doesn't vectorize: measured 14x slower here.)

Nibbles are split with float arithmetic (hi = floor(v/16), lo = v - 16 hi) rather than
integer shifts, because numba widens small-integer arithmetic to int64, whose conversion to
float has no AVX2 instruction.

* decode (T small): per block, each row's partial sum over the 32 weights accumulates in
  ``bacc``; the block scale d and offset m (times the block sum of x) are applied once per
  block. The dequantized block is reused for every token of the batch.
* prefill (T large): a group's rows are dequantized once into a float32 tile, then dotted
  with every token, four tokens per pass so each weight load feeds four FMAs.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quant import FMT_F32, FMT_Q4, LANES, QK

TILE_MIN_TOKENS = 16  # at and above this many tokens, dequantize to a tile first


@njit(fastmath=True, cache=True)
def _block_sums(x):
    T, K = x.shape
    nb = K // QK
    xs = np.zeros((T, nb), np.float32)
    for t in range(T):
        for b in range(nb):
            s = np.float32(0.0)
            for j in range(QK):
                s += x[t, b * QK + j]
            xs[t, b] = s
    return xs


@njit(fastmath=True, cache=True)
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
        db = d[g, b]
        mb = m[g, b]
        for t in range(T):
            xsb = xs[t, b]
            o = out[t]
            acc = bacc[t]
            for l in range(LANES):
                o[l] += db[l] * acc[l] + mb[l] * xsb


@njit(fastmath=True, cache=True)
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
        db = d[g, b]
        mb = m[g, b]
        xsb = xs[b]
        for l in range(LANES):
            out[l] += db[l] * bacc[l] + mb[l] * xsb


@njit(fastmath=True, cache=True)
def _q8_group1(qs, d, m, g, x, xs, out, bacc):
    nb = d.shape[1]
    out[:] = 0
    for b in range(nb):
        bacc[:] = 0
        for j in range(QK):
            xv = x[b * QK + j]
            q = qs[g, b, j]
            for l in range(LANES):
                bacc[l] += np.float32(q[l]) * xv
        db = d[g, b]
        mb = m[g, b]
        xsb = xs[b]
        for l in range(LANES):
            out[l] += db[l] * bacc[l] + mb[l] * xsb


@njit(fastmath=True, cache=True)
def _q8_group(qs, d, m, g, x, xs, out, bacc):
    T = x.shape[0]
    nb = d.shape[1]
    out[:, :] = 0
    for b in range(nb):
        bacc[:, :] = 0
        for j in range(QK):
            q = qs[g, b, j]
            for t in range(T):
                xv = x[t, b * QK + j]
                acc = bacc[t]
                for l in range(LANES):
                    acc[l] += np.float32(q[l]) * xv
        db = d[g, b]
        mb = m[g, b]
        for t in range(T):
            xsb = xs[t, b]
            o = out[t]
            acc = bacc[t]
            for l in range(LANES):
                o[l] += db[l] * acc[l] + mb[l] * xsb


@njit(fastmath=True, cache=True)
def dequant_group(fmt, qs, d, m, g, tile):
    """The LANES rows of group g as float32 rows: tile[l, k]."""
    nb = d.shape[1]
    for b in range(nb):
        db = d[g, b]
        if fmt == FMT_Q4:
            mb = m[g, b]
            for j in range(16):
                q = qs[g, b, j]
                for l in range(LANES):
                    v = np.float32(q[l])
                    h = np.floor(v * np.float32(0.0625))
                    tile[l, b * QK + j] = (v - np.float32(16.0) * h) * db[l] + mb[l]
                    tile[l, b * QK + 16 + j] = h * db[l] + mb[l]
        else:
            mb = m[g, b]
            for j in range(QK):
                q = qs[g, b, j]
                for l in range(LANES):
                    tile[l, b * QK + j] = np.float32(q[l]) * db[l] + mb[l]


@njit(fastmath=True, cache=True)
def _tile_dots(tile, nrows, r0, x, y):
    T, K = x.shape
    t = 0
    while t + 4 <= T:
        x0 = x[t]
        x1 = x[t + 1]
        x2 = x[t + 2]
        x3 = x[t + 3]
        for rr in range(nrows):
            row = tile[rr]
            s0 = np.float32(0.0)
            s1 = np.float32(0.0)
            s2 = np.float32(0.0)
            s3 = np.float32(0.0)
            for k in range(K):
                wk = row[k]
                s0 += wk * x0[k]
                s1 += wk * x1[k]
                s2 += wk * x2[k]
                s3 += wk * x3[k]
            y[t, r0 + rr] = s0
            y[t + 1, r0 + rr] = s1
            y[t + 2, r0 + rr] = s2
            y[t + 3, r0 + rr] = s3
        t += 4
    while t < T:
        xt = x[t]
        for rr in range(nrows):
            row = tile[rr]
            s = np.float32(0.0)
            for k in range(K):
                s += row[k] * xt[k]
            y[t, r0 + rr] = s
        t += 1


@njit(parallel=True, fastmath=True, cache=True)
def _matmul_f32(w, x, y):
    T, K = x.shape
    R = y.shape[1]
    nchunks = (R + LANES - 1) // LANES
    for c in prange(nchunks):
        r0 = c * LANES
        nrows = min(R, r0 + LANES) - r0
        _tile_dots(w[r0:r0 + nrows], nrows, r0, x, y)


@njit(parallel=True, fastmath=True, cache=True)
def matmul(fmt, qs, d, m, w, x, y):
    """y[T, R] = x[T, K] @ W[R, K].T for one layer's weight arrays (see gpu/quant.py).

    R = y.shape[1] may be smaller than the padded row count of a quantized weight.
    """
    if fmt == FMT_F32:
        _matmul_f32(w, x, y)
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
    xs = _block_sums(x)
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


def matmul_ref(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """float64 reference over dense weights."""
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
