"""Sampling penalties on the device, the twin of gpu/ops/penalties.py: one block per
penalised logit row, its threads over the row's token ids, between the forward pass and the
sampler (sampling.py), so the logits never leave the GPU.

A step's penalties come packed (``pack``): the penalised rows, their factors (repetition,
presence, frequency) and two id lists in CSR form: the distinct ids of the prompt and output
(repetition) and the distinct output ids with their counts (presence, frequency). Each list
holds an id once, so no two threads write one logit; the repetition pass finishes (a block
barrier) before the additive one, the CPU twin's order.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from numba import float32

from ..ops.penalties import Penalty
from ._cuda_shim import SIM, DeviceArray, StreamArg, cuda, kernel

THREADS = 32 if SIM else 128


@kernel(["void(float32[:, ::1], int32[::1], float32[:, ::1], int32[::1], int32[::1], "
         "int32[::1], int32[::1], float32[::1])"])
def _penalize(logits, rows, factors, seen_ptr, seen, out_ptr, out_ids, out_cnt):
    b = cuda.blockIdx.x
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    r = rows[b]
    rep, pres, freq = factors[b, 0], factors[b, 1], factors[b, 2]
    if rep != float32(1.0):
        for i in range(seen_ptr[b] + tid, seen_ptr[b + 1], nt):
            t = seen[i]
            z = logits[r, t]
            logits[r, t] = z / rep if z > float32(0.0) else z * rep
    cuda.syncthreads()
    for i in range(out_ptr[b] + tid, out_ptr[b + 1], nt):
        t = out_ids[i]
        logits[r, t] = logits[r, t] - (pres + freq * out_cnt[i])


def pack(penalties: Sequence[Penalty | None] | None,
         ) -> tuple[tuple[npt.NDArray[np.int32], ...], tuple[npt.NDArray[np.float32], ...]] | None:
    """Per logit row a Penalty or None -> (int32 arrays: rows, seen_ptr, seen, out_ptr,
    out_ids; float32 arrays: factors [n, 3], out_counts), or None when no row has any."""
    given = list(penalties or ())
    rows = [r for r, p in enumerate(given) if p is not None]
    if not rows:
        return None
    ps = [p for p in given if p is not None]
    seen_ptr = np.concatenate([[0], np.cumsum([p.seen.size for p in ps])]).astype(np.int32)
    out_ptr = np.concatenate([[0], np.cumsum([p.out_ids.size for p in ps])]).astype(np.int32)
    # (a zero-length list still gets one padding element: device views are never empty)
    seen = np.concatenate([p.seen for p in ps] + [np.zeros(1, np.int32)]).astype(np.int32)
    out_ids = np.concatenate([p.out_ids for p in ps] + [np.zeros(1, np.int32)]).astype(np.int32)
    out_cnt = np.concatenate([p.out_counts for p in ps] + [np.zeros(1, np.float32)])
    factors = np.array([[p.repetition, p.presence, p.frequency] for p in ps], np.float32)
    ints = (np.asarray(rows, np.int32), seen_ptr, seen, out_ptr, out_ids)
    return ints, (factors, out_cnt.astype(np.float32))


def apply_rows(logits: DeviceArray, ints: Sequence[DeviceArray], floats: Sequence[DeviceArray],
               stream: StreamArg = 0) -> None:
    """Penalise the rows of device logits [rows, vocab] given pack()'s arrays, already on the
    device (ints: rows, seen_ptr, seen, out_ptr, out_ids; floats: factors, out_counts)."""
    rows, seen_ptr, seen, out_ptr, out_ids = ints
    factors, out_cnt = floats
    _penalize[rows.shape[0], THREADS, stream](logits, rows, factors, seen_ptr, seen, out_ptr,
                                              out_ids, out_cnt)
