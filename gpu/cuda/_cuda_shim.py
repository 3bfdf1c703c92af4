"""The one place CUDA kernels get ``cuda`` from, and what hides the simulator's gaps.

Backend: ``ZEROLAYER_GPU_BACKEND=sim`` turns on Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``, set by gpu/backend.py when zerolayer.gpu is imported, before
``numba.cuda``); the simulator can only be chosen then, once per process. Anything else
leaves the real CUDA target (which needs a driver only to *launch*; compiling to PTX works
without a GPU, see tests/test_cuda_ptx.py).

Every kernel module does ``from ._cuda_shim import cuda`` and uses ``cuda.*`` through that
module-level global: the simulator runs a kernel as plain Python, one thread per CUDA thread,
after swapping every module global that *is* ``numba.cuda`` for its fake module.

What the simulator lacks and the shim supplies:

* warp shuffles: ``shfl_xor`` is ``cuda.shfl_xor_sync`` on the device; in the simulator it
  is emulated with a scratch dict and the simulator's block barrier, which is exact as long
  as every thread of the block makes the call (true of ``warp_sum``/``block_sum`` as used
  here). Each emulated shuffle costs a block barrier, which in the simulator is slow: kernels
  keep shuffles to their final reductions.
* a thread-safe ``cuda.shared.array`` (the simulator's own can give two threads of a block
  two different arrays).
* bit casts: ``float_bits`` (libdevice's ``float_as_int`` on the device, a numpy view in
  the simulator, whose libdevice functions return None).
* launch sizes: ``grid_1d`` caps grid-stride launches in the simulator, where each thread
  is a Python thread; kernels whose block shape is part of their design keep it.
* ``kernel(sigs)`` registers each kernel with the signatures it is launched with, so the PTX
  test compiles exactly those (``KERNELS``).

Kernels are float32 only: every float literal in a kernel is wrapped in ``float32(...)``,
since a bare Python float is float64 and would promote the arithmetic around it. The PTX
test fails on any ``.f64`` in the output.
"""
from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from typing import Protocol, TypeAlias

import numpy as np  # noqa: E402

from .. import backend  # noqa: E402,F401  (ZEROLAYER_GPU_BACKEND=sim turns the simulator on)

# A decode step's launches are mostly small grids (one token): Numba would build and raise a
# low-occupancy performance warning at each of them, which costs on the launch path. Small
# grids are by design here.
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
from numba import cuda, float32  # noqa: E402

try:  # numba-cuda >= 0.2x keeps its own config; older ones read numba's
    from numba.cuda.core import config as _cuda_config  # noqa: E402
except ImportError:  # pragma: no cover
    from numba.core import config as _cuda_config  # noqa: E402

SIM = bool(_cuda_config.ENABLE_CUDASIM)
if SIM:
    MEMORY = "simulator (host memory)"
else:  # before any CUDA context exists: device memory from CuPy's pool (cupy_memory.py)
    try:
        from .cupy_memory import install as _install_memory
        MEMORY = _install_memory()
    except Exception as e:  # an older numba-cuda or a broken CuPy: Numba's allocator still works
        MEMORY = f"numba (the CuPy plugin is unavailable: {type(e).__name__}: {e})"
FULL_MASK = 0xFFFFFFFF
WARP = 32


class DeviceArray(Protocol):
    """What host code reads of an array it hands to a kernel: numba's DeviceNDArray, the
    simulator's FakeCUDAArray, or a host array (numpy's) the simulator is given."""
    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def size(self) -> int: ...

    def __len__(self) -> int: ...


class Stream(Protocol):
    """A CUDA stream (numba's, or the simulator's)."""
    def synchronize(self) -> None: ...


StreamArg: TypeAlias = "Stream | int"  # 0: the default stream


class Event(Protocol):
    """A CUDA event (numba's, or the simulator's)."""
    def record(self, stream: StreamArg = 0) -> None: ...

    def synchronize(self) -> None: ...
