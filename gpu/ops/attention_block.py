"""One KV block of attention with the accumulators in registers: two Numba intrinsics that
write their LLVM IR themselves (as gpu/ops/int8_matmul.py's block_dot does).

Numba's loops keep an accumulator array in memory, so a score update ``sc[s] += q_i k[i, s]``
costs a load and a store per multiply-add, and the store port, not the FMA units, sets the
pace; each query head of a GQA group also converted the block's float16 keys again. Here:

* ``block_scores``: S[g, s] = sum_i Q[g, i] K^T[i, s] for the 64 positions of one block and
  up to GMAX query heads of one KV head. The scores live in gc x 64/V vector
  registers through the loop over i; each key row is loaded (and converted from float16)
  once for all gc heads, and each Q[g, i] is one broadcast load.
* ``block_pv``: O[g, d0:d0+64] += sum_{s < ns} P[g, s] V[s, d0:d0+64], the same way round:
  the 64 output dims of gc heads in registers, one value row loaded per position.

V (floats per vector) is 16 where the CPU has AVX-512, else 8 (``kernels(V)`` builds either
pair; the tests run both); gc x 64/V accumulators stay within the register file (GMAX). The
pools are float16 bits (uint16) or float32, known from the array type at compile time; gc
(1..GMAX) is a switch. hd must be a multiple of 64 (head dims 64 and 128 in every
Llama-family model we load); gpu/ops/attention.py keeps its
plain loops for the others.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import cpu_features

POS = 64  # positions per KV block (gpu/ops/attention.py's BLOCK_TOKENS)
DIMS = 64  # output dims per block_pv call

F32 = ir.FloatType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)


def group_max(V: int) -> int:
    """Heads per call: 16 accumulators (AVX-512: 4 heads x 4 zmm; AVX2: 2 x 8 ymm)."""
    return max(1, 16 // (POS // V))


def _ptr(context, builder, aty, aval, off, elt):
    a = context.make_array(aty)(context, builder, aval)
    return builder.gep(builder.bitcast(a.data, elt.as_pointer()), [off])


def _elt(aty):
    return ir.HalfType() if aty.dtype == types.uint16 else F32


def _i64(context, builder, ty, v):
    return context.cast(builder, v, ty, types.int64)


def _loop(builder, n, init, body):
    """accs = body(i, accs) for i in 0..n-1 (n >= 1), as an LLVM loop with the accumulators
    in phi nodes (so in registers); returns the final accumulators."""
    entry = builder.block
    head = builder.append_basic_block("loop")
    out = builder.append_basic_block("loop.end")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), entry)
    phis = [builder.phi(a.type) for a in init]
    for p, a in zip(phis, init):
        p.add_incoming(a, entry)
    new = body(i, phis)
    nxt = builder.add(i, ir.Constant(I64, 1))
    tail = builder.block
    i.add_incoming(nxt, tail)
    for p, a in zip(phis, new):
        p.add_incoming(a, tail)
    builder.cbranch(builder.icmp_signed("<", nxt, n), head, out)
    builder.position_at_end(out)
    return new


def kernels(V: int):
    """(block_scores, block_pv) on vectors of V floats (8 or 16)."""
    FV = ir.VectorType(F32, V)
    NVEC = POS // V  # vectors per head: 64 positions, or 64 dims
    GMAX = group_max(V)

    def load(builder, base, off):
        """V floats at base + off (float32, or float16 widened)."""
        et = base.type.pointee
        p = builder.bitcast(builder.gep(base, [off]), ir.VectorType(et, V).as_pointer())
        v = builder.load(p, align=2)
        return builder.fpext(v, FV) if isinstance(et, ir.HalfType) else v

    def splat(builder, x):
        undef = ir.Constant(FV, ir.Undefined)
        v = builder.insert_element(undef, x, ir.Constant(I32, 0))
        return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(I32, V), [0] * V))

    def fma(builder, a, b, c):
        """a * b + c (llvm.fma: one vfmadd; IRBuilder.fma is scalar only)."""
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(FV, [FV, FV, FV]),
                                            f"llvm.fma.v{V}f32")
        return builder.call(fn, [a, b, c])

    def switch_on_gc(builder, gc, emit):
        """emit(g) for the case gc == g, g in 1..GMAX (any other gc does nothing)."""
        done = builder.append_basic_block("gc.done")
        sw = builder.switch(gc, done)
        for g in range(1, GMAX + 1):
            bb = builder.append_basic_block(f"gc.{g}")
            sw.add_case(ir.Constant(I64, g), bb)
            builder.position_at_end(bb)
            emit(g)
            builder.branch(done)
        builder.position_at_end(done)

    @intrinsic
    def block_scores(typingctx, gc, hd, kpool, koff, q, qoff, sc, soff):
        """sc[soff + g*64 + s] = sum_{i < hd} q[qoff + g*hd + i] * kpool[koff + i*64 + s]
        for g < gc, s < 64 (kpool + koff: one block's keys transposed, [hd, 64])."""
        sig = types.void(gc, hd, kpool, koff, q, qoff, sc, soff)

        def codegen(context, builder, signature, args):
            a = signature.args
            n_gc, n_hd = (_i64(context, builder, a[k], args[k]) for k in (0, 1))
            kp = _ptr(context, builder, a[2], args[2], _i64(context, builder, a[3], args[3]), _elt(a[2]))
            qp = _ptr(context, builder, a[4], args[4], _i64(context, builder, a[5], args[5]), F32)
            sp = _ptr(context, builder, a[6], args[6], _i64(context, builder, a[7], args[7]), F32)

            def emit(g_count):
                def body(i, accs):
                    row = builder.mul(i, ir.Constant(I64, POS))
                    ks = [load(builder, kp, builder.add(row, ir.Constant(I64, j * V)))
                          for j in range(NVEC)]
                    out = []
                    for g in range(g_count):
                        qi = builder.add(builder.mul(ir.Constant(I64, g), n_hd), i)
                        qv = splat(builder, builder.load(builder.gep(qp, [qi])))
                        out += [fma(builder, qv, ks[j], accs[g * NVEC + j]) for j in range(NVEC)]
                    return out
                accs = _loop(builder, n_hd, [ir.Constant(FV, None)] * (g_count * NVEC), body)
                for g in range(g_count):
                    for j in range(NVEC):
                        p = builder.gep(sp, [ir.Constant(I64, g * POS + j * V)])
                        builder.store(accs[g * NVEC + j], builder.bitcast(p, FV.as_pointer()), align=4)

            switch_on_gc(builder, n_gc, emit)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def block_pv(typingctx, gc, ns, vpool, voff, hd, p, poff, o, ooff):
        """o[ooff + g*hd + d] += sum_{s < ns} p[poff + g*64 + s] * vpool[voff + s*hd + d]
        for g < gc, d < 64 (vpool + voff: one block's values, row-major [64, hd], at dim d0;
        o + ooff likewise at d0). ns >= 1."""
        sig = types.void(gc, ns, vpool, voff, hd, p, poff, o, ooff)

        def codegen(context, builder, signature, args):
            a = signature.args
            n_gc, n_s = (_i64(context, builder, a[k], args[k]) for k in (0, 1))
            n_hd = _i64(context, builder, a[4], args[4])
            vp = _ptr(context, builder, a[2], args[2], _i64(context, builder, a[3], args[3]), _elt(a[2]))
            pp = _ptr(context, builder, a[5], args[5], _i64(context, builder, a[6], args[6]), F32)
            op = _ptr(context, builder, a[7], args[7], _i64(context, builder, a[8], args[8]), F32)

            def emit(g_count):
                optrs = [[builder.bitcast(builder.gep(op, [builder.add(
                    builder.mul(ir.Constant(I64, g), n_hd), ir.Constant(I64, j * V))]), FV.as_pointer())
                    for j in range(NVEC)] for g in range(g_count)]
                init = [builder.load(optrs[g][j], align=4) for g in range(g_count) for j in range(NVEC)]

                def body(s, accs):
                    row = builder.mul(s, n_hd)
                    vs = [load(builder, vp, builder.add(row, ir.Constant(I64, j * V)))
                          for j in range(NVEC)]
                    out = []
                    for g in range(g_count):
                        pg = builder.load(builder.gep(pp, [builder.add(ir.Constant(I64, g * POS), s)]))
                        pv = splat(builder, pg)
                        out += [fma(builder, pv, vs[j], accs[g * NVEC + j]) for j in range(NVEC)]
                    return out
                accs = _loop(builder, n_s, init, body)
                for g in range(g_count):
                    for j in range(NVEC):
                        builder.store(accs[g * NVEC + j], optrs[g][j], align=4)

            switch_on_gc(builder, n_gc, emit)
            return context.get_dummy_value()

        return sig, codegen

    return block_scores, block_pv


V = 16 if "avx512f" in cpu_features.host_features() else 8  # this CPU's
GMAX = group_max(V)
block_scores, block_pv = kernels(V)
