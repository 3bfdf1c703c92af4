"""Integer matmul: activations quantized to 8 or 16 bits per block, integer dot products
with the quantized weights (AVX-512 VNNI ``vpdpbusd`` / ``vpdpwssd``, or AVX2 ``vpmaddubsw``
+ ``vpmaddwd`` / ``vpmaddwd``).

Two activation widths (gpu/ops/cpu_features.py chooses; a weight's format code carries it):
int8, as llama.cpp, and int16: each activation split into its low and high byte, two byte
dot products where int8 has one (Q8 bytes: zero-extended, vpdpwssd), for 1/256 of the
activation error, which keeps the float kernels' greedy answers; decode streams the same
weight bytes either way. The default mixes them per weight (int16 for Q|K|V only,
``wide_for``).

Numba does not emit integer dot-product instructions, so the inner block product is a Numba
intrinsic whose codegen writes the LLVM IR itself: vector loads of the weight bytes, a
broadcast of four activation bytes, and calls to ``llvm.x86.avx512.vpdpbusd.{512,256}`` or
``llvm.x86.avx2.pmadd.ub.sw`` / ``llvm.x86.avx2.pmadd.wd``, then the block's scaling into
the float32 outputs. The rest (quantizing the activations, the loops over blocks and row
groups) is Numba. One intrinsic, ``block_dot``, holds every variant this CPU runs (ISA x
weight kind x block length x 1 or NT tokens) behind one switch.

The algebra. Our weights are ``w = d q + m`` per block (q unsigned: 0..15, 0..63 or 0..255;
gpu/quant.py). Activations are quantized per block of the same length (32, or 16 for
FMT_Q8_16): ``x ~ s xq`` with ``s = max|x| / 127`` and ``xq = round(x / s)`` in -127..127
(int16: 32767).
Then, per block, exactly over the quantized activations,

    sum_i w_i s xq_i = d s (sum_i q_i xq_i) + m s (sum_i xq_i)

``sum q xq`` is what the instructions compute (unsigned weight bytes times signed activation
bytes: ``vpdpbusd``'s operand order); ``sum xq`` is computed once per activation block. The
only approximation is x ~ s xq (as in llama.cpp's q8 activations).

Weight layout. The float kernels keep the bytes of one block position for 64 rows together
(gpu/quant.py: ``qs[g, b, j, l]``). ``vpdpbusd`` sums 4 adjacent bytes into one int32 lane,
so those 4 bytes must be 4 consecutive positions of one row: ``prepare`` transposes each
block to ``[j // 4, l, j % 4]`` (same array shape, same bytes, no extra memory) and gives the
weight a new format code that carries the kind and the ISA: fmt = FMT_I8 + 8 isa + kind.
A Q4 byte holds weights j (low nibble) and 16 + j (high), so the transposed word of
``(j4, l)`` pairs its low nibbles with activations 4 j4 .. 4 j4 + 3 and its high nibbles
with 16 + 4 j4 ...

Decode reads every weight byte once per token, so bytes are time, and the int8 layout stores
each weight at its file's size:
* 5- and 6-bit values (Q5_0, Q5_1, Q5_K, Q6_K), which gpu/quant.py stores as whole bytes,
  are packed here as a nibble plane (as Q4) plus one 32-bit word per row of their high bits
  (pack_bits; the kernel ORs them back in with a shift and a mask): 5 or 6 bits a weight.
* The scales keep the file's form (gpu/ops/kquant_scales.py; the format code carries it):
  float16 d and m per block (Q4_1, Q5_1), one float16 d where m is a fixed multiple of it
  (Q4_0, Q5_0, Q8_0), and the K-quants' super-block scales as the file packs them, decoded
  per block in the kernel (_scale_vectors): Q4_K/Q5_K's 6-bit sub-block scales and mins
  (4.5 and 5.5 bits a weight in all), Q6_K's int8 ones (6.5625).
* Each part in its own format: a stack's layers may differ (llama.cpp's Q4_K_M puts Q6_K in
  some layers' attn_v and ffn_down), and gpu/quant.py widens a stack to its widest layer and
  a fused Q|K|V or gate|up to its widest part; prepare narrows every row group back to the
  narrowest format that holds it exactly, and runs of groups alike become segments, each a
  matmul of its own (layer_matmul) into its rows of the output: a Q4_K_M layer with a Q6_K
  attn_v reads Q and K as Q4_K.

AVX2 saturation: ``vpmaddubsw`` adds two u8 x s8 products into a saturating int16, which
overflows for weight bytes above 129 (only Q8_0's q + 128 reaches them). Such weights get the
"split" kind: high and low nibbles are multiplied separately and recombined as 16 hi + lo.
"""
from __future__ import annotations

import mmap

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

from ..quant import (
    FMT_F32,
    FMT_Q4,
    FMT_Q8,
    FMT_Q8_16,
    LANES,
    LF_BLK,
    LF_CODE,
    LF_COLS,
    LF_DN,
    LF_DOFF,
    LF_G0,
    LF_G1,
    LF_MN,
    LF_MOFF,
    LF_NB,
    LF_QN,
    LF_QOFF,
    Array,
    Weight,
    block_weights,
)
from . import cpu_features, prefetch
from .cpu_features import ISA_AVX2, ISA_VNNI256, ISA_VNNI512
from .kquant_scales import K4_BLOCKS, K4_BYTES, K6_BLOCKS, K6_BYTES, SC_D, SC_DM, SC_K4, SC_K6, scale_form

FMT_I8 = 16  # format codes at and above this are int8-path weights
KIND_Q4, KIND_Q8, KIND_Q8_SPLIT, KIND_Q5P, KIND_Q6P = 0, 1, 2, 3, 4
NT = 4  # tokens per kernel call (register blocking: each weight vector feeds NT dot products)
SMALL_G = 32  # below this many row groups, int8_matmul's work items split the tokens too

ISAS = cpu_features.supported_isas()  # compiled in: only the ones this CPU runs

# _dot2w's inline assembly needs the JIT's assembly parser, which Numba does not set up
llvm.initialize_native_asmparser()


WIDE = 32  # fmt bit: the activations are int16, not int8 (see the module doc)
# How a block's scale d and offset m are stored: fmt // SCALES_STEP, one of
# gpu/ops/kquant_scales.py's forms (SC_DM, SC_D, SC_K4, SC_K6).
SCALES_STEP = 64


def fmt_code(isa: int, kind: int, wide: bool = False, scales: int = SC_DM) -> int:
    return FMT_I8 + SCALES_STEP * scales + WIDE * wide + 8 * isa + kind


def is_wide(fmt: int) -> bool:
    return fmt >= FMT_I8 and (fmt - FMT_I8) // WIDE % 2 == 1


def scales_of(fmt: int) -> int:
    return (fmt - FMT_I8) // SCALES_STEP if fmt >= FMT_I8 else SC_DM


def is_int8(fmt: int) -> bool:
    return fmt >= FMT_I8


# ---------------------------------------------------------------- LLVM IR for one block

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


def _vt(t, n):
    return ir.VectorType(t, n)


def _splat(t, n, v):
    return ir.Constant(_vt(t, n), [ir.Constant(t, v)] * n)


def _load_vec(builder, base, off, ty):
    p = builder.gep(base, [ir.Constant(ir.IntType(64), off)] if isinstance(off, int) else [off])
    return builder.load(builder.bitcast(p, ty.as_pointer()), align=1)


def _bcast_word(builder, base, off, V):
    """Four bytes at base + off, repeated in every 32-bit lane: <4V x i8>."""
    return builder.bitcast(_splat_value(builder, _load_vec(builder, base, off, I32), V), _vt(I8, 4 * V))