# a launch's [blocks, threads, stream(, shared bytes)]; blocks and threads ints or tuples
LaunchConfig: TypeAlias = "tuple[int | tuple[int, ...] | Stream, ...]"


# what a kernel is called with: device arrays and scalars
KernelArg: TypeAlias = "DeviceArray | int | float | np.float32 | np.int32 | np.int64 | np.uint32"


class Launch(Protocol):
    """A kernel configured for a launch: called with its arguments, it launches."""
    def __call__(self, *args: KernelArg) -> None: ...


class Dispatcher(Protocol):
    """A ``cuda.jit`` kernel: indexed by its launch configuration, it launches."""
    def __getitem__(self, config: LaunchConfig) -> Launch: ...

# (name, kernel, [signature, ...]) of every kernel; see kernel()
KERNELS: list[tuple[str, object, list[str]]] = []
# kernel name -> launches since the counter was last cleared: what a step costs in kernel
# nodes, counted the same way on a GPU and under the simulator (tests/test_cuda_fused.py)
LAUNCHES: Counter = Counter()


class CountedKernel:
    """A compiled kernel whose launches are counted in LAUNCHES; anything else is the
    dispatcher's own (the PTX test reads ``py_func`` and ``targetoptions`` through it)."""

    def __init__(self, name: str, dispatcher: Dispatcher):
        self.name, self.raw = name, dispatcher

    def __getitem__(self, config):
        launch = self.raw[config]
        name = self.name

        def counted(*args):
            LAUNCHES[name] += 1
            return launch(*args)
        return counted

    def __getattr__(self, attr):
        return getattr(self.raw, attr)


def kernel(sigs: list[str], name: str | None = None):
    """``cuda.jit(fastmath=True)``, lazily compiled, registered with its launch signatures,
    launches counted (CountedKernel)."""
    def deco(fn):
        k = cuda.jit(fastmath=True)(fn)
        full = name or f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
        KERNELS.append((full, k, list(sigs)))
        return CountedKernel(full, k)
    return deco


def device(fn):
    """A device helper, inlined into its callers at the Numba IR level. (Inlining also keeps
    PTX compilation driver-free: a separately compiled device function asks the driver for
    the current device's compute capability.)"""
    return cuda.jit(device=True, inline="always", fastmath=True)(fn)


def grid_1d(n: int, threads: int = 256) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride kernel over n items. The simulator pays for every
    thread it starts, so there the grid is capped at 2 blocks of 64 threads: the same
    grid-stride loop, just more trips per thread."""
    if SIM:
        threads = min(threads, 64)
        return min(2, (n + threads - 1) // threads), threads
    return (n + threads - 1) // threads, threads


def new_event():
    """A CUDA event for ordering (no timestamps: cheaper to record and wait on). The
    simulator's ``event`` takes no arguments."""
    return cuda.event() if SIM else cuda.event(timing=False)


def device_available() -> bool:
    """A real GPU and driver are usable (always False under the simulator)."""
    if SIM:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # no driver library at all
        return False


if SIM:
    from numba.cuda.simulator import kernelapi as _sim_api

    _shared_lock = threading.Lock()

    def _shared_array(self, shape, dtype, alignment=None):
        """The simulator's cuda.shared.array, made thread-safe: it finds a block's array by the
        calling source line, but creates it unlocked, so two threads arriving together could
        each make their own and never see each other's writes (seen here: a matmul result of
        1e30 in one run of a few)."""
        if shape == 0 or alignment is not None:  # dynamic shared memory: no lookup involved
            return _sim_shared_array(self, shape, dtype, alignment)
        if isinstance(dtype, _sim_api.types.Type):  # the simulator's own types and converter
            dtype = _sim_api.numpy_support.as_dtype(dtype)
        f = sys._getframe(1)
        caller = (f.f_code.co_filename, f.f_lineno)
        with _shared_lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    _sim_shared_array = _sim_api.FakeCUDAShared.array
    _sim_api.FakeCUDAShared.array = _shared_array

    _scratch_lock = threading.Lock()

    def shfl_xor(v, lanemask):
        # Each lane posts its value, the block meets at the simulator's barrier, each lane
        # reads its partner's. Two scratch dicts alternate between successive calls, so one
        # barrier per call suffices: a lane can only come back to a dict after every lane
        # has passed the next call's barrier, i.e. has finished reading it.
        th = threading.current_thread()
        with _scratch_lock:
            bufs = th._manager.__dict__.setdefault("_zl_shfl", ({}, {}))
        parity = th.__dict__.get("_zl_parity", 0)
        th._zl_parity = parity ^ 1
        scratch = bufs[parity]
        tid = th.thread_id
        scratch[tid] = v
        th.syncthreads()
        return scratch.get(tid ^ lanemask, v)
