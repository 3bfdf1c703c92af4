"""int8 matmul: activations quantized to 8 bits per block, integer dot products with the
quantized weights (AVX-512 VNNI ``vpdpbusd``, or AVX2 ``vpmaddubsw`` + ``vpmaddwd``).

Numba does not emit integer dot-product instructions, so the inner block product is a Numba
intrinsic whose codegen writes the LLVM IR itself: vector loads of the weight bytes, a
broadcast of four activation bytes, and calls to ``llvm.x86.avx512.vpdpbusd.{512,256}`` or
``llvm.x86.avx2.pmadd.ub.sw`` / ``llvm.x86.avx2.pmadd.wd``. The rest (quantizing the
activations, scaling the integer block sums, the parallel loop over row groups) is Numba.

The algebra. Our weights are ``w = d q + m`` per block (q unsigned: 0..15, 0..63 or 0..255;
gpu/quant.py). Activations are quantized per block of the same length (32, or 16 for
FMT_Q8_16): ``x ~ s xq`` with ``s = max|x| / 127`` and ``xq = round(x / s)`` in -127..127.
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

AVX2 saturation: ``vpmaddubsw`` adds two u8 x s8 products into a saturating int16, which
overflows for weight bytes above 129 (only Q8_0's q + 128 reaches them). Such weights get the
"split" kind: high and low nibbles are multiplied separately and recombined as 16 hi + lo.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..quant import FMT_F32, FMT_Q4, FMT_Q8, FMT_Q8_16, LANES, Weight
from . import cpu_features
from .cpu_features import ISA_AVX2, ISA_VNNI256, ISA_VNNI512

FMT_I8 = 16  # format codes at and above this are int8-path weights
KIND_Q4, KIND_Q8, KIND_Q8_SPLIT = 0, 1, 2
NT = 4  # tokens per kernel call (register blocking: each weight vector feeds NT dot products)

ISAS = cpu_features.supported_isas()  # compiled in: only the ones this CPU runs


def fmt_code(isa: int, kind: int) -> int:
    return FMT_I8 + 8 * isa + kind


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
    w = _load_vec(builder, base, off, I32)
    undef = ir.Constant(_vt(I32, V), ir.Undefined)
    v = builder.insert_element(undef, w, ir.Constant(I32, 0))
    v = builder.shuffle_vector(v, undef, ir.Constant(_vt(I32, V), [ir.Constant(I32, 0)] * V))
    return builder.bitcast(v, _vt(I8, 4 * V))


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


def _block_codegen(isa, kind, nj4, nt, builder, wbase, xbase, xstride, accbase):
    """The integer dot products of one weight block (64 rows) with nt activation rows.

    wbase: i8* to the block's transposed bytes [nj4, 64, 4]; xbase: i8* to the first token's
    activations of this block (token t at xbase + t * xstride); accbase: i32* [nt, 64], written.
    """
    V = 16 if isa == ISA_VNNI512 else 8
    NV = LANES // V
    RC = {ISA_VNNI512: NV, ISA_VNNI256: 4, ISA_AVX2: 2}[isa]  # row vectors per pass (registers)
    bv = _vt(I8, 4 * V)
    lo_mask = _splat(I8, 4 * V, 15)
    four = _splat(I8, 4 * V, 4)
    zero = ir.Constant(_vt(I32, V), None)
    i64 = ir.IntType(64)
    xoffs = [builder.mul(xstride, ir.Constant(i64, t)) if t else ir.Constant(i64, 0) for t in range(nt)]
    for v0 in range(0, NV, RC):
        vs = range(v0, min(NV, v0 + RC))
        acc = {(t, v): zero for t in range(nt) for v in vs}
        for j4 in range(nj4):
            if kind == KIND_Q4:
                xlo = [_bcast_word(builder, xbase, builder.add(xoffs[t], ir.Constant(i64, 4 * j4)), V) for t in range(nt)]
                xhi = [_bcast_word(builder, xbase, builder.add(xoffs[t], ir.Constant(i64, 16 + 4 * j4)), V) for t in range(nt)]
            else:
                xw = [_bcast_word(builder, xbase, builder.add(xoffs[t], ir.Constant(i64, 4 * j4)), V) for t in range(nt)]
            for v in vs:
                w = _load_vec(builder, wbase, j4 * 4 * LANES + v * 4 * V, bv)
                if kind == KIND_Q4:
                    wl = builder.and_(w, lo_mask)
                    wh = builder.lshr(w, four)
                    for t in range(nt):
                        a = _dot4(builder, isa, acc[t, v], wl, xlo[t])
                        acc[t, v] = _dot4(builder, isa, a, wh, xhi[t])
                elif kind == KIND_Q8_SPLIT:
                    wl = builder.and_(w, lo_mask)
                    wh = builder.lshr(w, four)
                    for t in range(nt):
                        a = _dot4(builder, isa, acc[t, v], wl, xw[t])
                        acc[t, v] = _dot4(builder, isa, a, wh, xw[t], wscale=16)
                else:
                    for t in range(nt):
                        acc[t, v] = _dot4(builder, isa, acc[t, v], w, xw[t])
        for (t, v), a in acc.items():
            p = builder.gep(accbase, [ir.Constant(i64, t * LANES + v * V)])
            builder.store(a, builder.bitcast(p, a.type.as_pointer()), align=4)


def _make_block(isa, kind, nj4, nt):
    @intrinsic
    def block_dot(typingctx, wq, woff, xq, xoff, xstride, acc):
        """acc[t, l] = sum over the block of q[l, k] xq[t, k] (see _block_codegen)."""
        sig = types.void(wq, woff, xq, xoff, xstride, acc)

        def codegen(context, builder, signature, args):
            wa = context.make_array(signature.args[0])(context, builder, args[0])
            xa = context.make_array(signature.args[2])(context, builder, args[2])
            aa = context.make_array(signature.args[5])(context, builder, args[5])
            i64 = ir.IntType(64)
            i8p = I8.as_pointer()
            woff_ = context.cast(builder, args[1], signature.args[1], types.int64)
            xoff_ = context.cast(builder, args[3], signature.args[3], types.int64)
            xs_ = context.cast(builder, args[4], signature.args[4], types.int64)
            wbase = builder.gep(builder.bitcast(wa.data, i8p), [woff_])
            xbase = builder.gep(builder.bitcast(xa.data, i8p), [xoff_])
            accbase = builder.bitcast(aa.data, I32.as_pointer())
            assert xs_.type == i64
            _block_codegen(isa, kind, nj4, nt, builder, wbase, xbase, xs_, accbase)
            return context.get_dummy_value()

        return sig, codegen

    return block_dot


# one intrinsic per (isa, kind, block bytes, tokens per call), for the ISAs this CPU runs
_KINDS = {ISA_VNNI512: (KIND_Q4, KIND_Q8), ISA_VNNI256: (KIND_Q4, KIND_Q8),
          ISA_AVX2: (KIND_Q4, KIND_Q8, KIND_Q8_SPLIT)}


def _nj4(kind, bs):
    return 4 if kind == KIND_Q4 else bs // 4


def _blk(isa, kind, bs, nt):
    if isa not in ISAS:
        @njit(inline="always")
        def unsupported(wq, woff, xq, xoff, xstride, acc):  # prepare() refuses these formats
            acc[:] = 0
        return unsupported
    return _make_block(isa, kind, _nj4(kind, bs), nt)


_B = {}
for _isa in (ISA_VNNI512, ISA_VNNI256, ISA_AVX2):
    for _kind in _KINDS[_isa]:
        for _bs in ((32,) if _kind == KIND_Q4 else (32, 16)):
            for _nt in (1, NT):
                _B[_isa, _kind, _bs, _nt] = _blk(_isa, _kind, _bs, _nt)

# numba resolves globals at compile time: name each one
V512_Q4_1, V512_Q4_4 = _B[ISA_VNNI512, KIND_Q4, 32, 1], _B[ISA_VNNI512, KIND_Q4, 32, NT]
V512_Q8_1, V512_Q8_4 = _B[ISA_VNNI512, KIND_Q8, 32, 1], _B[ISA_VNNI512, KIND_Q8, 32, NT]
V512_Q816_1, V512_Q816_4 = _B[ISA_VNNI512, KIND_Q8, 16, 1], _B[ISA_VNNI512, KIND_Q8, 16, NT]
V256_Q4_1, V256_Q4_4 = _B[ISA_VNNI256, KIND_Q4, 32, 1], _B[ISA_VNNI256, KIND_Q4, 32, NT]
V256_Q8_1, V256_Q8_4 = _B[ISA_VNNI256, KIND_Q8, 32, 1], _B[ISA_VNNI256, KIND_Q8, 32, NT]
V256_Q816_1, V256_Q816_4 = _B[ISA_VNNI256, KIND_Q8, 16, 1], _B[ISA_VNNI256, KIND_Q8, 16, NT]
A2_Q4_1, A2_Q4_4 = _B[ISA_AVX2, KIND_Q4, 32, 1], _B[ISA_AVX2, KIND_Q4, 32, NT]
A2_Q8_1, A2_Q8_4 = _B[ISA_AVX2, KIND_Q8, 32, 1], _B[ISA_AVX2, KIND_Q8, 32, NT]
A2_Q816_1, A2_Q816_4 = _B[ISA_AVX2, KIND_Q8, 16, 1], _B[ISA_AVX2, KIND_Q8, 16, NT]
A2_S8_1, A2_S8_4 = _B[ISA_AVX2, KIND_Q8_SPLIT, 32, 1], _B[ISA_AVX2, KIND_Q8_SPLIT, 32, NT]
A2_S816_1, A2_S816_4 = _B[ISA_AVX2, KIND_Q8_SPLIT, 16, 1], _B[ISA_AVX2, KIND_Q8_SPLIT, 16, NT]

F_V512 = FMT_I8 + 8 * ISA_VNNI512
F_V256 = FMT_I8 + 8 * ISA_VNNI256
F_A2 = FMT_I8 + 8 * ISA_AVX2


@njit(fastmath=True, cache=True, nogil=True)
def block_dot(fmt, bs, n, wq, woff, xq, xoff, xstride, acc):
    """acc[t * LANES + l] = sum over one weight block of q[l, k] * xq[t, k], t < n (1 or NT)."""
    one = n == 1
    if fmt == F_V512 + KIND_Q4:
        if one:
            V512_Q4_1(wq, woff, xq, xoff, xstride, acc)
        else:
            V512_Q4_4(wq, woff, xq, xoff, xstride, acc)
    elif fmt == F_V512 + KIND_Q8:
        if bs == 32:
            if one:
                V512_Q8_1(wq, woff, xq, xoff, xstride, acc)
            else:
                V512_Q8_4(wq, woff, xq, xoff, xstride, acc)
        else:
            if one:
                V512_Q816_1(wq, woff, xq, xoff, xstride, acc)
            else:
                V512_Q816_4(wq, woff, xq, xoff, xstride, acc)
    elif fmt == F_V256 + KIND_Q4:
        if one:
            V256_Q4_1(wq, woff, xq, xoff, xstride, acc)
        else:
            V256_Q4_4(wq, woff, xq, xoff, xstride, acc)
    elif fmt == F_V256 + KIND_Q8:
        if bs == 32:
            if one:
                V256_Q8_1(wq, woff, xq, xoff, xstride, acc)
            else:
                V256_Q8_4(wq, woff, xq, xoff, xstride, acc)
        else:
            if one:
                V256_Q816_1(wq, woff, xq, xoff, xstride, acc)
            else:
                V256_Q816_4(wq, woff, xq, xoff, xstride, acc)
    elif fmt == F_A2 + KIND_Q4:
        if one:
            A2_Q4_1(wq, woff, xq, xoff, xstride, acc)
        else:
            A2_Q4_4(wq, woff, xq, xoff, xstride, acc)
    elif fmt == F_A2 + KIND_Q8:
        if bs == 32:
            if one:
                A2_Q8_1(wq, woff, xq, xoff, xstride, acc)
            else:
                A2_Q8_4(wq, woff, xq, xoff, xstride, acc)
        else:
            if one:
                A2_Q816_1(wq, woff, xq, xoff, xstride, acc)
            else:
                A2_Q816_4(wq, woff, xq, xoff, xstride, acc)
    elif fmt == F_A2 + KIND_Q8_SPLIT:
        if bs == 32:
            if one:
                A2_S8_1(wq, woff, xq, xoff, xstride, acc)
            else:
                A2_S8_4(wq, woff, xq, xoff, xstride, acc)
        else:
            if one:
                A2_S816_1(wq, woff, xq, xoff, xstride, acc)
            else:
                A2_S816_4(wq, woff, xq, xoff, xstride, acc)


# ---------------------------------------------------------------- activations

@njit(fastmath=True, cache=True, nogil=True)
def quantize_row(x, bs, xq, sx, xsm):
    """One activation row -> int8 per block of bs: x ~ sx[b] * xq; xsm[b] = sx[b] * sum(xq)."""
    K = x.shape[0]
    for b in range(K // bs):
        amax = np.float32(0.0)
        for j in range(bs):
            amax = max(amax, abs(x[b * bs + j]))
        s = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
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

@njit(fastmath=True, cache=True, nogil=True)
def _group(fmt, wq, d, m, g, xq, sx, xsm, K, bs, out, acc):
    """out[t, l] = row g*LANES + l dotted with token t, for every token."""
    T = out.shape[0]
    nb = d.shape[1]
    blk = wq.shape[0] // (d.shape[0] * nb)  # bytes of one block of LANES rows
    out[:, :] = 0
    for b in range(nb):
        woff = (g * nb + b) * blk
        db = d[g, b]
        mb = m[g, b]
        t0 = 0
        while t0 < T:
            n = NT if T - t0 >= NT else 1
            block_dot(fmt, bs, n, wq, woff, xq, t0 * K + b * bs, K, acc)
            for t in range(n):
                s = sx[t0 + t, b]
                c = xsm[t0 + t, b]
                o = out[t0 + t]
                for l in range(LANES):
                    o[l] += db[l] * (s * np.float32(acc[t * LANES + l])) + mb[l] * c
            t0 += n


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def int8_matmul(fmt, qs, d, m, x, y):
    """y[T, R] = x[T, K] @ W[R, K].T for int8-path weights (prepare()), activations quantized
    here per block."""
    T, K = x.shape
    R = y.shape[1]
    G = d.shape[0]
    nb = d.shape[1]
    bs = K // nb
    xq = np.empty(T * K, np.int8)
    sx = np.empty((T, nb), np.float32)
    xsm = np.empty((T, nb), np.float32)
    quantize(x, bs, xq, sx, xsm)
    wq = qs.reshape(-1)
    for g in prange(G):
        out = np.empty((T, LANES), np.float32)
        acc = np.empty(NT * LANES, np.int32)
        _group(fmt, wq, d, m, g, xq, sx, xsm, K, bs, out, acc)
        r0 = g * LANES
        n = min(R, r0 + LANES) - r0
        for t in range(T):
            for l in range(n):
                y[t, r0 + l] = out[t, l]


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


def kind_for(fmt: int, qs: np.ndarray, isa: int) -> int:
    if fmt == FMT_Q4:
        return KIND_Q4
    assert fmt in (FMT_Q8, FMT_Q8_16), fmt
    if isa == ISA_AVX2 and qs.size and int(qs.max()) > 127:
        return KIND_Q8_SPLIT  # vpmaddubsw's int16 pair sums would saturate
    return KIND_Q8


def prepare(w: Weight, isa: int | None = None) -> Weight:
    """A weight for the int8 kernels of ``isa`` (default: the selected one). Float32 weights
    and isa 0 (the float kernels) come back unchanged."""
    isa = cpu_features.ISA if isa is None else isa
    if not isa or w.fmt == FMT_F32 or is_int8(w.fmt):
        return w
    if isa not in ISAS:
        raise ValueError(f"this CPU cannot run int8 kernel set {isa} (it has {ISAS})")
    kind = kind_for(w.fmt, w.qs, isa)
    return Weight(fmt_code(isa, kind), transpose_blocks(w.qs), w.d, w.m, w.w)


def prepare_model(weights, isa: int | None = None):
    """ModelWeights with every matmul weight prepared (the embedding table stays as it is:
    its rows are read by gpu/ops/embedding.py, not multiplied). Returns a copy."""
    import dataclasses
    isa = cpu_features.ISA if isa is None else isa
    if not isa:
        return weights
    return dataclasses.replace(weights, **{k: prepare(getattr(weights, k), isa)
                                           for k in ("wqkv", "wo", "wgu", "wdown", "output")})


@njit(cache=True, nogil=True)
def int_block_sums(fmt, qs, nb, xq, T, K, out):
    """Tests: out[t, g*LANES + l, b] = the kernel's integer sum of q * xq over block b."""
    bs = K // nb
    wq = qs.reshape(-1)
    G = out.shape[1] // LANES
    blk = wq.shape[0] // (G * nb)
    acc = np.empty(NT * LANES, np.int32)
    for g in range(G):
        for b in range(nb):
            t0 = 0
            while t0 < T:
                n = NT if T - t0 >= NT else 1
                block_dot(fmt, bs, n, wq, (g * nb + b) * blk, xq, t0 * K + b * bs, K, acc)
                for t in range(n):
                    for l in range(LANES):
                        out[t0 + t, g * LANES + l, b] = acc[t * LANES + l]
                t0 += n


class kernel_set:
    """``with kernel_set(isa):`` models constructed inside get that kernel set (0: float)."""

    def __init__(self, isa: int):
        self.isa = isa

    def __enter__(self):
        self.saved = cpu_features.ISA
        cpu_features.ISA = self.isa
        return self

    def __exit__(self, *exc):
        cpu_features.ISA = self.saved
