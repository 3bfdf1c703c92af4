"""A decode step as one CUDA graph: the ~395 kernel launches of CudaForward.launch captured
once per batch shape, then replayed with a single cuGraphLaunch.

Why: at SmolLM2-135M's size the arithmetic of a decode step takes tens of microseconds on an
H200, while launching ~395 kernels from Python costs 7-14 us each. Replaying a graph costs one
launch. The alternative, a persistent kernel fed by a doorbell in mapped memory, removes even
that, but needs the whole forward pass rewritten as one kernel with grid-wide syncs; the graph
reuses the kernels as they are. Which one is needed is decided by measurement on a GPU
(bench/gpu_bench.py, section "graph"); see docs/ARCHITECTURE.md.

Capture needs a step that only launches kernels: fixed device buffers for its inputs (token
ids, sequence ids, positions, logit rows, block tables), refilled before each replay with
asynchronous copies on the same stream, and the same (T, splits) as at capture. The driver's
graph API is called through ctypes on libcuda (numba-cuda exposes no graph API), on the
stream numba launches on. Not available under the simulator.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ._cuda_shim import SIM, cuda

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
        self.stream = cuda.stream()
        s = self.stream
        fwd._buffers(T, T)
        i32 = np.int32
        self.d_tok = cuda.device_array(T, i32, stream=s)
        self.d_seq = cuda.device_array(T, i32, stream=s)
        self.d_pos = cuda.device_array(T, i32, stream=s)
        self.d_rows = cuda.device_array(T, i32, stream=s)
        self.d_tab = cuda.device_array((T, width), i32, stream=s)
        # pinned staging: the refills are truly asynchronous
        self.h_in = cuda.pinned_array(4 * T + T * width, i32)
        self._lib = _lib()
        self._graph = ctypes.c_void_p()
        self._exec = ctypes.c_void_p()
        self.logits = None

    def _stage(self, tokens, tok_seq, tok_pos, logit_rows, tables) -> None:
        T, h = self.T, self.h_in
        h[0:T], h[T:2 * T], h[2 * T:3 * T], h[3 * T:4 * T] = tokens, tok_seq, tok_pos, logit_rows
        h[4 * T:] = np.asarray(tables, np.int32).reshape(-1)
        s = self.stream
        self.d_tok.copy_to_device(h[0:T], stream=s)
        self.d_seq.copy_to_device(h[T:2 * T], stream=s)
        self.d_pos.copy_to_device(h[2 * T:3 * T], stream=s)
        self.d_rows.copy_to_device(h[3 * T:4 * T], stream=s)
        self.d_tab.copy_to_device(h[4 * T:].reshape(T, self.width), stream=s)

    def capture(self, tokens, tok_seq, tok_pos, logit_rows, tables) -> np.ndarray:
        """Run the step once uncaptured (compiles every kernel), then capture it. Returns
        the uncaptured run's logits (the reference for replays)."""
        args = (self.d_tok, self.d_seq, self.d_pos, self.d_rows, self.d_tab, self.splits, self.stream)
        self._stage(tokens, tok_seq, tok_pos, logit_rows, tables)
        ref = self.fwd.launch(*args).copy_to_host(stream=self.stream)
        self.stream.synchronize()
        sp = ctypes.c_void_p(stream_ptr(self.stream))
        _check(self._lib.cuStreamBeginCapture_v2(sp, CU_STREAM_CAPTURE_MODE_RELAXED),
               "cuStreamBeginCapture")
        try:
            self.logits = self.fwd.launch(*args)
        finally:
            # The graph holds raw pointers: keep every buffer it uses alive, even after the
            # forward pass reallocates its buffers for a larger step.
            f = self.fwd
            self._keep = (f._x, f._xn, f._tmp, f._qkv, f._att, f._gu, f._h, f._logits,
                          f.partials(self.T, self.splits, self.stream))
            _check(self._lib.cuStreamEndCapture(sp, ctypes.byref(self._graph)), "cuStreamEndCapture")
        _check(self._lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph,
                                                      ctypes.c_ulonglong(0)),
               "cuGraphInstantiate")
        return ref

    def replay(self, tokens, tok_seq, tok_pos, logit_rows, tables) -> np.ndarray:
        """Refill the inputs, launch the graph, return host logits [T, vocab]."""
        self._stage(tokens, tok_seq, tok_pos, logit_rows, tables)
        _check(self._lib.cuGraphLaunch(self._exec, ctypes.c_void_p(stream_ptr(self.stream))),
               "cuGraphLaunch")
        return self.logits.copy_to_host(stream=self.stream)

    def close(self) -> None:
        if self._exec:
            self._lib.cuGraphExecDestroy(self._exec)
            self._exec = ctypes.c_void_p()
        if self._graph:
            self._lib.cuGraphDestroy(self._graph)
            self._graph = ctypes.c_void_p()
