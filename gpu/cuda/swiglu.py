"""SwiGLU on the GPU: h = silu(gate) * up over the fused [gate | up] rows; twin of
gpu/ops/swiglu.py. One thread per output element."""
from __future__ import annotations

import math

from numba import float32

from ._cuda_shim import DeviceArray, StreamArg, cuda, grid_1d, kernel

THREADS = 256


@kernel(["void(float32[:, ::1], float32[:, ::1])"])
def _swiglu(gu, h):
    F = h.shape[1]
    n = h.shape[0] * F
    for k in range(cuda.grid(1), n, cuda.gridsize(1)):
        t = k // F
        i = k % F
        g = gu[t, i]
        h[t, i] = g / (float32(1.0) + math.exp(-g)) * gu[t, F + i]


@kernel(["void(float32[:, ::1], float32[:, ::1])"])
def _add(x, y):
    """x += y (the residual adds of the forward pass)."""
    D = x.shape[1]
    n = x.shape[0] * D
    for k in range(cuda.grid(1), n, cuda.gridsize(1)):
        x[k // D, k % D] += y[k // D, k % D]


def swiglu(gu: DeviceArray, h: DeviceArray, threads: int = THREADS, stream: StreamArg = 0) -> None:
    n = h.shape[0] * h.shape[1]
    if n:
        blocks, threads = grid_1d(n, threads)
        _swiglu[blocks, threads, stream](gu, h)


def add(x: DeviceArray, y: DeviceArray, threads: int = THREADS, stream: StreamArg = 0) -> None:
    n = x.shape[0] * x.shape[1]
    if n:
        blocks, threads = grid_1d(n, threads)
        _add[blocks, threads, stream](x, y)
