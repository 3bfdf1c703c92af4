"""A step's inputs on the device: host arrays staged through pinned memory into fixed device
buffers (``Staging``), and the kernel that takes a sequence's token from the previous step's
sampled ids still on the device (``take_prev``, for overlapped steps).

Fixed buffers are what a captured CUDA graph needs (graph.py): views of the same shapes
always start at the same device addresses.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ._cuda_shim import DeviceArray, StreamArg, cuda, grid_1d, kernel


@kernel(["void(int32[::1], int32[::1], int32[::1])"])
def _take_prev(tokens, prev_rows, prev_ids):
    """tokens[i] = prev_ids[prev_rows[i]] where prev_rows[i] >= 0: the ids the previous step
    sampled, still on the device, become this step's inputs (overlapped steps)."""
    for i in range(cuda.grid(1), tokens.shape[0], cuda.gridsize(1)):
        r = prev_rows[i]
        if r >= 0:
            tokens[i] = prev_ids[r]


def take_prev(d_tok: DeviceArray, d_prev_rows: DeviceArray, prev_ids: DeviceArray,
              stream: StreamArg) -> None:
    blocks, threads = grid_1d(d_tok.shape[0])
    _take_prev[blocks, threads, stream](d_tok, d_prev_rows, prev_ids)


class Staging:
    """Host arrays packed into a pinned buffer and copied to one device buffer: one
    host-to-device copy per step and no allocation. Views of the same shapes always start at
    the same device addresses (what a captured graph needs). Two pinned buffers alternate:
    with at most two steps in flight, a buffer is refilled only after the step before the
    previous one finished (the engine waited for it), so never while a copy from it is still
    queued. The device buffer needs no pair: the stream orders each copy after the kernels
    that read the previous contents."""

    def __init__(self, stream: StreamArg, dtype: type[np.int32] | type[np.uint32] | type[np.float32],
                 capacity: int = 0):
        self.stream, self.dtype = stream, np.dtype(dtype)
        self.capacity = 0
        self._turn = 0
        self._grow(capacity)

    def _grow(self, n: int) -> None:
        if n <= self.capacity:
            return
        cap = max(1024, 1 << (n - 1).bit_length())
        # (a larger pair replaces the old one only between steps: a copy already queued
        # from the old buffers keeps them alive through the stream's reference)
        self._hosts = (cuda.pinned_array(cap, self.dtype), cuda.pinned_array(cap, self.dtype))
        self.dev = cuda.device_array(cap, self.dtype, stream=self.stream)
        self.capacity = cap

    def put(self, *given: npt.ArrayLike) -> list[DeviceArray]:
        """Copy the arrays to the device; returns their device views, same shapes."""
        arrays = [np.asarray(a, self.dtype) for a in given]
        ends = np.cumsum([a.size for a in arrays])
        self._grow(int(ends[-1]))
        views, start = [], 0
        self._turn ^= 1
        host = self._hosts[self._turn]
        for a, end in zip(arrays, ends):
            host[start:end] = a.reshape(-1)
            views.append(self.dev[start:end].reshape(a.shape) if a.ndim > 1 else self.dev[start:end])
            start = end
        self.dev[:start].copy_to_device(host[:start], stream=self.stream)
        return views
