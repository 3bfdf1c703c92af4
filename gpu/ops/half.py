"""float16 storage for the CPU kernels.

Numba's CPU target has no float16 type, so half-precision data lives in uint16 arrays (the
IEEE binary16 bits) and is converted by these two intrinsics, which are plain LLVM
``fpext``/``fptrunc`` on ``half``: inside a loop, LLVM's vectoriser turns them into F16C's
vcvtph2ps / vcvtps2ph (16 values per instruction on AVX-512), so reading a float16 array costs
no more instructions than reading a float32 one, and half the memory traffic.

Both are generic over float32: ``as_f32`` of a float32 is the value itself and ``to_storage``
into a float32 array stores the value, so a kernel written with them runs on float32 pools (the
CUDA kernels' twin tests) and on float16 ones (the CPU model's KV cache) alike.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

_HALF = ir.HalfType()


@intrinsic
def as_f32(typingctx, v):
    """float16 bits (uint16) -> float32; a float32 unchanged."""
    if v == types.float32:
        return types.float32(v), lambda context, builder, sig, args: args[0]
    if v != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], _HALF), ir.FloatType())
    return types.float32(v), codegen


@intrinsic
def to_storage(typingctx, x, like):
    """float32 x as the element type of the array `like`: float16 bits (round to nearest even)
    for a uint16 array, x itself for a float32 one."""
    if not isinstance(like, types.Array):
        return None
    if like.dtype == types.float32:
        return types.float32(x, like), lambda context, builder, sig, args: context.cast(
            builder, args[0], sig.args[0], types.float32)
    if like.dtype != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        f = context.cast(builder, args[0], sig.args[0], types.float32)
        return builder.bitcast(builder.fptrunc(f, _HALF), ir.IntType(16))
    return types.uint16(x, like), codegen


def half_bits(a: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """float array -> float16 bits (uint16), as the kernels store them."""
    return np.asarray(a, np.float32).astype(np.float16).view(np.uint16)


def from_half_bits(a: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    """float16 bits (uint16) -> float32."""
    return np.asarray(a).view(np.float16).astype(np.float32)
