"""Quantized weight formats: GGUF block layouts repacked into kernel-friendly arrays.

GGUF stores blocks of weights with their scales interleaved (Q4_1: f16 d, f16 m, 16 bytes
of nibbles; K-quants: 256-weight super-blocks with packed 6-bit sub-block scales). The
kernels want the scales apart from the quantized values, as float32, so the inner loop
streams one contiguous byte array. Repacking is exact: every weight the kernels see equals
the ggml dequantization of the file (tested bit for bit against ``gguf.quants.dequantize``).

Four internal formats cover the supported GGUF types; every one is ``w = d * q + m`` with
one float32 (d, m) per block, so one kernel family serves them all:

* ``FMT_Q4``    nibbles, (d, m) per 32 weights   Q4_1; Q4_0 (m = -8 d);
                                                 Q4_K (d = d_sb * sc, m = -dmin_sb * min)
* ``FMT_Q8``    bytes, (d, m) per 32 weights     Q8_0 (u = q + 128, m = -128 d);
                                                 Q5_0 (m = -16 d), Q5_1, Q5_K (as Q4_K)
* ``FMT_Q8_16`` bytes, (d, m) per 16 weights     Q6_K (d = d_sb * sc, u = q6, m = -32 d)
* ``FMT_F32``   plain float32 rows               F32, F16, BF16

Why these, and not one format per GGUF type: the K-quants' sub-block scales are small
integers times an f16 super-block scale, so expanding them at load time to one float32
(d, m) per sub-block is exact (d_sb * sc has at most 11 + 7 significant bits, and times a
6-bit q still fits float32's 24), and then Q4_K *is* our Q4 layout and the existing kernels
apply unchanged, at the same cost as Q4_1. 5- and 6-bit values are stored as whole bytes:
the byte kernel already exists, needs no bit-plane logic (which Numba would widen to int64,
see gpu/ops/matmul.py), and is exact. The price is memory traffic for the float kernels: 10
bits a weight for the 5-bit types and 12 for Q6_K (two floats per 16 weights; 6.6 in the
file). The CPU's int8 kernels re-pack every type to its file's size (gpu/ops/int8_matmul.py:
nibble plane + high bits; the scales in the file's form, gpu/ops/kquant_scales.py).
Q6_K's scales are per 16 weights, so it gets the byte layout with 16-weight blocks; the
byte kernels read the block length from the array's shape.

Quantized weights are then *row-interleaved* for the kernels: rows are padded to a multiple
of LANES and grouped, and within a group the bytes of one (block, position) of all LANES rows
are contiguous, so the matmul's innermost loop runs across rows (see gpu/ops/matmul.py):

    qs[g, b, j, l]  = byte j of block b of row g*LANES + l   (Q4: j < 16, Q8: j < 32, Q8_16: j < 16)
    d[g, b, l], m[g, b, l]

A weight is a ``Weight`` tuple ``(fmt, qs, d, m, w)`` of arrays with a leading layer axis, so
one compiled forward pass serves every layer; unused arrays have zero size. F32 weights stay
row-major in ``w``.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, TypeAlias, TypeVar, overload

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as QT

from .errors import UnsupportedModelError

QK = 32  # weights per block of FMT_Q4 and FMT_Q8
QK_16 = 16  # weights per block of FMT_Q8_16
QK_K = 256  # weights per K-quant super-block in the file
LANES = 64  # rows per interleaved group: 64 floats = 8 AVX2 registers of independent work
FMT_Q4, FMT_Q8, FMT_F32, FMT_Q8_16 = 0, 1, 2, 3

# (weights, bytes) per block in the file
_BLOCK = {QT.Q4_0: (32, 18), QT.Q4_1: (32, 20), QT.Q8_0: (32, 34), QT.Q5_0: (32, 22),
          QT.Q5_1: (32, 24), QT.Q4_K: (QK_K, 144), QT.Q5_K: (QK_K, 176), QT.Q6_K: (QK_K, 210)}
# Q8_K is not here on purpose: it is ggml's *activation* type for K-quant dot products, which
# llama.cpp's quantizer never writes into a model file (and `gguf` cannot dequantize it).
SUPPORTED_TYPES = (QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1,
                   QT.Q4_K, QT.Q5_K, QT.Q6_K)


def f16_exact(*arrays: Array) -> bool:
    """Every value of every array is a float16 value (finite, and float16 -> float32 gives it
    back): the scales a kernel may read at half the bytes without changing one weight. True
    for the file's own f16 scales (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1; -8 d, -16 d and -128 d are
    exact short of overflow); not in general for the K-quants' d_sb * sc products."""
    for a in arrays:
        a = np.asarray(a, np.float32)
        with np.errstate(over="ignore"):
            h = a.astype(np.float16)
        if not (np.isfinite(h).all() and np.array_equal(h.astype(np.float32), a)):
            return False
    return True