else:
    @device
    def shfl_xor(v, lanemask):
        return cuda.shfl_xor_sync(FULL_MASK, v, lanemask)


if SIM:
    def float_bits(x):
        """The bits of a float32 as an int32 (the simulator's libdevice is a stub)."""
        return int(np.float32(x).view(np.int32))
else:
    from numba.cuda import libdevice as _libdevice

    @device
    def float_bits(x):
        """The bits of a float32 as an int32 (a register move on the device)."""
        return _libdevice.float_as_int(x)



if SIM:
    @device
    def thread_index():
        """cuda.threadIdx.x (the simulator runs Python; nothing is hoisted there)."""
        return cuda.threadIdx.x
else:
    from llvmlite import ir as _ir
    from numba.core import types as _types
    from numba.cuda.extending import intrinsic as _intrinsic

    @_intrinsic
    def _tid_x(typingctx):
        def codegen(context, builder, sig, args):
            asm = _ir.InlineAsm(_ir.FunctionType(_ir.IntType(32), []), "mov.u32 $0, %tid.x;",
                                "=r", side_effect=True)
            return builder.call(asm, [])
        return _types.int32(), codegen

    @device
    def thread_index():
        """cuda.threadIdx.x, read afresh: LLVM treats the special register as a constant and
        hoists what a persistent kernel derives from it out of its stage loop, where the
        derived indices of every stage stay live in registers through every other stage.
        Read here at the top of a stage, they are derived again and live for that stage."""
        return _tid_x()  # type: ignore[call-arg]  # the compiler passes typingctx


if SIM:
    def load16(words, i):
        """words[i : i + 4] (a uint32 array, i a multiple of 4) as four values."""
        return words[i], words[i + 1], words[i + 2], words[i + 3]
else:
    from numba.core import cgutils as _cgutils

    def _item_address(context, builder, sig, args):
        """The 64-bit (generic) address of ary[i] for an intrinsic called (ary, i); the
        inline PTX converts it to the global space."""
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = _cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]],
                                        wraparound=False)
        return builder.ptrtoint(ptr, _ir.IntType(64))

    @_intrinsic
    def _ldg_v4(typingctx, words, i):
        """One 16-byte load through the read-only data cache: ld.global.nc.v4.u32. LLVM
        splits a plain <4 x i32> load into four 32-bit ones when its lanes are used apart."""
        def codegen(context, builder, sig, args):
            addr = _item_address(context, builder, sig, args)
            u32 = _ir.IntType(32)
            asm = _ir.InlineAsm(
                _ir.FunctionType(_ir.LiteralStructType([u32] * 4), [_ir.IntType(64)]),
                "{\n\t.reg .u64 %gp;\n\tcvta.to.global.u64 %gp, $4;\n\t"
                "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [%gp];\n\t}",
                "=r,=r,=r,=r,l")
            out = builder.call(asm, [addr])
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_value(out, k) for k in range(4)])
        return _types.UniTuple(_types.uint32, 4)(words, _types.uint64), codegen

    @device
    def load16(words, i):
        """words[i : i + 4] of a uint32 array in one 16-byte load; i (uint64) a multiple of
        4 and the array's data 16-byte aligned (a device allocation is 256-byte aligned)."""
        return _ldg_v4(words, i)  # type: ignore[call-arg]  # the compiler passes typingctx


