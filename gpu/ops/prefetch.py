"""Software prefetch, for streams the hardware prefetchers lose: they do not cross a 4 KiB
page, and a paged KV cache or a row group's weight blocks are read in runs of a few KiB
each. ``emit`` writes the instruction into an intrinsic's IR (gpu/ops/int8_matmul.py);
``prefetch`` is the same from Numba code: the cache line holding arr's flat element i."""
from __future__ import annotations

from collections.abc import Callable
from typing import cast

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.base import BaseContext
from numba.core.types.abstract import Type
from numba.core.typing.templates import Signature
from numba.extending import intrinsic

_I8P = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)
_Codegen = Callable[[BaseContext, ir.IRBuilder, Signature, tuple[ir.Value, ...]], ir.Value]


def emit(builder: ir.IRBuilder, ptr: ir.Value) -> None:
    """A read prefetch of the line at ptr into every cache level (x86 prefetcht0). It never
    faults, so an address past an array's end is harmless."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32]), "llvm.prefetch.p0")
    # (read, locality 3: keep in all levels, data cache)
    builder.call(fn, [builder.bitcast(ptr, _I8P), ir.Constant(_I32, 0), ir.Constant(_I32, 3),
                      ir.Constant(_I32, 1)])


def _prefetch(typingctx: object, arr: Type, i: Type
              ) -> tuple[Signature, _Codegen]:
    """Prefetch the line of arr's flat (C-order) element i."""
    sig = types.void(arr, i)

    def codegen(context: BaseContext, builder: ir.IRBuilder, signature: Signature,
                args: tuple[ir.Value, ...]) -> ir.Value:
        a = context.make_array(signature.args[0])(context, builder, args[0])
        k = context.cast(builder, args[1], signature.args[1], types.int64)
        emit(builder, builder.gep(a.data, [k]))
        return context.get_dummy_value()

    return sig, codegen


# typed as it is called from compiled code (mypy sees the typing function's signature)
prefetch = cast(Callable[[object, int], None], intrinsic(_prefetch))
