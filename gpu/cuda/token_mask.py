"""Token masks on the device, the twin of gpu/ops/token_mask.py: one block per constrained
logit row, its threads over the mask's words, between the penalties and the sampler
(sampling.sample_rows takes the mask and runs this first, on the same stream).

Only the constrained rows are given (``rows``: their logit rows; ``words``: their masks,
uint32 [m, ceil(vocab / 32)], bit b of word w = token 32w + b), so a batch's free rows are not
read at all; a word with every bit set (most of a JSON string's vocabulary) is one load and
no store. A disallowed token's logit becomes -inf in place: the sampler (greedy, top-k,
top-p, the draw) and the logprobs after it then see the allowed tokens alone, the CPU's order.
"""
# mypy reads Numba's device intrinsics (cuda.threadIdx.x) through their host-side stubs and
# misreports them inside kernels; that code is that and nothing else here.
# mypy: disable-error-code="call-overload"
from __future__ import annotations

import numpy as np

from ._cuda_shim import SIM, DeviceArray, StreamArg, cuda, kernel

THREADS = 32 if SIM else 256
ALL = 4294967295
NEG_INF = np.float32(-np.inf)  # a float32 constant: the kernel has no float64 in it


@kernel(["void(float32[:, ::1], int32[::1], uint32[:, ::1])"])
def _mask_rows(logits, rows, words):
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    r = rows[b]
    V = logits.shape[1]
    for w in range(tid, words.shape[1], nt):
        bits = words[b, w]
        if bits != ALL:
            for j in range(32):
                t = w * 32 + j
                if t < V and not (bits >> j) & 1:
                    logits[r, t] = NEG_INF


def mask_rows(logits: DeviceArray, rows: DeviceArray, words: DeviceArray,
              stream: StreamArg = 0) -> None:
    """Set the disallowed tokens of logits[rows[k]] to -inf per words[k] (device arrays)."""
    if rows.shape[0] == 0:  # a launch of 0 blocks is an error
        return
    _mask_rows[rows.shape[0], THREADS, stream](logits, rows, words)