if SIM:
    def prefetch_l2(ary, i):
        """Nothing to warm in the simulator."""
else:
    @_intrinsic
    def _prefetch_l2(typingctx, ary, i):
        """prefetch.global.L2 of the line holding ary[i]: the load that follows finds it in L2."""
        def codegen(context, builder, sig, args):
            asm = _ir.InlineAsm(
                _ir.FunctionType(_ir.VoidType(), [_ir.IntType(64)]),
                "{\n\t.reg .u64 %gp;\n\tcvta.to.global.u64 %gp, $0;\n\t"
                "prefetch.global.L2 [%gp];\n\t}", "l", side_effect=True)
            builder.call(asm, [_item_address(context, builder, sig, args)])
            return context.get_dummy_value()
        return _types.void(ary, _types.uint64), codegen

    @device
    def prefetch_l2(ary, i):
        """Warm L2 with the line of ary[i] (i uint64), without waiting for it."""
        _prefetch_l2(ary, i)  # type: ignore[call-arg]  # the compiler passes typingctx


@device
def warp_sum(v):
    """Sum over the 32 lanes of a warp, returned to every lane (butterfly)."""
    v += shfl_xor(v, 16)
    v += shfl_xor(v, 8)
    v += shfl_xor(v, 4)
    v += shfl_xor(v, 2)
    v += shfl_xor(v, 1)
    return v


@device
def warp_max(v):
    v = max(v, shfl_xor(v, 16))
    v = max(v, shfl_xor(v, 8))
    v = max(v, shfl_xor(v, 4))
    v = max(v, shfl_xor(v, 2))
    v = max(v, shfl_xor(v, 1))
    return v


@device
def block_sum(v, buf, tid, nthreads):
    """Sum of v over the block, returned to every thread. buf: shared float32[>= nthreads/32].
    Every thread of the block must call it; nthreads must be a multiple of 32."""
    v = warp_sum(v)
    lane = tid % WARP
    if lane == 0:
        buf[tid // WARP] = v
    cuda.syncthreads()
    v = buf[lane] if lane < nthreads // WARP else float32(0.0)
    v = warp_sum(v)
    cuda.syncthreads()  # buf may be reused right after
    return v


@device
def block_best(best, arg, vals, ids, tid, nthreads):
    """The (value, id) pair that comes first in (value descending, id ascending) order over
    the block's threads, returned to every thread. vals, ids: shared float32/int32
    [>= nthreads]; nthreads a power of two; every thread of the block must call it."""
    vals[tid], ids[tid] = best, arg
    cuda.syncthreads()  # type: ignore[call-arg]  # the compiler passes typingctx
    s = nthreads // 2
    while s > 0:
        if tid < s:
            ob, oa = vals[tid + s], ids[tid + s]
            if ob > vals[tid] or (ob == vals[tid] and oa < ids[tid]):
                vals[tid], ids[tid] = ob, oa
        cuda.syncthreads()
        s //= 2
    best, arg = vals[0], ids[0]
    cuda.syncthreads()  # vals and ids may be reused right after
    return best, arg


@kernel(["void(float32[::1], float32[::1], float32[::1], float32[::1])"], name="_cuda_shim.selftest")
def selftest(x, wsum, wmax, bsum):
    """The shim's reductions on one block (tests: simulator, PTX, device): per thread, the
    sum and max of its warp's x, and the sum of the block's x."""
    tid = cuda.threadIdx.x
    buf = cuda.shared.array(32, float32)
    v = x[tid]
    wsum[tid] = warp_sum(v)
    wmax[tid] = warp_max(v)
    bsum[tid] = block_sum(v, buf, tid, cuda.blockDim.x)
