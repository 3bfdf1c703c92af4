"""Token embedding lookup: one dequantized row of the (row-interleaved) embedding matrix."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from ..quant import FMT_F32, LANES
from .matmul import dequant_lane


@njit(fastmath=True, cache=True, nogil=True)
def embed(fmt, qs, d, m, w, tokens, x):
    for t in range(tokens.shape[0]):
        r = tokens[t]
        if fmt == FMT_F32:
            for k in range(x.shape[1]):
                x[t, k] = w[r, k]
        else:
            dequant_lane(fmt, qs, d, m, r // LANES, r % LANES, x[t])


def embed_ref(dense: npt.ArrayLike, tokens: npt.ArrayLike) -> npt.NDArray[np.float64]:
    return np.asarray(dense, np.float64)[np.asarray(tokens)]
