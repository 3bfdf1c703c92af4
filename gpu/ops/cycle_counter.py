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
    """The counter now, or 0 with an empty acc (see lap)."""
    return tsc() if acc.shape[0] else 0  # type: ignore[call-arg]  # (as above)


@njit(cache=True, nogil=True, inline="always")
def lap(acc, c, t):
    """acc[c] += the ticks since t; returns the counter now. With an empty acc nothing is
    read and t comes back, so an untimed forward pays one compare a kernel."""
    if acc.shape[0] == 0:
        return t
    now: int = tsc()  # type: ignore[call-arg]  # (as above)
    acc[c] += now - t
    return now
