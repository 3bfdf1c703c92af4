"""Token embedding lookup: one dequantized row of the (row-interleaved) embedding matrix."""
from __future__ import annotations

import numpy as np
from numba import njit

from ..quant import FMT_F32, FMT_Q4, LANES, QK


@njit(fastmath=True, cache=True)
def embed(fmt, qs, d, m, w, tokens, x):
    for t in range(tokens.shape[0]):
        r = tokens[t]
        if fmt == FMT_F32:
            for k in range(x.shape[1]):
                x[t, k] = w[r, k]
            continue
        g = r // LANES
        l = r % LANES
        for b in range(d.shape[1]):
            db = d[g, b, l]
            mb = m[g, b, l]
            if fmt == FMT_Q4:
                for j in range(16):
                    q = np.float32(qs[g, b, j, l])
                    h = np.floor(q * np.float32(0.0625))
                    x[t, b * QK + j] = (q - np.float32(16.0) * h) * db + mb
                    x[t, b * QK + 16 + j] = h * db + mb
            else:
                for j in range(QK):
                    x[t, b * QK + j] = np.float32(qs[g, b, j, l]) * db + mb


def embed_ref(dense: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return np.asarray(dense, np.float64)[np.asarray(tokens)]
