"""The matmuls of large prefill steps on tensor cores: each layer's quantized weight is
dequantized (dequant.py) into a float16 scratch buffer that the next weight reuses, the
activations are cast to float16, and cuBLAS multiplies them with float32 accumulation into
the float32 activation buffers the per-op kernels read (forward.py runs the rest of the
layer: rmsnorm, bias, RoPE, KV write, attention, SwiGLU, residual).

    y[T, R] = x[T, K] @ W[R, K]^T     as  cublasGemmEx(op(W) = T, op(x) = N, m=R, n=T, k=K,
                                           A, B: CUDA_R_16F, C: CUDA_R_32F, CUBLAS_COMPUTE_32F)

(cuBLAS is column-major: row-major y[T, R] is a column-major R x T matrix with ldc = R, and
row-major W[R, K] is W^T column-major with lda = K, hence op(W) = T.) CuPy 14's own float16
matmul (cupy/_core/_routines_linalg.pyx, tensordot_core) calls the same gemmEx with
CUBLAS_COMPUTE_32F and CUBLAS_GEMM_DEFAULT_TENSOR_OP, but writes a float16 result; calling
gemmEx here keeps the float32 result, straight into the buffer the next kernel reads, with
no cast back and no copy. CuPy sets the cuBLAS handle's stream to its current stream, so
each call runs under an ExternalStream of the model's own stream: in order with the Numba
launches around it.

Only steps of at least MIN_TOKENS tokens take this path (forward.py decides; decode steps
keep the fused kernel or per-op launches, and CUDA graphs, which CuPy's cuBLAS calls refuse
to be captured into). Why 64, from bytes alone: the tiled Numba matmul re-reads a Q4_1
weight (0.5 byte of nibbles + 0.25 of scales a weight) once per 8-token tile, while this
path reads it once, writes and reads it again as float16 (4 bytes): 4.75 / 0.75 ~ 6 tiles,
~50 tokens, before the tensor cores' arithmetic counts at all. 64 is that rounded up to the
next power of two; the GPU check times both paths at 512 tokens (bench/gpu_bench.py).

ZEROLAYER_CUDA_PREFILL_GEMM=0 turns the path off; ZEROLAYER_CUDA_PREFILL_GEMM_MIN_TOKENS
moves the threshold. Under the simulator ``gemm_f16`` runs the same arithmetic with numpy
(float16 inputs, float32 products and sums), so CI checks the whole path against the CPU
model.
"""
from __future__ import annotations

import os

import numpy as np

from ..quant import FMT_F32, FMT_Q4, LANES, QK
from . import dequant as _dq
from . import matmul as _mm
from ._cuda_shim import SIM, cuda

MIN_TOKENS = 64
ENV_SWITCH = "ZEROLAYER_CUDA_PREFILL_GEMM"
ENV_MIN_TOKENS = "ZEROLAYER_CUDA_PREFILL_GEMM_MIN_TOKENS"


def _ptr(a):
    return int(a.__cuda_array_interface__["data"][0])


class _Cublas:
    """CuPy's cuBLAS handle and the constants of one float16-in, float32-out GEMM."""

    def __init__(self) -> None:
        import cupy
        from cupy_backends.cuda.libs import cublas  # loads libcublas: fails here if absent
        self.cupy, self.lib = cupy, cublas
        cupy.cuda.device.get_cublas_handle()  # created now: a failure shows at load time
        rt = cupy.cuda.runtime
        self.f16, self.f32 = rt.CUDA_R_16F, rt.CUDA_R_32F
        self.one = np.ones(1, np.float32)    # alpha, beta: host pointers (the handle's
        self.zero = np.zeros(1, np.float32)  # default pointer mode), kept alive here
        self._streams: dict[int, object] = {}

    def stream(self, s):
        from .graph import stream_ptr
        p = s if isinstance(s, int) else stream_ptr(s)
        ext = self._streams.get(p)
        if ext is None:
            ext = self._streams[p] = self.cupy.cuda.ExternalStream(p)
        return ext

    def gemm(self, x16, w16, y, s):
        T, K = x16.shape
        R = y.shape[1]
        lib = self.lib
        # CuPy keeps a handle per thread (the engine's thread steps the model), and sets its
        # stream to CuPy's current one: the model's, here
        handle = self.cupy.cuda.device.get_cublas_handle()
        with self.stream(s):
            lib.gemmEx(handle, lib.CUBLAS_OP_T, lib.CUBLAS_OP_N, R, T, K,
                       self.one.ctypes.data, _ptr(w16), self.f16, K,
                       _ptr(x16), self.f16, K,
                       self.zero.ctypes.data, _ptr(y), self.f32, R,
                       lib.CUBLAS_COMPUTE_32F, lib.CUBLAS_GEMM_DEFAULT_TENSOR_OP)


_CUBLAS: _Cublas | None = None


