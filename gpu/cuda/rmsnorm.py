"""RMSNorm on the GPU: one block per token row; twin of gpu/ops/rmsnorm.py."""
from __future__ import annotations

import math

import numpy as np
from numba import float32

from ._cuda_shim import SIM, DeviceArray, StreamArg, block_sum, cuda, kernel

# per block: a 576-wide row is 4.5 elements per thread; one warp in the simulator, where
# each thread costs (its tests run 2 warps, for the cross-warp step of block_sum)
THREADS = 32 if SIM else 128


@kernel(["void(float32[:, ::1], float32[::1], float32, float32[:, ::1])"])
def _rmsnorm(x, w, eps, y):
    t = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    D = x.shape[1]
    buf = cuda.shared.array(32, float32)
    ss = float32(0.0)
    for i in range(tid, D, nt):
        v = x[t, i]
        ss += v * v
    ss = block_sum(ss, buf, tid, nt)
    inv = float32(1.0) / math.sqrt(ss / float32(D) + eps)
    for i in range(tid, D, nt):
        y[t, i] = x[t, i] * inv * w[i]


def rmsnorm(x: DeviceArray, w: DeviceArray, eps: float | np.float32, y: DeviceArray, threads: int = THREADS,
            stream: StreamArg = 0) -> None:
    """y[T, D] = rmsnorm(x[T, D]) * w (device arrays; eps a float32)."""
    T = x.shape[0]
    if T:
        _rmsnorm[T, threads, stream](x, w, float32(eps), y)