def _dot4(builder, isa, acc, w, x, wscale=1):
    """acc (<V x i32>) + per lane: the sum of 4 products w (u8) x x (s8), times wscale."""
    V = acc.type.count
    mod = builder.module
    if isa in (ISA_VNNI512, ISA_VNNI256):
        vi = _vt(I32, V)
        name = "llvm.x86.avx512.vpdpbusd.512" if V == 16 else "llvm.x86.avx512.vpdpbusd.256"
        fn = cgutils.get_or_insert_function(mod, ir.FunctionType(vi, [vi, vi, vi]), name)
        assert wscale == 1
        return builder.call(fn, [acc, builder.bitcast(w, vi), builder.bitcast(x, vi)])
    # AVX2: pairs of u8 x s8 -> saturating i16 (no saturation here, see the module doc),
    # then pairs of i16 x (1 or 16) -> i32
    b32, w16, i8 = _vt(I8, 32), _vt(I16, 16), _vt(I32, 8)
    f1 = cgutils.get_or_insert_function(mod, ir.FunctionType(w16, [b32, b32]), "llvm.x86.avx2.pmadd.ub.sw")
    f2 = cgutils.get_or_insert_function(mod, ir.FunctionType(i8, [w16, w16]), "llvm.x86.avx2.pmadd.wd")
    p = builder.call(f1, [w, x])
    return builder.add(acc, builder.call(f2, [p, _splat(I16, 16, wscale)]))


def _dot2w(builder, isa, acc, w, x):
    """acc (<V x i32>) + per lane: the sum of 2 products w (i16) x x (i16): vpdpwssd, or
    AVX2's vpmaddwd (no saturation: |w| <= 255, |x| <= 32767)."""
    V = acc.type.count
    vi = _vt(I32, V)
    if isa in (ISA_VNNI512, ISA_VNNI256):
        # inline assembly, not llvm.x86.avx512.vpdpwssd: LLVM rewrites that intrinsic into
        # vpmaddwd + vpaddd here (944 instructions per 4-token Q8 block; 717 so)
        asm = ir.InlineAsm(ir.FunctionType(vi, [vi, vi, vi]), "vpdpwssd $3, $2, $0", "=v,0,v,v")
        return builder.call(asm, [acc, builder.bitcast(w, vi), builder.bitcast(x, vi)])
    w16 = _vt(I16, 16)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vi, [w16, w16]),
                                        "llvm.x86.avx2.pmadd.wd")
    return builder.add(acc, builder.call(fn, [builder.bitcast(w, w16), builder.bitcast(x, w16)]))


