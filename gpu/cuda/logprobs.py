"""Logprobs on the device, the twin of gpu/ops/logprobs.py: for the rows that ask, the
sampled token's logprob and the top N (N <= 20), next to the sampler, so that what leaves the
GPU is 21 (id, logprob) pairs per asking row, never a vocabulary-sized row of logits.

One block per *asking* row, launched only when some row asks: a step in which no request
wants logprobs launches nothing and copies nothing more than before. The block reads the row
the sampler read (penalties already applied in place; before temperature, top-k, top-p: the
raw distribution, as vLLM returns it), finds its max, sums exp(x - max) (a block scan), and
takes lse = max + log(sum). The top N are N passes of a block arg-max, each over the entries
strictly after the previous pick in (logit descending, id ascending) order: the CPU twin's
order, ties included, without a sort or a per-thread candidate list. N passes of the row are
what a radix select would cost at N = 4 and need no shared histogram; at N = 20 they are 20
reads of a row that the sampler has just brought into L2.

Float32 sums: a logprob differs from the float64 reference by about 1e-6 (the wire carries
float32 anyway).

Output per asking row b: ids[b, 0] the sampled id and lps[b, 0] its logprob; ids[b, 1 + k],
lps[b, 1 + k] the k-th best (k < N). The host slices what each row asked for.
"""
# mypy reads Numba's device intrinsics (cuda.threadIdx.x, cuda.syncthreads()) through their
# host-side stubs and misreports them inside kernels; those three codes are that and nothing
# else here, and the host-side functions below are annotated and checked.
# mypy: disable-error-code="call-arg,call-overload,comparison-overlap"
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from numba import float32, int32

from ..ops.logprobs import RowLogprobs
from ._cuda_shim import SIM, DeviceArray, StreamArg, block_best, block_sum, cuda, device, kernel

THREADS = 32 if SIM else 256   # a power of two (the tree reductions)
MAX_THREADS = 1024
WIDTH = 21                     # the sampled token + at most 20 alternatives
NO_ID = 2147483647


@device
def _best_after(x, V, pv, pi, fbuf, ibuf, tid, nt):
    """The first entry of x in (value descending, id ascending) order that comes strictly
    after (pv, pi) in that order, to every thread: (value, id)."""
    best, arg = float32(-math.inf), int32(NO_ID)
    for i in range(tid, V, nt):
        v = x[i]
        if v < pv or (v == pv and i > pi):
            if v > best or (v == best and i < arg):
                best, arg = v, int32(i)
    return block_best(best, arg, fbuf, ibuf, tid, nt)


@kernel(["void(float32[:, ::1], int32[::1], int32[::1], int32[::1], int32[:, ::1], "
         "float32[:, ::1])"])
def _logprob_rows(logits, rows, tops, sampled, out_ids, out_lps):
    """Block b: logit row rows[b], whose sampled id is sampled[rows[b]], wanting tops[b]
    alternatives."""
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    row = rows[b]
    x = logits[row]
    V = x.shape[0]
    fbuf = cuda.shared.array(MAX_THREADS, float32)
    ibuf = cuda.shared.array(MAX_THREADS, int32)
    # the max: the best after a position before every entry
    xmax, amax = _best_after(x, V, float32(math.inf), int32(-1), fbuf, ibuf, tid, nt)
    s = float32(0.0)
    for i in range(tid, V, nt):
        s += math.exp(x[i] - xmax)
    lse = xmax + math.log(block_sum(s, fbuf, tid, nt))
    if tid == 0:
        tok = sampled[row]
        out_ids[b, 0] = tok
        out_lps[b, 0] = x[tok] - lse
    pv, pi = xmax, amax
    for k in range(tops[b]):
        if k > 0:
            pv, pi = _best_after(x, V, pv, pi, fbuf, ibuf, tid, nt)
        if tid == 0:
            out_ids[b, 1 + k] = pi
            out_lps[b, 1 + k] = pv - lse


def logprob_rows(logits: DeviceArray, rows: DeviceArray, tops: DeviceArray, sampled: DeviceArray,
                 out_ids: DeviceArray, out_lps: DeviceArray, stream: StreamArg = 0) -> None:
    """For each asking row b (device int32 arrays rows, tops of the same length), fill
    out_ids[b], out_lps[b] (device [>= len(rows), WIDTH]); sampled: the step's drawn ids."""
    if rows.shape[0] == 0:  # a launch of 0 blocks is an error
        return
    _logprob_rows[rows.shape[0], THREADS, stream](logits, rows, tops, sampled, out_ids, out_lps)


def row_results(ids: npt.NDArray[np.int32], lps: npt.NDArray[np.float32],
                tops: Sequence[int]) -> list[RowLogprobs]:
    """The host copies of out_ids/out_lps, as gpu/ops/logprobs.RowLogprobs per asking row."""
    return [RowLogprobs(float(lps[b, 0]), ids[b, 1:1 + n].copy(),
                        lps[b, 1:1 + n].astype(np.float64))
            for b, n in enumerate(tops)]