def block_weights(fmt: int) -> int:
    """Weights per (d, m) block of an internal quantized format."""
    return QK_16 if fmt == FMT_Q8_16 else QK


def block_bytes(fmt: int) -> int:
    """Bytes of qs per block and row of an internal quantized format."""
    return {FMT_Q4: QK // 2, FMT_Q8: QK, FMT_Q8_16: QK_16}[fmt]


# any shape and dtype (np.generic's item type given, so no Any; a string: np.generic cannot
# be subscripted at run time)
Array: TypeAlias = "np.ndarray[tuple[int, ...], np.dtype[np.generic[object]]]"
Arrays: TypeAlias = "dict[str, Array]"  # a tensor's internal arrays by name (qs, d, m or w)
U8: TypeAlias = npt.NDArray[np.uint8]
F32: TypeAlias = npt.NDArray[np.float32]
FloatT = TypeVar("FloatT", np.float32, np.float64)  # dequantize's result type


# Columns of a weight's layer table lf [L, S, LF_COLS]: per layer, its segments (row groups
# g0..g1 stored in one format; gpu/ops/int8_matmul.py's prepare): the format code, blocks a
# row, bytes a block and row, the groups, and where its qs, d and m lie in the layer's flat
# slot (offset, size). A code of -1 ends a layer's list.
(LF_CODE, LF_NB, LF_BLK, LF_G0, LF_G1, LF_QOFF, LF_DOFF, LF_MOFF, LF_QN, LF_DN,
 LF_MN) = range(11)
LF_COLS = 11


class Weight(NamedTuple):
    fmt: int
    qs: Array  # uint8 [L, G, nb, bytes per block, LANES] (the int8 path: [L, slot bytes])
    d: Array   # float32 [L, G, nb, LANES] (the int8 path: float16 bits as uint16 [L, slot])
    m: Array   # float32 [L, G, nb, LANES] (as d)
    w: Array   # float32 [L, R, K]
    # int64 [L, S, LF_COLS]: the segments of each layer (the int8 path's prepared weights);
    # None: one segment a layer, the whole of the arrays. layers() gives it either way.
    lf: Array | None = None

    @property
    def cols(self) -> int:
        if self.fmt == FMT_F32:
            return self.w.shape[2]
        return self.d.shape[2] * block_weights(self.fmt)

    def layer(self, i: int) -> tuple:
        return (self.fmt, self.qs[i], self.d[i], self.m[i], self.w[i])

    def layers(self) -> Array:
        """The layer table lf, built from the arrays' shapes for a plain stack."""
        if self.lf is not None:
            return self.lf
        L = max(a.shape[0] for a in (self.qs, self.d, self.w))
        row = np.zeros(LF_COLS, np.int64)
        row[LF_CODE] = self.fmt
        if self.fmt != FMT_F32:
            row[[LF_NB, LF_BLK, LF_G1]] = self.qs.shape[2], self.qs.shape[3], self.qs.shape[1]
        return np.tile(row, (L, 1, 1))


def check_type(name: str, ttype: int) -> QT:
    try:
        qt = QT(int(ttype))
    except ValueError:
        raise UnsupportedModelError(f"tensor {name!r}: unknown GGML type id {int(ttype)}") from None
    if qt not in SUPPORTED_TYPES:
        supported = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise UnsupportedModelError(
            f"tensor {name!r} has type {qt.name}, which zerolayer does not run (supported: {supported})")
    return qt


def _blocks(raw: Array, rows: int, cols: int, qt: QT) -> U8:
    n, size = _BLOCK[qt]
    if cols % n:
        raise UnsupportedModelError(f"{qt.name} row length {cols} is not a multiple of {n}")
    nb = cols // n
    need = rows * nb * size
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if flat.size != need:
        raise UnsupportedModelError(f"{qt.name} tensor holds {flat.size} bytes, expected {need}")
    return flat.reshape(rows, nb, size)


def _f16(b: U8) -> F32:
    """Two bytes (last axis) -> their little-endian f16 value as float32."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _bits(b: U8, n: int) -> U8:
    """Bytes [..., k] -> their bits, least significant first: uint8 [..., 8 k][:n]."""
    return np.unpackbits(b, axis=-1, bitorder="little")[..., :n]


def _nibbles_q4(q: U8) -> U8:
    """Values 0..15 [..., 32] -> our Q4 block bytes [..., 16]: byte j = q[j] | q[16 + j] << 4."""
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def _k_scales(sc12: U8) -> tuple[U8, U8]:
    """The 12 bytes of packed 6-bit (scale, min) pairs of a Q4_K/Q5_K super-block -> two
    uint8 [..., 8]. Sub-blocks 0-3 take the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
    sub-blocks 4-7 take a nibble of bytes 8-11 (low: scale, high: min) for their low 4 bits
    and the top 2 bits of bytes 0-3 (scale) or 4-7 (min) for their high 2."""
    a, b, c = sc12[..., 0:4], sc12[..., 4:8], sc12[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, mn


def _k_low_nibbles(qs: U8) -> U8:
    """Q4_K/Q5_K's 128 nibble bytes [..., 128] -> values [..., 8, 32]: each run of 32 bytes
    holds two sub-blocks, the first in the low nibbles, the second in the high ones."""
    p = qs.reshape(qs.shape[:-1] + (4, 32))
    return np.stack([p & 15, p >> 4], axis=-2).reshape(qs.shape[:-1] + (8, 32))


def repack(raw: Array, rows: int, cols: int, qt: QT) -> tuple[int, Arrays]:
    """Turn one GGUF tensor (``rows`` x ``cols``, row-major) into internal arrays (no layer axis)."""
    if qt == QT.F32:
        return FMT_F32, {"w": np.ascontiguousarray(raw, dtype=np.float32).reshape(rows, cols)}
    if qt == QT.F16:
        return FMT_F32, {"w": np.asarray(raw).view(np.float16).reshape(rows, cols).astype(np.float32)}
    if qt == QT.BF16:  # the top half of a float32: exact
        u = np.ascontiguousarray(raw).reshape(-1).view(np.uint16).astype(np.uint32) << 16
        return FMT_F32, {"w": u.view(np.float32).reshape(rows, cols)}
    blk = _blocks(raw, rows, cols, qt)
    if qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        return _repack_k(blk, rows, cols, qt)
    d = _f16(blk[:, :, 0:2])
    if qt == QT.Q8_0:
        # int8 -> uint8 (q + 128): numba converts uint8 to float in vector registers, while
        # int8 arithmetic is widened to int64 first, which AVX2 can't convert
        u8 = (np.ascontiguousarray(blk[:, :, 2:34]).reshape(rows, cols) ^ np.uint8(0x80))
        return FMT_Q8, {"qs": u8, "d": d, "m": (-128.0 * d).astype(np.float32)}
    if qt in (QT.Q5_0, QT.Q5_1):
        # [d, (m,) qh: 32 high bits (bit j: weight j), qs: byte j = weight j | weight 16+j << 4]
        o = 2 if qt == QT.Q5_0 else 4
        m = (-16.0 * d).astype(np.float32) if qt == QT.Q5_0 else _f16(blk[:, :, 2:4])
        hi = _bits(blk[:, :, o:o + 4], 32)
        qs = blk[:, :, o + 4:o + 20]
        q = np.concatenate([qs & 15, qs >> 4], axis=2) | (hi << 4)
        return FMT_Q8, {"qs": q.reshape(rows, cols), "d": d, "m": m}
    if qt == QT.Q4_1:
        m = _f16(blk[:, :, 2:4])
        qs = blk[:, :, 4:20]
    else:  # Q4_0: w = d * (q - 8) = d * q + (-8 d)
        m = (-8.0 * d).astype(np.float32)
        qs = blk[:, :, 2:18]
    return FMT_Q4, {"qs": np.ascontiguousarray(qs).reshape(rows, cols // 2), "d": d, "m": m}


def _repack_k(blk: U8, rows: int, cols: int, qt: QT) -> tuple[int, Arrays]:
    """K-quant super-blocks -> per-sub-block float32 (d, m), exact (see the module docstring).

    Q4_K: [d f16, dmin f16, 12 bytes of 6-bit (scale, min) x 8, 128 bytes of nibbles];
          sub-block s: w = d * sc[s] * q - dmin * min[s].
    Q5_K: as Q4_K, then 32 bytes qh before the nibbles: bit s of qh[j] is bit 4 of weight j
          of sub-block s.
    Q6_K: [128 bytes ql, 64 bytes qh, 16 int8 scales, d f16]; weight i = 128 h + 32 s + j
          (half h, quarter s) takes its low 4 bits from ql[64 h + 32 (s % 2) + j] (low nibble
          for s < 2, else high) and its top 2 from bits 2s, 2s+1 of qh[32 h + j];
          w = d * scale[i // 16] * (q - 32).
    """
    nsb = cols // QK_K
    if qt == QT.Q6_K:
        ql = blk[:, :, 0:128].reshape(rows, nsb, 2, 2, 32)     # [h, s % 2, j]
        qh = blk[:, :, 128:192].reshape(rows, nsb, 2, 1, 32)   # [h, -, j]
        lo = np.concatenate([ql & 15, ql >> 4], axis=3)        # [h, s, j]
        hi6 = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)) & 3
        q6 = (lo | (hi6 << 4)).reshape(rows, cols)              # 0..63: the weight is q6 - 32
        sc6 = blk[:, :, 192:208].view(np.int8).astype(np.float32)
        d = (_f16(blk[:, :, 208:210])[..., None] * sc6).reshape(rows, cols // QK_16)
        return FMT_Q8_16, {"qs": q6, "d": d, "m": (-32.0 * d).astype(np.float32)}
    dsb = _f16(blk[:, :, 0:2])[..., None]
    dmin = _f16(blk[:, :, 2:4])[..., None]
    sc, mn = _k_scales(blk[:, :, 4:16])
    d = (dsb * sc.astype(np.float32)).reshape(rows, cols // QK)
    m = (-(dmin * mn.astype(np.float32))).reshape(rows, cols // QK)
    if qt == QT.Q4_K:
        q = _k_low_nibbles(blk[:, :, 16:144])
        return FMT_Q4, {"qs": _nibbles_q4(q).reshape(rows, cols // 2), "d": d, "m": m}
    q = _k_low_nibbles(blk[:, :, 48:176])
    hi = _bits(blk[:, :, 16:48], 256).reshape(rows, nsb, 32, 8).transpose(0, 1, 3, 2)  # [s, j]
    return FMT_Q8, {"qs": (q | (hi << 4)).reshape(rows, cols), "d": d, "m": m}


def interleave(fmt: int, a: Arrays) -> Arrays:
    """Natural row-major arrays -> the kernels' row-interleaved layout (rows zero-padded)."""
    if fmt == FMT_F32:
        return a
    rows, nb = a["d"].shape
    pad = -rows % LANES
    G = (rows + pad) // LANES

    def grouped(arr: Array, inner: int) -> Array:
        arr = arr.reshape(rows, nb, inner) if inner else arr
        if pad:
            arr = np.concatenate([arr, np.zeros((pad,) + arr.shape[1:], arr.dtype)])
        arr = arr.reshape((G, LANES) + arr.shape[1:])
        axes = (0, 2, 3, 1) if inner else (0, 2, 1)
        return np.ascontiguousarray(arr.transpose(axes))

    return {"qs": grouped(a["qs"], block_bytes(fmt)), "d": grouped(a["d"], 0),
            "m": grouped(a["m"], 0)}


# Widening order: a tensor of one format converts exactly into any later one (nibbles to
# bytes; 32-weight blocks to two 16-weight blocks with the same d, m; anything to float32).
_WIDTH = {FMT_Q4: 0, FMT_Q8: 1, FMT_Q8_16: 2, FMT_F32: 3}


def widen(fmt: int, a: Arrays, to: int) -> Arrays:
    """Natural arrays of ``fmt`` -> the same weights, exactly, in the wider format ``to``."""
    if fmt == to:
        return a
    if to == FMT_F32:
        return {"w": dequantize(fmt, a)}
    assert _WIDTH[to] > _WIDTH[fmt], (fmt, to)
    rows, nb = a["d"].shape
    qs, d, m = a["qs"].view(np.uint8), a["d"], a["m"]
    if fmt == FMT_Q4:
        b = qs.reshape(rows, nb, QK // 2)
        qs = np.concatenate([b & 15, b >> 4], axis=2).reshape(rows, nb * QK)
    if to == FMT_Q8_16:
        d, m = np.repeat(d, 2, axis=1), np.repeat(m, 2, axis=1)
    return {"qs": qs, "d": d, "m": m}


def common_format(fmts: Iterable[int]) -> int:
    """The narrowest format that holds every one of ``fmts`` exactly."""
    return max(fmts, key=_WIDTH.__getitem__)


def stack(parts: list[tuple[int, Arrays]]) -> Weight:
    """Stack per-layer repacked tensors (already concatenated by rows) into one Weight.

    Layers share one compiled kernel, so they share one format: a stack of mixed formats
    widens to the narrowest common one (e.g. Q4_K_M files mix Q4_K and Q6_K layers), which
    is exact for every source format. The float and CUDA kernels run it so; the CPU's int8
    path narrows each layer's row groups back to their own formats (gpu/ops/int8_matmul.py's
    prepare), so decode there streams the file's bytes.
    """
    fmt = common_format({f for f, _ in parts})
    arrays: dict[str, list[Array]] = {"qs": [], "d": [], "m": [], "w": []}
    for pfmt, a in parts:
        a = interleave(fmt, widen(pfmt, a, fmt))
        for k in arrays:
            if k in a:
                arrays[k].append(a[k])
    L = len(parts)
    # numba compiles per array rank, so unused arrays keep the rank of their format
    ndim = {"qs": 4, "d": 3, "m": 3, "w": 2}

    def cat(k: str, dtype: type[np.uint8] | type[np.float32]) -> Array:
        if arrays[k]:
            return np.ascontiguousarray(np.stack(arrays[k]).astype(dtype, copy=False))
        return np.zeros((L,) + (0,) * ndim[k], dtype=dtype)

    return Weight(fmt, cat("qs", np.uint8), cat("d", np.float32), cat("m", np.float32), cat("w", np.float32))


def concat_rows(parts: list[tuple[int, Arrays]]) -> tuple[int, Arrays]:
    """Concatenate tensors of one layer by rows (fused Q|K|V or gate|up). Mixed formats widen
    to the narrowest common one."""
    fmt = common_format({f for f, _ in parts})
    widened = [widen(f, a, fmt) for f, a in parts]
    return fmt, {k: np.concatenate([a[k] for a in widened]) for k in widened[0]}


@overload
def dequantize(fmt: int, a: Arrays) -> F32: ...
@overload
def dequantize(fmt: int, a: Arrays, dtype: type[FloatT]) -> npt.NDArray[FloatT]: ...
def dequantize(fmt, a, dtype=np.float32):  # (the overloads above type it)
    """Internal arrays -> dense weights: d * q + m (used to widen mixed stacks, and by tests).

    In float32 this rounds exactly as ggml does (d * q is exact; one rounding for + m), so it
    equals ``gguf.quants.dequantize`` bit for bit; in float64 it is the exact value."""
    if fmt == FMT_F32:
        return a["w"].astype(dtype)
    d = a["d"].astype(dtype)
    rows, nb = d.shape
    bw = block_weights(fmt)
    if fmt == FMT_Q4:
        qs = a["qs"].view(np.uint8).reshape(rows, nb, QK // 2)
        q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(dtype)
    else:
        q = a["qs"].reshape(rows, nb, bw).astype(dtype)
    return (q * d[..., None] + a["m"].astype(dtype)[..., None]).reshape(rows, nb * bw)