def _bcast_quad(builder, base, off, V):
    """Four int16 at base + off (bytes), repeated in every 64-bit lane: <2V x i16>."""
    i64 = ir.IntType(64)
    q = _load_vec(builder, base, off, i64)
    return builder.bitcast(_splat_value(builder, q, V // 2), _vt(I16, 2 * V))


def _wide_dots(builder, isa, accs, w, xs):
    """The int16 form of one weight vector's dot products: w (<4V x i8>: V rows x 4
    positions) zero-extended to int16 and split into two halves of V/2 rows, each row two
    int32 lanes (positions 0-1, 2-3); accs[t] = [acc of rows 0..V/2-1, acc of V/2..V-1]."""
    n = w.type.count
    wz = builder.zext(w, _vt(I16, n))
    halves = [builder.shuffle_vector(wz, wz, ir.Constant(_vt(I32, n // 2),
                                                         list(range(h * n // 2, (h + 1) * n // 2))))
              for h in (0, 1)]
    for t, x in enumerate(xs):
        accs[t] = [_dot2w(builder, isa, accs[t][h], halves[h], x) for h in (0, 1)]


def _pair_sums(builder, a0, a1):
    """Rows 0..V-1's sums from the two half accumulators of _wide_dots."""
    V = a0.type.count
    even = ir.Constant(_vt(I32, V), list(range(0, 2 * V, 2)))
    odd = ir.Constant(_vt(I32, V), list(range(1, 2 * V, 2)))
    return builder.add(builder.shuffle_vector(a0, a1, even), builder.shuffle_vector(a0, a1, odd))


def _hi_bits(builder, h, bits, k, V):
    """Bits k*bits .. k*bits+bits-1 of each byte of h (<V x i32>), moved to bits 4.. of that
    byte (the high part of a 5- or 6-bit value whose low nibble comes from the nibble plane)."""
    sh = 4 - bits * k
    v = builder.shl(h, _splat(I32, V, sh)) if sh > 0 else (
        builder.lshr(h, _splat(I32, V, -sh)) if sh < 0 else h)
    mask = ((1 << bits) - 1) << 4
    v = builder.and_(v, _splat(I32, V, mask * 0x01010101))
    return builder.bitcast(v, _vt(I8, 4 * V))


def _block_codegen(isa, kind, bs, nt, wide, scales, builder, wbase, xbase, xstride, dbase,
                   mbytes, sub, sbase, cbase, sstride, obase):
    """One weight block (64 rows) times nt activation rows, scaled and added to the output.

    wbase: i8* to the block's bytes (layouts in prepare()); xbase: i8* to the first token's
    activations of this block (token t at xbase + t * xstride); dbase (half*), mbytes (i8*)
    and sub (i64): where the block's 64 scales and offsets come from, by ``scales``
    (_scale_vectors); sbase, cbase: float* to token 0's activation scale s and
    s * sum(xq) for this block (token t at + t * sstride); obase: float* [nt, 64], where
    out[t, l] += d[l] * s[t] * (sum of q[l, k] xq[t, k]) + m[l] * c[t].

    wide: the activations are int16 (xbase, xstride in bytes all the same). Nibble kinds
    (values < 64, so they are also valid signed bytes) take each activation as its low byte
    l (unsigned) and high byte h (signed): q x = 256 q h + q l, two byte dot products with
    the operands' roles swapped for the second (vpdpbusd and vpmaddubsw take unsigned x
    signed; neither overflows: 2 x 255 x 63 < 2^15); that is twice int8's dot products and
    nothing more. Their activations come as two byte planes (``to_planes``: per token, K low
    bytes, then K high bytes), so each group of four is one broadcast load (a load port's
    work), not a load and two byte shuffles per token and word (the shuffle port's: 117 of
    a 4-token block's 830 instructions). Bytes up to 255 (Q8) are zero-extended
    to int16 and go through vpdpwssd / vpmaddwd (_wide_dots) instead, on plain int16.

    The scaling is here and not in Numba so the integer sums never leave the registers, and
    so the scales can be float16 (llama.cpp's own precision for them): they are a fifth of
    a Q4 weight's bytes as float32, and decode streams every byte of every weight.
    """
    V = 16 if isa == ISA_VNNI512 else 8
    NV = LANES // V
    RC = {ISA_VNNI512: NV, ISA_VNNI256: 4, ISA_AVX2: 2}[isa]  # row vectors per pass (registers)
    if wide:
        RC = max(1, RC // 2)  # two accumulators per row vector
    bv = _vt(I8, 4 * V)
    lo_mask = _splat(I8, 4 * V, 15)
    four = _splat(I8, 4 * V, 4)
    zero = ir.Constant(_vt(I32, V), None)
    i64 = ir.IntType(64)
    fv = _vt(ir.FloatType(), V)
    nibbles = kind in (KIND_Q4, KIND_Q5P, KIND_Q6P)
    nj4 = bs // 8 if nibbles else bs // 4  # 4-byte words of one row in the (nibble) plane
    half = bs // 2  # a nibble byte holds positions j and half + j
    hbits = {KIND_Q5P: 1, KIND_Q6P: 2}.get(kind, 0)
    if nt == 1:  # decode: the bytes are the time (PREFETCH_BLOCKS)
        _prefetch_ahead(builder, wbase, nj4 * 4 * LANES + (4 * LANES if hbits else 0))
        _prefetch_scales(builder, scales, dbase, mbytes, sub)
    xoffs = [builder.mul(xstride, ir.Constant(i64, t)) if t else ir.Constant(i64, 0) for t in range(nt)]
    soffs = [builder.mul(sstride, ir.Constant(i64, t)) if t else ir.Constant(i64, 0) for t in range(nt)]
    s_t = [_splat_value(builder, builder.load(builder.gep(sbase, [soffs[t]])), V) for t in range(nt)]
    c_t = [_splat_value(builder, builder.load(builder.gep(cbase, [soffs[t]])), V) for t in range(nt)]

    if wide and nibbles:  # the high bytes' plane: K bytes after the low bytes' (stride 2K)
        hi_plane = builder.lshr(xstride, ir.Constant(i64, 1))

    def xword(t, pos):
        if wide and nibbles:
            lo = builder.add(xoffs[t], ir.Constant(i64, pos))
            return [_bcast_word(builder, xbase, lo, V),
                    _bcast_word(builder, xbase, builder.add(lo, hi_plane), V)]
        if wide:
            return _bcast_quad(builder, xbase, builder.add(xoffs[t], ir.Constant(i64, 2 * pos)), V)
        return _bcast_word(builder, xbase, builder.add(xoffs[t], ir.Constant(i64, pos)), V)

    for v0 in range(0, NV, RC):
        vs = range(v0, min(NV, v0 + RC))
        acc = {(t, v): zero for t in range(nt) for v in vs}
        wacc = {v: [[zero, zero] for t in range(nt)] for v in vs}  # wide: half accumulators
        hwords = {v: _load_vec(builder, wbase, nj4 * 4 * LANES + v * 4 * V, _vt(I32, V))
                  for v in vs} if hbits else {}
        for j4 in range(nj4):
            if nibbles:
                xlo = [xword(t, 4 * j4) for t in range(nt)]
                xhi = [xword(t, half + 4 * j4) for t in range(nt)]
            else:
                xw = [xword(t, 4 * j4) for t in range(nt)]
            for v in vs:
                w = _load_vec(builder, wbase, j4 * 4 * LANES + v * 4 * V, bv)
                if nibbles:
                    wl = builder.and_(w, lo_mask)
                    wh = builder.lshr(w, four)
                    if hbits:  # the high bits of positions 4 j4 + i and half + 4 j4 + i
                        wl = builder.or_(wl, _hi_bits(builder, hwords[v], hbits, j4, V))
                        wh = builder.or_(wh, _hi_bits(builder, hwords[v], hbits, j4 + nj4, V))
                    if wide:  # [low-byte sums, high-byte sums] per token
                        for t in range(nt):
                            lo_acc, hi_acc = wacc[v][t]
                            lo_acc = _dot4(builder, isa, lo_acc, xlo[t][0], wl)
                            hi_acc = _dot4(builder, isa, hi_acc, wl, xlo[t][1])
                            lo_acc = _dot4(builder, isa, lo_acc, xhi[t][0], wh)
                            hi_acc = _dot4(builder, isa, hi_acc, wh, xhi[t][1])
                            wacc[v][t] = [lo_acc, hi_acc]
                        continue
                    for t in range(nt):
                        a = _dot4(builder, isa, acc[t, v], wl, xlo[t])
                        acc[t, v] = _dot4(builder, isa, a, wh, xhi[t])
                elif wide:
                    _wide_dots(builder, isa, wacc[v], w, xw)
                elif kind == KIND_Q8_SPLIT:
                    wl = builder.and_(w, lo_mask)
                    wh = builder.lshr(w, four)
                    for t in range(nt):
                        a = _dot4(builder, isa, acc[t, v], wl, xw[t])
                        acc[t, v] = _dot4(builder, isa, a, wh, xw[t], wscale=16)
                else:
                    for t in range(nt):
                        acc[t, v] = _dot4(builder, isa, acc[t, v], w, xw[t])
        if wide:
            eight = _splat(I32, V, 8)
            for (t, v) in acc:
                lo_acc, hi_acc = wacc[v][t]
                acc[t, v] = (builder.add(builder.shl(hi_acc, eight), lo_acc) if nibbles
                             else _pair_sums(builder, lo_acc, hi_acc))
        for v in vs:
            dv, mv = _scale_vectors(builder, scales, dbase, mbytes, sub, v, V)
            for t in range(nt):
                p = builder.bitcast(builder.gep(obase, [ir.Constant(i64, t * LANES + v * V)]),
                                    fv.as_pointer())
                o = builder.load(p, align=4)
                af = builder.sitofp(acc[t, v], fv)
                scaled = builder.fmul(dv, builder.fmul(af, s_t[t], flags=_FAST), flags=_FAST)
                o = builder.fadd(o, scaled, flags=_FAST)
                o = builder.fadd(o, builder.fmul(mv, c_t[t], flags=_FAST), flags=_FAST)
                builder.store(o, p, align=4)


_FAST = ("fast",)

# Decode streams each row group's blocks in order, one block_dot call per block, and the
# hardware prefetchers stop at every 4 KiB page (a Q4 block of 64 rows is 1 KiB), so each
# call prefetches the block PREFETCH_BLOCKS calls ahead (its bytes and its 64 scales and
# offsets). Decode ms a token, interleaved runs, each distance in its own process (Xeon host,
# 2 threads; two runs each):
#   blocks ahead          0          1          2          4          8          16
#   synthetic 1.1B Q4_1   30.6-32.8             28.4-30.0  29.1-30.4  29.6-30.5  31.5-31.6
#   synthetic Q4_K_M      34.9-36.0  32.1-32.3  32.5-32.7
#   bundled 135M Q4_1     3.58-3.66  3.24-3.38  3.10-3.23
# A prefetch never faults, so the last blocks' prefetches past the arrays' ends are harmless.
PREFETCH_BLOCKS = 2


def _prefetch_ahead(builder, wbase, nbytes):
    """Prefetch the weight block PREFETCH_BLOCKS calls ahead: nbytes of it from wbase."""
    for off in range(0, nbytes, 64):
        ahead = ir.Constant(ir.IntType(64), PREFETCH_BLOCKS * nbytes + off)
        prefetch.emit(builder, builder.gep(wbase, [ahead]))


def _prefetch_scales(builder, scales, dbase, mbytes, sub):
    """Prefetch the scales a later call reads: per-block ones PREFETCH_BLOCKS blocks ahead
    (64 float16 d, and m for SC_DM: two lines each); the super-block forms' next super-block,
    a line or two a call (the call for block ``sub`` of this one takes the lines ``sub`` of
    the next, so the eight or sixteen calls cover it)."""
    i64 = ir.IntType(64)

    def at(base, off):
        prefetch.emit(builder, builder.gep(base, [off if isinstance(off, ir.Value)
                                                  else ir.Constant(i64, off)]))

    if scales in (SC_DM, SC_D):
        for off in (0, 32):  # half*: LANES halves a block, 32 to a line
            at(dbase, PREFETCH_BLOCKS * LANES + off)
        if scales == SC_DM:
            mb = builder.bitcast(mbytes, ir.HalfType().as_pointer())
            for off in (0, 32):
                at(mb, PREFETCH_BLOCKS * LANES + off)
        return
    nd, nm = (2 * LANES, K4_BYTES * LANES) if scales == SC_K4 else (LANES, K6_BYTES * LANES)
    line = builder.mul(sub, ir.Constant(i64, 64))  # bytes
    at(mbytes, builder.add(line, ir.Constant(i64, nm)))
    if scales == SC_K4:  # the 4 lines of high bits, from calls 0-3
        at(mbytes, builder.add(line, ir.Constant(i64, nm + 8 * LANES)))
    dl = builder.mul(builder.and_(sub, ir.Constant(i64, nd // 32 - 1)), ir.Constant(i64, 32))
    at(dbase, builder.add(dl, ir.Constant(i64, nd)))  # half*: 32 a line


def _scale_vectors(builder, scales, dbase, mbytes, sub, v, V):
    """(d, m) of rows v V .. v V + V - 1 of a block as <V x float>, from its storage form.

    SC_DM: d and m float16 at dbase and mbytes. SC_D: d at dbase, m = d c with c the
    float16 at mbytes. SC_K4: D at dbase, Dm at dbase + LANES, block sub's byte at
    mbytes + sub LANES (low 4 bits of sc | low 4 of mn << 4) and each row's 32-bit word at
    mbytes + 8 LANES (bits 4 sub..: the high 2 bits of sc, then of mn); d = D sc, m = Dm mn.
    SC_K6: D at dbase, sc = the int8 at mbytes + sub LANES; d = D sc, m = -32 d. The
    products are float32's exact ones (an 11-bit D times a 6- or 8-bit integer), the values
    gpu/quant.py expands the file's scales to."""
    F32, F16 = ir.FloatType(), ir.HalfType()
    fv, hv = _vt(F32, V), _vt(F16, V)
    i64 = ir.IntType(64)
    hp = F16.as_pointer()

    def halves(base, off):
        return builder.fpext(_load_vec(builder, base, off, hv), fv)

    if scales == SC_DM:
        return halves(dbase, v * V), halves(builder.bitcast(mbytes, hp), v * V)
    if scales == SC_D:
        c = builder.fpext(builder.load(builder.bitcast(mbytes, hp)), F32)
        dv = halves(dbase, v * V)
        return dv, builder.fmul(dv, _splat_value(builder, c, V))
    row = builder.add(builder.mul(sub, ir.Constant(i64, LANES)), ir.Constant(i64, v * V))
    b = _load_vec(builder, mbytes, row, _vt(I8, V))
    D = halves(dbase, v * V)
    if scales == SC_K6:
        dv = builder.fmul(D, builder.sitofp(builder.sext(b, _vt(I32, V)), fv))
        return dv, builder.fmul(dv, _splat(F32, V, -32.0))
    b32 = builder.zext(b, _vt(I32, V))
    hw = _load_vec(builder, mbytes, 8 * LANES + 4 * v * V, _vt(I32, V))
    sh = builder.trunc(builder.mul(sub, ir.Constant(i64, 4)), I32)
    h = builder.lshr(hw, _splat_value(builder, sh, V))
    three, fifteen = _splat(I32, V, 3), _splat(I32, V, 15)
    sc = builder.or_(builder.and_(b32, fifteen),
                     builder.shl(builder.and_(h, three), _splat(I32, V, 4)))
    mn = builder.or_(builder.lshr(b32, _splat(I32, V, 4)),
                     builder.shl(builder.and_(builder.lshr(h, _splat(I32, V, 2)), three),
                                 _splat(I32, V, 4)))
    Dm = halves(dbase, LANES + v * V)
    return (builder.fmul(D, builder.sitofp(sc, fv)), builder.fmul(Dm, builder.sitofp(mn, fv)))


def _splat_value(builder, x, n):
    undef = ir.Constant(_vt(x.type, n), ir.Undefined)
    v = builder.insert_element(undef, x, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(_vt(I32, n), [ir.Constant(I32, 0)] * n))


# The variants compiled in: (isa, kind, block length, scale form), each for 1 and NT tokens,
# for the ISAs this CPU runs. AVX2 needs the split kind for bytes above 127 (see the module
# doc). The super-block scale forms go with their files' block lengths; their Q8 variants
# are the int16 prefill's (a nibble kind's group unpacked to bytes: UNPACK_T).
_KINDS = {ISA_VNNI512: (KIND_Q4, KIND_Q8, KIND_Q5P, KIND_Q6P),
          ISA_VNNI256: (KIND_Q4, KIND_Q8, KIND_Q5P, KIND_Q6P),
          ISA_AVX2: (KIND_Q4, KIND_Q8, KIND_Q5P, KIND_Q6P, KIND_Q8_SPLIT)}
_BLOCK_LENGTHS = {KIND_Q4: (32,), KIND_Q5P: (32,), KIND_Q6P: (16,), KIND_Q8: (32, 16),
                  KIND_Q8_SPLIT: (32, 16)}


def has_variant(kind: int, bs: int, wide: bool, scales: int) -> bool:
    """Whether a (kind, block length, activations, scale form) is compiled in (for every ISA
    that has the kind)."""
    if bs not in _BLOCK_LENGTHS[kind] or (wide and kind == KIND_Q8_SPLIT):  # vpmaddwd: no saturation
        return False
    if scales == SC_K4:
        return bs == 32 and (kind in (KIND_Q4, KIND_Q5P) or (kind == KIND_Q8 and wide))
    if scales == SC_K6:
        return bs == 16 and (kind == KIND_Q6P or (kind == KIND_Q8 and wide))
    return True


VARIANTS = tuple((isa, kind, bs, nt, wide, sc) for isa in ISAS for kind in _KINDS[isa]
                 for bs in _BLOCK_LENGTHS[kind] for nt in (1, NT) for wide in (False, True)
                 for sc in (SC_DM, SC_D, SC_K4, SC_K6) if has_variant(kind, bs, wide, sc))


def _variant_key(fmt, bs, n):
    return (fmt * 64 + bs) * 8 + n


@intrinsic
def block_dot(typingctx, fmt, bs, n, wq, woff, xq, xoff, xstride, d16, m16, doff, moff, sub,
              sx, xsm, soff, sstride, out, ooff):
    """out[ooff + t*LANES + l] += d[l] s[t] (sum over one weight block of q[l, k] xq[t, k])
    + m[l] c[t] for t < n (1 or NT): _block_codegen's code for the weight's format and block
    length, picked by one switch (every variant this CPU runs, in one function). The
    block's scales: d16 from half doff, m16 from byte moff, sub its block in a super-block
    (scale_offsets)."""
    sig = types.void(fmt, bs, n, wq, woff, xq, xoff, xstride, d16, m16, doff, moff, sub, sx,
                     xsm, soff, sstride, out, ooff)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        F32, F16 = ir.FloatType(), ir.HalfType()

        def i(k):
            return context.cast(builder, args[k], signature.args[k], types.int64)

        def ptr(k, ty, koff):
            a = context.make_array(signature.args[k])(context, builder, args[k])
            return builder.gep(builder.bitcast(a.data, ty.as_pointer()), [i(koff)])

        wp, xp, dp, mp = ptr(3, I8, 4), ptr(5, I8, 6), ptr(8, F16, 10), ptr(9, I8, 11)
        sp, cp, op = ptr(13, F32, 15), ptr(14, F32, 15), ptr(17, F32, 18)
        xs, ss, sb = i(7), i(16), i(12)
        key = builder.add(builder.mul(builder.add(builder.mul(i(0), ir.Constant(i64, 64)), i(1)),
                                      ir.Constant(i64, 8)), i(2))
        done = builder.append_basic_block("block_dot.done")
        sw = builder.switch(key, done)  # an unknown variant does nothing (prepare() refuses it)
        for isa, kind, blen, nt, wide, sc in VARIANTS:
            bb = builder.append_basic_block(f"block_dot.{isa}.{kind}.{blen}.{nt}.{int(wide)}.{sc}")
            sw.add_case(ir.Constant(i64, _variant_key(fmt_code(isa, kind, wide, sc), blen, nt)), bb)
            builder.position_at_end(bb)
            _block_codegen(isa, kind, blen, nt, wide, sc, builder, wp, xp, xs, dp, mp, sb, sp,
                           cp, ss, op)
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return sig, codegen


# ---------------------------------------------------------------- activations

@njit(fastmath=True, cache=True, nogil=True)
def quantize_row(x, bs, xq, sx, xsm):
    """One activation row -> int8 (or int16, by xq's type) per block of bs: x ~ sx[b] * xq;
    xsm[b] = sx[b] * sum(xq)."""
    K = x.shape[0]
    qmax = np.float32(127.0) if xq.itemsize == 1 else np.float32(32767.0)
    for b in range(K // bs):
        amax = np.float32(0.0)
        for j in range(bs):
            amax = max(amax, abs(x[b * bs + j]))
        s = amax / qmax
        inv = qmax / amax if amax > 0 else np.float32(0.0)
        isum = 0
        for j in range(bs):
            q = np.int32(np.rint(x[b * bs + j] * inv))
            xq[b * bs + j] = q
            isum += q
        sx[b] = s
        xsm[b] = s * np.float32(isum)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def quantize(x, bs, xq, sx, xsm):
    """quantize_row for every row of x [T, K]: xq int8 [T*K] (flat), sx, xsm float32 [T, nb]."""
    T, K = x.shape
    if T < 32:  # a few µs of work: not worth a parallel region
        for t in range(T):
            quantize_row(x[t], bs, xq[t * K:(t + 1) * K], sx[t], xsm[t])
        return
    for t in prange(T):
        quantize_row(x[t], bs, xq[t * K:(t + 1) * K], sx[t], xsm[t])


# ---------------------------------------------------------------- the matmul

@njit(cache=True, nogil=True)
def planar(fmt):
    """Whether a weight's kernels take int16 activations as byte planes (to_planes): the
    wide nibble kinds. Q8's wide kernels read plain int16."""
    return wide_code(fmt) and fmt % 8 != KIND_Q8


@njit(cache=True, nogil=True)
def wide_code(fmt):
    """is_wide, compiled."""
    return fmt >= FMT_I8 and (fmt - FMT_I8) // WIDE % 2 == 1


@njit(cache=True, nogil=True)
def scale_offsets(fmt, g, nb, b):
    """(doff, moff, sub) of block b of row group g (nb blocks a row) for block_dot: its
    scales' offset in d16 (halves) and in m16 (bytes), and its block in its super-block."""
    sc = (fmt - FMT_I8) // SCALES_STEP
    if sc == SC_K4:
        sb = g * (nb // K4_BLOCKS) + b // K4_BLOCKS
        return sb * 2 * LANES, sb * K4_BYTES * LANES, b % K4_BLOCKS
    if sc == SC_K6:
        sb = g * (nb // K6_BLOCKS) + b // K6_BLOCKS
        return sb * LANES, sb * K6_BYTES * LANES, b % K6_BLOCKS
    gb = g * nb + b
    if sc == SC_D:
        return gb * LANES, 0, 0
    return gb * LANES, 2 * gb * LANES, 0


@njit(cache=True, nogil=True)
def to_planes(xq16, T, K):
    """int16 activations [T*K] -> bytes [T, 2, K]: per token its K low bytes (unsigned),
    then its K high bytes (signed)."""
    b = xq16.view(np.uint8)
    out = np.empty(2 * T * K, np.int8)
    o = out.view(np.uint8)
    for t in range(T):
        for k in range(K):
            i = t * K + k
            o[2 * t * K + k] = b[2 * i]
            o[(2 * t + 1) * K + k] = b[2 * i + 1]
    return out


@njit(cache=True, nogil=True)
def activation_bytes(fmt, xq, T, K):
    """The quantized activations (int8, or int16 viewed as bytes) as ``fmt``'s kernels read
    them, and the byte offset of (token t, position k) there: t * a + k * p."""
    if not wide_code(fmt):
        return xq, K, 1
    if planar(fmt):
        return to_planes(xq.view(np.int16), T, K), 2 * K, 1
    return xq, 2 * K, 2


@njit(fastmath=True, cache=True, nogil=True)
def _group(fmt, wq, wg, blk, d16, m16, g, nb, xq, xa, xp, sx, xsm, bs, ta, tb, out):
    """out[(t - ta) * LANES + l] = row g*LANES + l dotted with token t, for tokens ta..tb-1
    (wg: the group's index in wq, g where wq is the whole weight, 0 where it is the group
    unpacked (unpack_group); blk: bytes of one block of one row in wq's layout; xq: the
    activations' bytes, (token t, position k) at t * xa + k * xp)."""
    out[:] = 0
    for b in range(nb):
        doff, moff, sub = scale_offsets(fmt, g, nb, b)
        t0 = ta
        while t0 < tb:
            n = NT if tb - t0 >= NT else 1
            block_dot(fmt, bs, n, wq, (wg * nb + b) * blk * LANES, xq, t0 * xa + b * bs * xp,
                      xa, d16, m16, doff, moff, sub, sx, xsm, t0 * nb + b, nb, out,
                      (t0 - ta) * LANES)
            t0 += n


# Prefill: from this many tokens per work item, a 4-, 5- or 6-bit weight's row group is first
# unpacked to whole bytes (the Q8 kind's layout, same blocks and scales) and run through the
# Q8 kernel on plain int16 activations. The integer sums are the same numbers, so the outputs
# are bit for bit the nibble kernels' (VNNI; AVX2's differ in the last bit, as its 1- and
# 4-token kernels already do: LLVM contracts the scaling into FMAs differently). The Q8
# kernel needs no nibble or high-bit unpacking per pass of NT tokens and no byte planes: in
# isolation it is 10-35% faster per weight at 100 tokens (VNNI-512, wgu: Q5 1299, Q8 1027 us).
# With the unpacking (1-2 us per 64 x 576 group) whole prefills gained 3-12% on Q4_K_M and
# were level on Q4_1 (VNNI); on AVX2, Q4_1 pp100 went from 1.70x to 2.04x llama-bench
# (docs/BENCHMARKS.md). Fewer token chunks without the unpacking measured 10% slower, so the
# two go together. Decode keeps the packed kernels: there the weight bytes streamed are the time.
UNPACK_T = 16


def _unpack_codegen(kind, bs, builder, wbase, obase):
    """One block of a nibble-kind weight (64 rows) -> its Q8-layout bytes, with the kernel's
    own instructions (64-byte vectors: a nibble word j4's 16 rows at a time)."""
    V = 16
    nj4 = bs // 8
    hbits = {KIND_Q5P: 1, KIND_Q6P: 2}.get(kind, 0)
    bv = _vt(I8, 4 * V)
    for c in range(LANES // V):
        h = _load_vec(builder, wbase, nj4 * 4 * LANES + c * 4 * V, _vt(I32, V)) if hbits else None
        for j4 in range(nj4):
            w = _load_vec(builder, wbase, j4 * 4 * LANES + c * 4 * V, bv)
            wl = builder.and_(w, _splat(I8, 4 * V, 15))
            wh = builder.lshr(w, _splat(I8, 4 * V, 4))
            if hbits:
                wl = builder.or_(wl, _hi_bits(builder, h, hbits, j4, V))
                wh = builder.or_(wh, _hi_bits(builder, h, hbits, j4 + nj4, V))
            for k, val in ((j4, wl), (j4 + nj4, wh)):
                p = builder.gep(obase, [ir.Constant(ir.IntType(64), k * 4 * LANES + c * 4 * V)])
                builder.store(val, builder.bitcast(p, bv.as_pointer()), align=1)


_UNPACKS = ((KIND_Q4, 32), (KIND_Q5P, 32), (KIND_Q6P, 16))


@intrinsic
def unpack_block(typingctx, kind, bs, wq, woff, out, ooff):
    """out[ooff:] = the block at wq[woff:] (a nibble kind's, bs weights a row) as whole bytes
    in the Q8 kind's layout: words [bs / 4, LANES] of 4 consecutive positions of one row."""
    sig = types.void(kind, bs, wq, woff, out, ooff)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)

        def i(k):
            return context.cast(builder, args[k], signature.args[k], types.int64)

        def ptr(k, koff):
            a = context.make_array(signature.args[k])(context, builder, args[k])
            return builder.gep(builder.bitcast(a.data, I8.as_pointer()), [i(koff)])

        wp, op = ptr(2, 3), ptr(4, 5)
        key = builder.add(builder.mul(i(0), ir.Constant(i64, 64)), i(1))
        done = builder.append_basic_block("unpack_block.done")
        sw = builder.switch(key, done)
        for kind_, bs_ in _UNPACKS:
            bb = builder.append_basic_block(f"unpack_block.{kind_}.{bs_}")
            sw.add_case(ir.Constant(i64, kind_ * 64 + bs_), bb)
            builder.position_at_end(bb)
            _unpack_codegen(kind_, bs_, builder, wp, op)
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def unpack_group(kind, wq, g, nb, blk, bs, out):
    """Row group g of a nibble-kind weight (Q4, Q5P, Q6P; nb blocks of bs weights, blk bytes
    a row each) -> the same weights as bytes in the Q8 kind's layout (out: uint8, nb * bs *
    LANES). A nibble word j4 holds positions 4 j4 .. 4 j4 + 3 (low nibbles) and bs/2 + 4 j4 ..
    (high); a packed high-bits word adds bits 4.. of each (_hi_bits)."""
    for b in range(nb):
        unpack_block(kind, bs, wq, (g * nb + b) * blk * LANES, out, b * bs * LANES)


@njit(cache=True, nogil=True)
def work_plan(fmt, T, G):
    """(tc, unpack): int8_matmul's work items are G row groups x tc token chunks, and whether
    each first unpacks its group to bytes (UNPACK_T).

    A work item is a group of LANES rows, for all tokens or, with few groups (tc > 1), for
    one NT-token chunk. Few groups leave threads idle (576 rows are 9 groups: on 2 threads
    one runs the 9th alone; measured 1.39x -> 1.70x for 8 tokens over 1 thread); a chunk
    re-reads its group's weights from cache (consecutive items share the group). The thread
    count is not asked for here: get_num_threads() in compiled code is a ctypes global, which
    Numba cannot cache. A prefill that unpacks takes fewer chunks (each unpacks its group
    again), still >= SMALL_G items; the chunks stay as they are where that would leave too
    few tokens a chunk to unpack for."""
    nq = T // NT
    tc = nq if (G < SMALL_G and nq >= 2) else 1
    if planar(fmt) and T >= UNPACK_T:
        tcu = min(tc, max(1, (SMALL_G + G - 1) // G))
        if T // tcu >= UNPACK_T:
            return tcu, True
    return tc, False


@njit(cache=True, nogil=True)
def int8_matmul(fmt, qs, d, m, x, y):
    """y[T, R] = x[T, K] @ W[R, K].T for one segment of int8-path weights (qs [G, nb, blk,
    LANES]: transposed blocks; d, m: its scales, any shape), activations quantized here."""
    int8_matmul_layout(fmt, qs.shape[1], qs.shape[2], qs.shape[0], qs.reshape(-1),
                       d.reshape(-1), m.reshape(-1), x, y)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def int8_matmul_layout(fmt, nb, blk, G, wq, d16, m16, x, y):
    """int8_matmul for a segment given flat: G row groups of nb blocks a row, blk bytes each
    (wq), its scales d16 and m16 (scale_offsets); y's columns are the segment's rows."""
    T, K = x.shape
    R = y.shape[1]
    bs = K // nb
    sx = np.empty((T, nb), np.float32)
    xsm = np.empty((T, nb), np.float32)
    nq = T // NT  # whole NT-token passes
    tc, unpack = work_plan(fmt, T, G)
    kind = fmt % 8
    kfmt = fmt - kind + KIND_Q8 if unpack else fmt  # the kernel that runs
    if wide_code(fmt):
        xq16 = np.empty(T * K, np.int16)
        quantize(x, bs, xq16, sx, xsm)
        xq, xa, xp = activation_bytes(kfmt, xq16.view(np.int8), T, K)
    else:
        xq = np.empty(T * K, np.int8)
        quantize(x, bs, xq, sx, xsm)
        xa, xp = K, 1
    sxf = sx.reshape(-1)
    xsmf = xsm.reshape(-1)
    for it in prange(G * tc):
        g = it // tc
        c = it % tc
        ta = (c * nq // tc) * NT
        tb = ((c + 1) * nq // tc) * NT if c < tc - 1 else T
        out = np.empty((tb - ta) * LANES, np.float32)
        src, wg, gblk = wq, g, blk
        if unpack:  # the group's weights as bytes (one call site for _group: code size)
            src = np.empty(nb * bs * LANES, np.uint8)
            unpack_group(kind, wq, g, nb, blk, bs, src)
            wg, gblk = 0, bs
        _group(kfmt, src, wg, gblk, d16, m16, g, nb, xq, xa, xp, sxf, xsmf, bs, ta, tb, out)
        r0 = g * LANES
        n = min(R, r0 + LANES) - r0
        for t in range(ta, tb):
            for l in range(n):
                y[t, r0 + l] = out[(t - ta) * LANES + l]


# ---------------------------------------------------------------- weights

def transpose_blocks(qs: np.ndarray) -> np.ndarray:
    """Interleaved qs [..., G, nb, bytes, LANES] -> the same shape holding, per block,
    bytes [bytes // 4, LANES, 4] (4 consecutive positions of one row adjacent)."""
    *lead, nbytes, lanes = qs.shape
    t = qs.reshape(*lead, nbytes // 4, 4, lanes)
    t = np.swapaxes(t, -1, -2)
    return np.ascontiguousarray(t).reshape(qs.shape)


def untranspose_blocks(qs: np.ndarray) -> np.ndarray:
    *lead, nbytes, lanes = qs.shape
    t = qs.reshape(*lead, nbytes // 4, lanes, 4)
    return np.ascontiguousarray(np.swapaxes(t, -1, -2)).reshape(qs.shape)


def _hi_positions(bs: int):
    """(k, i) -> the block position whose high bits sit at bits k*bits of byte i of a row's
    high-bits word: k < nj4 are the low halves' words, k >= nj4 the high halves'."""
    nj4, half = bs // 8, bs // 2
    return [[(k % nj4) * 4 + i + (k // nj4) * half for i in range(4)] for k in range(2 * nj4)]


def pack_bits(qs: np.ndarray, bits: int) -> np.ndarray:
    """5- or 6-bit values stored as bytes, qs [..., G, nb, bs, LANES] -> per block a nibble
    plane (byte j = low nibbles of positions j and bs/2 + j, transposed as Q4) followed by
    one 32-bit word per row of the high bits: [..., G, nb, bs/2 + 4, LANES] bytes, 5 or 6
    bits a weight instead of 8. Byte i of a row's word holds, at bits k*bits, the high bits
    of position _hi_positions(bs)[k][i], so the kernel gets each 4-byte group's high bits
    with one shift and one mask (_hi_bits)."""
    *lead, bs, lanes = qs.shape
    half = bs // 2
    nib = (qs[..., :half, :] & 15) | ((qs[..., half:, :] & 15) << 4)
    hb = (qs >> 4).astype(np.uint8)
    word = np.zeros((*lead, 4, lanes), np.uint8)  # [i, l]
    for k, row in enumerate(_hi_positions(bs)):
        for i, pos in enumerate(row):
            word[..., i, :] |= hb[..., pos, :] << (bits * k)
    word = np.swapaxes(word, -1, -2).reshape(*lead, 4, lanes)  # memory order [l, i]
    return np.ascontiguousarray(np.concatenate([transpose_blocks(nib), word], axis=-2))


def unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """pack_bits' inverse (tests)."""
    *lead, nb4, lanes = packed.shape
    half = nb4 - 4
    bs = 2 * half
    nib = untranspose_blocks(np.ascontiguousarray(packed[..., :half, :]))
    word = np.swapaxes(packed[..., half:, :].reshape(*lead, lanes, 4), -1, -2)  # [i, l]
    q = np.concatenate([nib & 15, nib >> 4], axis=-2).astype(np.uint8)
    for k, row in enumerate(_hi_positions(bs)):
        for i, pos in enumerate(row):
            q[..., pos, :] |= ((word[..., i, :] >> (bits * k)) & ((1 << bits) - 1)) << 4
    return q


def kind_for(fmt: int, qs: np.ndarray, isa: int, wide: bool = False) -> int:
    if fmt == FMT_Q4:
        return KIND_Q4
    assert fmt in (FMT_Q8, FMT_Q8_16), fmt
    top = int(qs.max()) if qs.size else 0
    if fmt == FMT_Q8 and top < 32:
        return KIND_Q5P  # Q5_0, Q5_1, Q5_K: 5 bits in memory, not 8
    if fmt == FMT_Q8_16 and top < 64:
        return KIND_Q6P  # Q6_K
    if isa == ISA_AVX2 and top > 127 and not wide:
        return KIND_Q8_SPLIT  # vpmaddubsw's int16 pair sums would saturate
    return KIND_Q8


def pack(qs: np.ndarray, kind: int) -> np.ndarray:
    """Interleaved qs -> the int8 kernels' layout for ``kind``."""
    if kind == KIND_Q5P:
        return pack_bits(qs, 1)
    if kind == KIND_Q6P:
        return pack_bits(qs, 2)
    return transpose_blocks(qs)


def unpack(qs: np.ndarray, fmt: int) -> np.ndarray:
    """pack's inverse: a prepared weight's qs back in the interleaved layout (tests)."""
    kind = fmt % 8
    if kind == KIND_Q5P:
        return unpack_bits(qs, 1)
    if kind == KIND_Q6P:
        return unpack_bits(qs, 2)
    return untranspose_blocks(qs)


def narrowest(fmt: int, qs: NDArray[np.uint8], d: NDArray[np.float32], m: NDArray[np.float32]
              ) -> tuple[int, NDArray[np.uint8], NDArray[np.float32], NDArray[np.float32]]:
    """One layer's interleaved arrays (qs [G, nb, bs, LANES], d, m [G, nb, LANES]) in the
    narrowest internal format that holds the same weights exactly: (fmt, qs, d, m).

    A stack takes the widest format of its layers (gpu/quant.py's stack), so a layer widened
    there comes back: 16-weight blocks whose pairs share (d, m) are 32-weight blocks, and
    bytes below 16 are nibbles. Decided by the values, so a layer is narrowed exactly when
    that loses nothing, wherever its widening came from."""
    G, nb, bs, lanes = qs.shape
    if (fmt == FMT_Q8_16 and nb % 2 == 0 and np.array_equal(d[:, 0::2], d[:, 1::2])
            and np.array_equal(m[:, 0::2], m[:, 1::2])):
        fmt, qs, d, m = FMT_Q8, qs.reshape(G, nb // 2, 2 * bs, lanes), d[:, 0::2], m[:, 0::2]
    if fmt == FMT_Q8 and qs.size and int(qs.max()) < 16:
        half = qs.shape[2] // 2
        fmt, qs = FMT_Q4, (qs[:, :, :half] | (qs[:, :, half:] << 4)).astype(np.uint8)
    return fmt, np.ascontiguousarray(qs), np.ascontiguousarray(d), np.ascontiguousarray(m)


def prepare(w: Weight, isa: int | None = None, wide: bool | None = None) -> Weight:
    """A weight for the integer kernels of ``isa`` with int16 (wide) or int8 activations
    (default: the selected ones). Float32 weights and isa 0 (the float kernels) come back
    unchanged.

    Decode reads every byte once a token, so each part of a weight is stored in its own
    file's form, found from the values (a stack arrives widened to its widest layer, and a
    fused Q|K|V or gate|up to its widest part: gpu/quant.py):
    * per layer and row group of LANES rows, the narrowest format (narrowest) and kind
      (kind_for): in llama.cpp's Q4_K_M a layer's Q|K|V with a Q6_K attn_v runs Q and K as
      4-bit nibbles and V as 6-bit values; runs of groups alike are one *segment*;
    * per segment, the scales' form (gpu/ops/kquant_scales.py): the K-quants' super-block
      scales as the file packs them, one d where m is a multiple of it, else d and m.
    Every layer is a slot of flat arrays (qs uint8, d and m float16 bits as uint16, [L, n]),
    its segments one after another from its start; lf [L, S, LF_COLS] describes them
    (gpu/quant.py's LF_* columns; a code of -1 ends a layer's list). A slot is sized for the
    largest layer: decode reads only a layer's own bytes."""
    isa = cpu_features.ISA if isa is None else isa
    wide = cpu_features.ACTIVATIONS == "int16" if wide is None else wide
    if not isa or w.fmt == FMT_F32 or is_int8(w.fmt):
        return w
    if isa not in ISAS:
        raise ValueError(f"this CPU cannot run int8 kernel set {isa} (it has {ISAS})")
    layers = [_segments(w.fmt, w.qs[i], w.d[i], w.m[i], isa, wide) for i in range(w.qs.shape[0])]
    L, S = len(layers), max(len(x) for x in layers)
    size = [max(sum(seg[k].size for seg in x) for x in layers) for k in (5, 6, 7)]
    qs = np.zeros((L, size[0]), np.uint8)
    d = np.zeros((L, size[1]), np.uint16)
    m = np.zeros((L, max(1, size[2])), np.uint16)
    lf = np.full((L, S, LF_COLS), -1, np.int64)
    for i, segs in enumerate(layers):
        off = [0, 0, 0]
        for j, (code, nb, blk, g0, g1, q, dd, mm) in enumerate(segs):
            for k, (dst, src) in enumerate(((qs, q), (d, dd), (m, mm))):
                dst[i, off[k]:off[k] + src.size] = src
            lf[i, j] = (code, nb, blk, g0, g1, off[0], off[1], off[2], q.size, dd.size, mm.size)
            off = [off[0] + q.size, off[1] + dd.size, off[2] + mm.size]
    return Weight(int(lf[0, 0, LF_CODE]), qs, d, m, w.w, lf)


def _segments(fmt: int, qs: np.ndarray, d: np.ndarray, m: np.ndarray, isa: int, wide: bool
              ) -> list[tuple]:
    """One layer's interleaved arrays -> its segments (code, nb, blk, g0, g1, packed qs,
    d16, m16 flat) (see prepare)."""
    G = qs.shape[0]
    groups = []
    for g in range(G):
        f, q, dd, mm = narrowest(fmt, qs[g:g + 1], d[g:g + 1], m[g:g + 1])
        groups.append((f, kind_for(f, q, isa, wide), q, dd, mm))
    out = []
    g0 = 0
    while g0 < G:
        f, kind = groups[g0][:2]
        g1 = g0 + 1
        while g1 < G and groups[g1][:2] == (f, kind):
            g1 += 1
        q, dd, mm = (np.concatenate([x[k] for x in groups[g0:g1]]) for k in (2, 3, 4))
        bs = block_weights(f)

        def allowed(sc: int, k: int = kind, b: int = bs) -> bool:
            return has_variant(k, b, wide, sc)

        form, d16, m16 = scale_form(bs, dd, mm, allowed)
        pq = pack(q, kind)
        out.append((fmt_code(isa, kind, wide, form), q.shape[1], pq.shape[2], g0, g1,
                    pq.reshape(-1), d16, m16))
        g0 = g1
    return out


def segment(w: Weight, layer: int = 0, s: int = 0) -> tuple[int, Array, Array, Array]:
    """Segment s of a layer of a prepared weight: (code, qs [G, nb, blk, LANES], d16, m16)
    (tests and benchmarks; int8_matmul takes them)."""
    assert w.lf is not None
    c = [int(v) for v in w.lf[layer, s]]
    qs = w.qs[layer, c[LF_QOFF]:c[LF_QOFF] + c[LF_QN]]
    return (c[LF_CODE], qs.reshape(c[LF_G1] - c[LF_G0], c[LF_NB], c[LF_BLK], LANES),
            w.d[layer, c[LF_DOFF]:c[LF_DOFF] + c[LF_DN]], w.m[layer, c[LF_MOFF]:c[LF_MOFF] + c[LF_MN]])


def segments(w: Weight, layer: int = 0) -> list[tuple[int, Array, Array, Array]]:
    assert w.lf is not None
    return [segment(w, layer, s) for s in range(w.lf.shape[1]) if w.lf[layer, s, LF_CODE] >= 0]


def resident(w: Weight) -> Weight:
    """w with its arrays out of the layout cache's file mapping, in anonymous memory.

    Decode streams every weight byte once a token, and a file mapping is mostly 4 KiB pages
    (the page cache's folios decide, not us): on the synthetic 1.1B files a token's ~750 MB
    then walks ~190,000 pages. Anonymous arrays of numpy's get transparent huge pages
    (numpy madvises them), and the same forward measured 10-14% faster from them
    (bench/bench_resident.py, interleaved: Q4_1 33.2 -> 29.8 ms, Q4_K_M 36.1 -> 31.2). The
    copy costs a read of the cache
    (~0.1 s per GB) and makes the weights the process's own memory rather than shared page
    cache. Each layer's slot copies its used bytes only: the tails stay untouched zero
    pages."""
    def copy(a: Array, used: list[int] | None) -> Array:
        if not isinstance(a, np.memmap) or a.size == 0:
            return a
        out = np.zeros(a.shape, a.dtype)  # calloc: pages appear as they are written
        if used is None:
            out[...] = a
        for i, n in enumerate(used or ()):
            out[i].reshape(-1)[:n] = a[i].reshape(-1)[:n]
        # the mapping's pages, read once for the copy, go back to the page cache (a private
        # mapping never written: the file's pages come back if the cache is read again)
        mm = getattr(a, "_mmap", None)
        if mm is not None:
            mm.madvise(mmap.MADV_DONTNEED)
        return out

    if not is_int8(w.fmt):
        return w._replace(qs=copy(w.qs, None), d=copy(w.d, None), m=copy(w.m, None),
                          w=copy(w.w, None))
    q, d, m = _used(w)
    return w._replace(qs=copy(w.qs, q), d=copy(w.d, d), m=copy(w.m, m), w=copy(w.w, None))


def for_forward(w: Weight) -> Weight:
    """w as the forward takes it: resident, with its per-layer table (layer_matmul)."""
    return resident(w)._replace(lf=w.layers())


def _used(w: Weight) -> tuple[list[int], list[int], list[int]]:
    """A prepared weight's used entries per layer slot: (qs bytes, d, m halves)."""
    assert w.lf is not None
    lf = np.asarray(w.lf, np.int64)
    segs = [lf[i][lf[i, :, LF_CODE] >= 0] for i in range(lf.shape[0])]
    return tuple([int(s[:, k].sum()) for s in segs] for k in (LF_QN, LF_DN, LF_MN))  # type: ignore[return-value]


def read_nbytes(w: Weight) -> int:
    """Bytes a forward pass reads of a weight: every layer's own packed values and scales
    (a prepared weight's slots are sized for its largest layer)."""
    if not is_int8(w.fmt):
        return int(sum(a.nbytes for a in (w.qs, w.d, w.m, w.w)))
    q, d, m = _used(w)
    return sum(q) + w.d.itemsize * (sum(d) + sum(m))


def scales_f32(a: np.ndarray) -> np.ndarray:
    """A prepared weight's d or m as float32 (tests, references)."""
    return a.view(np.float16).astype(np.float32)


def prepare_model(weights, isa: int | None = None, activations: str | bool | None = None):
    """ModelWeights with every matmul weight prepared (the embedding table stays as it is:
    its rows are read by gpu/ops/embedding.py, not multiplied), each with the activation
    width `activations` gives it (a cpu_features.ACT_MODES name, True: int16, False: int8,
    None: as selected). Returns a copy."""
    import dataclasses
    isa = cpu_features.ISA if isa is None else isa
    if not isa:
        return weights
    act = activations_name(activations)
    return dataclasses.replace(weights, **{k: prepare(getattr(weights, k), isa, wide_for(k, act))
                                           for k in MATMUL_WEIGHTS})


def activations_name(activations: str | bool | None) -> str:
    if activations is None:
        return cpu_features.ACTIVATIONS
    if isinstance(activations, bool):
        return "int16" if activations else "int8"
    if activations not in cpu_features.ACT_MODES:
        raise ValueError(f"activations {activations!r}: not one of {cpu_features.ACT_MODES}")
    return activations


def wide_for(weight: str, activations: str) -> bool:
    """Whether matmul weight `weight` (MATMUL_WEIGHTS) takes int16 activations in mode
    `activations` (cpu_features.ACT_MODES)."""
    return activations == "int16" or (activations == "int8-qkv16" and weight == "wqkv")


MATMUL_WEIGHTS = ("wqkv", "wo", "wgu", "wdown", "output")


@njit(cache=True, nogil=True)
def int_block_sums(fmt, qs, nb, xq, T, K, out):
    """Tests: out[t, g*LANES + l, b] = the kernel's integer sum of q * xq over block b (the
    kernel run with unit scales and no offsets: float32 holds these sums exactly, up to 2^24;
    int16 activations' sums go past it: keep those tests' activations small). xq: the
    activations' bytes (an int16 array viewed as int8 for a wide weight)."""
    bs = K // nb
    xq, xa, xp = activation_bytes(fmt, xq, T, K)
    dm = fmt - (fmt - FMT_I8) // SCALES_STEP * SCALES_STEP  # the same kernel with SC_DM scales
    wq = qs.reshape(-1)
    G = out.shape[1] // LANES
    blk = qs.shape[2]
    one = np.full(LANES, 0x3C00, np.uint16)  # float16 1.0
    zero = np.zeros(LANES, np.uint16)
    s1 = np.ones(T, np.float32)
    c0 = np.zeros(T, np.float32)
    acc = np.empty(NT * LANES, np.float32)
    for g in range(G):
        for b in range(nb):
            t0 = 0
            while t0 < T:
                n = NT if T - t0 >= NT else 1
                acc[:] = 0
                block_dot(dm, bs, n, wq, (g * nb + b) * blk * LANES, xq, t0 * xa + b * bs * xp, xa,
                          one, zero, 0, 0, 0, s1, c0, t0, 1, acc, 0)
                for t in range(n):
                    for l in range(LANES):
                        out[t0 + t, g * LANES + l, b] = np.int32(acc[t * LANES + l])
                t0 += n


class kernel_set:
    """``with kernel_set(isa, activations):`` models constructed inside get that kernel set
    (0: float) with those activations (a cpu_features.ACT_MODES name; True: int16, False:
    int8; None: as selected)."""

    def __init__(self, isa: int, activations: str | bool | None = None):
        self.isa = isa
        self.activations = None if activations is None else activations_name(activations)

    def __enter__(self):
        self.saved = cpu_features.ISA, cpu_features.ACTIVATIONS
        cpu_features.ISA = self.isa
        if self.activations is not None:
            cpu_features.ACTIVATIONS = self.activations
        return self

    def __exit__(self, *exc):
        cpu_features.ISA, cpu_features.ACTIVATIONS = self.saved
