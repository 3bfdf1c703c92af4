"""The CPU's time-stamp counter inside compiled code, for timing the kernels of one forward.

Timing from Python around each kernel would add a dispatch per call (several µs: more than
an RMSNorm takes); reading the counter costs tens of cycles. It is LLVM's readcyclecounter
(rdtsc on x86), constant-rate on any CPU that lists constant_tsc / nonstop_tsc; a caller
converts ticks to seconds against perf_counter.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def tsc(typingctx):
    """The time-stamp counter (int64 ticks)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(cache=True, nogil=True)
def tsc_now():
    return tsc()  # type: ignore[call-arg]  # the compiler passes typingctx


@njit(cache=True, nogil=True, inline="always")
def clock_start(acc):
    """The counter now, or 0 when acc is None (see lap)."""
    if acc is None:
        return 0
    return tsc()  # type: ignore[call-arg]  # (as above)


@njit(cache=True, nogil=True, inline="always")
def lap(acc, c, t):
    """acc[c] += the ticks since t; returns the counter now. With acc None, t comes back and
    nothing is read: Numba compiles a None argument as its own specialization and prunes the
    branch, so an untimed caller's code has no trace of the timer."""
    if acc is None:
        return t
    now: int = tsc()  # type: ignore[call-arg]  # (as above)
    acc[c] += now - t
    return now
