"""SwiGLU: h = silu(gate) * up, over the fused [gate | up] output of one matmul."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(fastmath=True, cache=True, nogil=True)
def swiglu(gu, h):
    T, F = h.shape
    for t in range(T):
        for i in range(F):
            g = gu[t, i]
            h[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gu[t, F + i]


def swiglu_ref(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = np.asarray(gate, np.float64)
    return g / (1.0 + np.exp(-g)) * np.asarray(up, np.float64)