def gemm_f16(x16, w16, y, stream=0):
    """y[T, R] (float32) = x16[T, K] @ w16[:R, :K]^T (float16): float32 products and sums.
    y must be row-contiguous with R columns; w16 may have more rows (the padding of a row
    group). On the device: cublasGemmEx on tensor cores; under the simulator: numpy."""
    T, K = x16.shape
    R = y.shape[1]
    if not T or not R:
        return
    assert w16.shape[1] == K and w16.shape[0] >= R, (x16.shape, w16.shape, y.shape)
    if SIM:
        y[:] = np.asarray(x16).astype(np.float32) @ np.asarray(w16)[:R].astype(np.float32).T
        return
    global _CUBLAS
    if _CUBLAS is None:
        _CUBLAS = _Cublas()
    assert y.strides[1] == 4 and y.strides[0] == 4 * R, y.strides
    _CUBLAS.gemm(x16, w16, y, stream)


def unavailable() -> str | None:
    """Why the path can't run here (None: it can): switched off, or no cuBLAS."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "off", "false", "no"):
        return f"{ENV_SWITCH}=0"
    if SIM:
        return None
    global _CUBLAS
    try:
        if _CUBLAS is None:
            _CUBLAS = _Cublas()
    except Exception as e:  # no CuPy, or no libcublas for it
        return f"cuBLAS unavailable: {type(e).__name__}: {e}"
    return None


def min_tokens() -> int:
    v = os.environ.get(ENV_MIN_TOKENS, "").strip()
    return max(1, int(v)) if v else MIN_TOKENS


def _rows(w):
    """Rows of one layer's uploaded weight (qs, d, m, w), padding rows included."""
    qs, d, m, w32 = w
    return int(w32.shape[0]) if d is None else int(d.shape[0]) * LANES


def _cols(fmt, w):
    """Columns (K) of one layer's uploaded weight: blocks times weights a block."""
    qs, d, m, w32 = w
    if fmt == FMT_F32:
        return int(w32.shape[1])
    return int(d.shape[1]) * (QK if fmt == FMT_Q4 else int(qs.shape[3]))


class TensorGemm:
    """The float16 scratch of one model (a weight's rows, an activation's rows, reused by
    every matmul of a step) and the matmul that forward.py calls in place of matmul.matmul
    for steps of at least ``min_tokens`` tokens."""

    def __init__(self, weights, stream, min_tok):
        """weights: forward.py's uploaded weights, (fmt, per-layer (qs, d, m, w)), every one
        this path may dequantize: sizes the weight scratch."""
        self.min_tokens = min_tok
        self.stream = stream
        need = max(_rows(lw[0]) * _cols(fmt, lw[0]) for fmt, lw in weights)
        self.width = max(_cols(fmt, lw[0]) for fmt, lw in weights)  # the widest K
        self._w16 = cuda.device_array(need, np.float16, stream=stream)
        self._x16 = cuda.device_array(0, np.float16, stream=stream)
        self._x16_retired = None
        self._views: dict[tuple, object] = {}

    @property
    def path(self) -> str:
        """The path in words, as the GPU check prints it."""
        return (f"cuBLAS float16 GEMMs on tensor cores for steps of >= {self.min_tokens} "
                "tokens (weights dequantized per layer), per-op kernels for the rest")

    def _view(self, buf, which, rows, cols):
        key = (which, rows, cols, id(buf))
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = buf[:rows * cols].reshape(rows, cols)
        return v

    def ensure(self, T: int) -> None:
        """Room for T activation rows of the widest K in float16 (grown by powers of two;
        the old buffer is kept one more growth: a step still queued may read it)."""
        if self._x16.shape[0] < T * self.width:
            cap = max(16, 1 << (T - 1).bit_length()) * self.width
            self._x16_retired = self._x16
            self._x16 = cuda.device_array(cap, np.float16, stream=self.stream)
            self._views = {k: v for k, v in self._views.items() if k[0] != "x"}

    def matmul(self, weight, layer, x, y, s):
        """y[T, R] = x[T, K] @ W[layer]^T for forward.py's weight (fmt, per-layer arrays);
        steps below min_tokens rows go to matmul.matmul."""
        fmt, lw = weight
        qs, d, m, w = arrs = lw[layer]
        T, K = x.shape
        # below the threshold, or a weight the scratch wasn't sized for (the LM head: see
        # forward.py): the tiled kernel
        if T < self.min_tokens or _rows(arrs) * K > self._w16.shape[0]:
            _mm.matmul(fmt, qs, d, m, w, x, y, stream=s)
            return
        R = y.shape[1]
        self.ensure(T)
        w16 = self._view(self._w16, "w", R, K)
        x16 = self._view(self._x16, "x", T, K)
        _dq.dequantize(fmt, qs, d, m, w, w16, stream=s)
        _dq.to_half(x, x16, s)
        gemm_f16(x16, w16, y, s)
