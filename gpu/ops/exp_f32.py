"""exp for float32 that LLVM can vectorise.

``np.exp`` in a Numba loop is a call to libm's expf per element: LLVM only vectorises it
with a vector math library (SVML), which Numba's LLVM here does not have. In attention's
softmax (9 heads x depth exps per layer: 270 thousand a decode step at depth 1000) and in
SwiGLU that scalar call was a tenth of a decode step.

``exp_f32`` is the classic range reduction plus polynomial (as in Cephes' expf): with
n = round(x / ln 2) and r = x - n ln 2 (ln 2 split in two so r is exact), exp(x) = 2^n e^r,
e^r a degree-6 polynomial on |r| <= ln(2)/2; 2^n is built in the exponent bits (``_pow2``,
an intrinsic: Numba cannot reinterpret an int32 as a float32). Everything is straight-line
arithmetic and selects, so a loop over it becomes AVX-512/AVX2 code. Accuracy (measured,
tests/test_ops.py): within 1 ulp of the correctly rounded value on [-20, 20], where softmax
and SiLU live, and 4 ulp at the ends of [-87, 88]; below -87.3 it returns 0 (the softmax's
"minus infinity" is -1e30), above 88.37 it saturates at exp(88.37).
Not inlined by Numba but by LLVM, so its own (strict) float semantics survive in a fastmath
caller: the split of ln 2 must not be reassociated away.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)      # ln 2 = _LN2_HI + _LN2_LO; n * _LN2_HI is exact
_LN2_LO = np.float32(-2.12194440e-4)
_HI = np.float32(88.37)    # keeps n <= 127 (2^128 is not a float32)
_LO = np.float32(-87.3)
_P = (np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3),
      np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))


@intrinsic
def _pow2(typingctx, n):
    """2^n as float32 for an integral float32 n in [-126, 127]: (n + 127) << 23 as bits."""
    if n != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        e = builder.add(builder.fptosi(args[0], i32), ir.Constant(i32, 127))
        return builder.bitcast(builder.shl(e, ir.Constant(i32, 23)), ir.FloatType())
    return types.float32(n), codegen


@njit(cache=True, nogil=True)
def exp_f32(x):
    """e^x for a float32 x (see the module doc); vectorises inside a loop."""
    xc = min(max(x, _LO), _HI)
    n = np.floor(xc * _LOG2E + np.float32(0.5))
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = _P[0]
    p = p * r + _P[1]
    p = p * r + _P[2]
    p = p * r + _P[3]
    p = p * r + _P[4]
    p = p * r + _P[5]
    y = (p * r * r + r) + np.float32(1.0)
    out = y * _pow2(n)
    return out if x >= _LO else np.float32(0.0)
