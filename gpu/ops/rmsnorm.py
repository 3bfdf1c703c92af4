"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, one row per token."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit


@njit(fastmath=True, cache=True, nogil=True)
def rmsnorm(x, w, eps, y):
    T, D = x.shape
    for t in range(T):
        ss = np.float32(0.0)
        for i in range(D):
            ss += x[t, i] * x[t, i]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(D) + np.float32(eps))
        for i in range(D):
            y[t, i] = x[t, i] * inv * w[i]


def rmsnorm_ref(x: npt.ArrayLike, w: npt.ArrayLike, eps: float) -> npt.NDArray[np.float64]:
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.asarray(w, np.float64)
