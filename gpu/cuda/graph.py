"""A decode step as one CUDA graph: the ~395 kernel launches of CudaForward.launch captured
once per batch shape, then replayed with a single cuGraphLaunch.

Why: at SmolLM2-135M's size the arithmetic of a decode step takes tens of microseconds on an
H200, while launching ~395 kernels from Python costs 7-14 us each. Replaying a graph costs one
launch. The alternative, a persistent kernel fed by a doorbell in mapped memory, removes even
that, but needs the whole forward pass rewritten as one kernel with grid-wide syncs; the graph
reuses the kernels as they are. Which one is needed is decided by measurement on a GPU
(bench/gpu_bench.py, section "graph"); see docs/ARCHITECTURE.md.

Capture needs a step that only launches kernels: fixed device buffers for its inputs (token
ids, sequence ids, positions, logit rows, block tables; staging.Staging), refilled before
each replay with one asynchronous copy on the same stream, and the same (T, splits) as at
capture. The driver's graph API is called through ctypes on libcuda (it works with any
numba-cuda version), on the model's own stream. Not available under the simulator.
"""
from __future__ import annotations

import ctypes

import numpy as np
import numpy.typing as npt

from ..model_api import StepArrays
from ._cuda_shim import SIM, DeviceArray
from .staging import Staging, take_prev

CU_STREAM_CAPTURE_MODE_RELAXED = 2   # numba may call non-capturable APIs (module loads) safely


def _lib():
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
                 "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def stream_ptr(stream) -> int:
    """The CUstream behind a numba stream, across numba-cuda versions."""
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    h = stream.handle
    return int(getattr(h, "value", None) or int(h))


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed (CUresult {rc})")


class DecodeGraph:
    """One captured step of T tokens for sequences with block tables of width `width`."""

    def __init__(self, fwd, T: int, width: int, splits: int):
        if SIM:
            raise RuntimeError("CUDA graphs need a real device (not the simulator)")
        self.fwd, self.T, self.width, self.splits = fwd, T, width, splits
        self.stream = s = fwd.stream  # a stream of its own (CudaModel's), never the legacy one
        fwd.ensure_buffers(T, T)
        self.inputs = Staging(s, np.int32, 5 * T + T * width)
        self._lib = _lib()
        self._graph = ctypes.c_void_p()
        self._exec = ctypes.c_void_p()
        self.logits: DeviceArray | None = None
        # the fused kernel's argmax keys of the captured step, if any
        self.best_keys: DeviceArray | None = None

    def _put(self, a: StepArrays) -> list[DeviceArray]:
        return self.inputs.put(a.tokens, a.tok_seq, a.tok_pos, a.logit_rows, a.tables, a.prev_rows)

    def capture(self, a: StepArrays) -> npt.NDArray[np.float32]:
        """Run the step once uncaptured (compiles every kernel), then capture it. Returns
        the uncaptured run's logits (the reference for replays)."""
        args = (*self._put(a)[:5], self.splits, self.stream)
        ref = self.fwd.launch(*args).copy_to_host(stream=self.stream)
        self.stream.synchronize()
        sp = ctypes.c_void_p(stream_ptr(self.stream))
        _check(self._lib.cuStreamBeginCapture_v2(sp, CU_STREAM_CAPTURE_MODE_RELAXED),
               "cuStreamBeginCapture")
        try:
            self.logits = self.fwd.launch(*args)
            self.best_keys = self.fwd.best_keys
        except BaseException:  # leave capture mode; the launch's own error is the one to report
            self._lib.cuStreamEndCapture(sp, ctypes.byref(self._graph))
            raise
        _check(self._lib.cuStreamEndCapture(sp, ctypes.byref(self._graph)), "cuStreamEndCapture")
        # The graph holds raw pointers: keep every buffer it uses alive, even after the forward
        # pass reallocates its buffers for a larger step.
        f = self.fwd
        self._keep = (f.buffers(), f.partials(self.T, self.splits, self.stream),
                      f.fused and f.fused.scratch(self.T))
        _check(self._lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph,
                                                      ctypes.c_ulonglong(0)),
               "cuGraphInstantiate")
        return ref

    def replay(self, a: StepArrays, prev_ids=None):
        """Refill the inputs (same addresses as captured; tokens taken from the previous
        step's device ids where a.prev_rows says so) and launch the graph on self.stream;
        returns the device logits [T, vocab], not yet synchronised."""
        d_tok, *_, d_prev = self._put(a)
        if a.uses_prev:
            take_prev(d_tok, d_prev, prev_ids, self.stream)
        _check(self._lib.cuGraphLaunch(self._exec, ctypes.c_void_p(stream_ptr(self.stream))),
               "cuGraphLaunch")
        return self.logits

    def close(self) -> None:
        if self._exec:
            self._lib.cuGraphExecDestroy(self._exec)
            self._exec = ctypes.c_void_p()
        if self._graph:
            self._lib.cuGraphDestroy(self._graph)
            self._graph = ctypes.c_void_p()
