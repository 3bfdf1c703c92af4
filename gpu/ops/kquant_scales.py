"""Block scales in the forms the int8 kernels read them, chosen by their values.

gpu/quant.py expands every file's scales to one float32 (d, m) per block (w = d q + m). The
file stores fewer bytes where d and m have structure, and decode streams every byte, so the
int8 layout stores them back in the file's form wherever the values show it, exactly:

* SC_D  (Q4_0, Q5_0, Q8_0, ...): m = c d for one constant c: float16 d per block, one c.
* SC_K4 (Q4_K, Q5_K): per 8 blocks of 32 (a 256-weight super-block) d = D sc and m = Dm mn
  with float16 D, Dm and 6-bit sc, mn: 12 bytes of sc and mn per row and super-block
  (8 bytes of low nibbles, a 32-bit word of high bits), as the file's 12.
* SC_K6 (Q6_K): per 16 blocks of 16, d = D sc with float16 D and int8 sc, m = -32 d.
* SC_DM otherwise: float16 d and m per block.

The factoring searches for a float16 D and integers that give every float32 d exactly
(factor); any representation that does is as good as the file's, since the kernel forms
the same float32 products. A stack whose values don't factor keeps SC_DM.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from ..quant import LANES

F32 = NDArray[np.float32]
U16 = NDArray[np.uint16]

SC_DM, SC_D, SC_K4, SC_K6 = 0, 1, 2, 3
K4_BLOCKS, K6_BLOCKS = 8, 16  # blocks per super-block
K4_BYTES, K6_BYTES = 12, 16   # packed scale bytes per row and super-block
# the full search over multipliers runs for at most this many super-block rows whose first
# candidates failed; more such rows: not a K-quant's scales (a Q4_1 file's d would try them all)
_SEARCH_MAX = 4096


def to_half(a: F32) -> U16:
    """float32 -> float16 bits (uint16: Numba's CPU arrays have no float16)."""
    h = np.ascontiguousarray(a, np.float32).astype(np.float16)
    if not np.isfinite(h).all():
        raise ValueError("a block scale overflows float16")
    return h.view(np.uint16)


def _half_exact(a: F32) -> NDArray[np.bool_]:
    with np.errstate(over="ignore"):
        return a.astype(np.float16).astype(np.float32) == a


def factor(v: F32, per: int, lo: int, hi: int) -> tuple[F32, NDArray[np.int64]] | None:
    """v float32 [G, nb, LANES] -> (D float32 [G, nb // per, LANES], q int64 [G, nb, LANES])
    with every D a float16, lo <= q <= hi and D q == v exactly in float32, per ``per``
    consecutive blocks of a row; None where some super-block has no such form."""
    G, nb, L = v.shape
    if nb % per:
        return None
    x = np.ascontiguousarray(v.reshape(G, nb // per, per, L).transpose(0, 1, 3, 2)).reshape(-1, per)
    D = np.zeros(x.shape[0], np.float32)
    done = np.array(~x.any(axis=1), dtype=bool)
    ext = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    ks = sorted((k for k in range(lo, hi + 1) if k), key=lambda k: (-abs(k), -k))
    for i, k in enumerate(ks):
        todo = np.flatnonzero(~done)
        if not todo.size:
            break
        if i >= 2 and todo.size > _SEARCH_MAX:
            return None
        c = (ext[todo] / np.float32(k)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.rint(x[todo] / c[:, None])
        good = _half_exact(c) & (c != 0) & np.all((q >= lo) & (q <= hi), axis=1)
        good &= np.all((c[:, None] * q.astype(np.float32)).astype(np.float32) == x[todo], axis=1)
        D[todo[good]] = c[good]
        done[todo[good]] = True
    if not done.all():
        return None
    Dg = D.reshape(G, nb // per, L)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(np.repeat(Dg, per, axis=1) != 0, v / np.repeat(Dg, per, axis=1), 0)
    return Dg, np.rint(q).astype(np.int64)


def common_ratio(d: F32, m: F32) -> float | None:
    """c with m == c d (float32) for every block, c and every d float16; else None."""
    if not _half_exact(d).all():
        return None
    nz = np.flatnonzero(d)
    if not nz.size:
        return 0.0 if not m.any() else None
    c = np.float32(m.reshape(-1)[nz[0]] / d.reshape(-1)[nz[0]])
    if not _half_exact(np.array([c])).all():
        return None
    return float(c) if np.array_equal((d * c).astype(np.float32), m) else None


def pack_k4(d: F32, m: F32) -> tuple[U16, NDArray[np.uint8]] | None:
    """SC_K4 arrays of d, m [G, nb, LANES]: (D and Dm as float16 bits [G, nsb, 2, LANES],
    bytes [G, nsb, 12 LANES]: 8 rows of LANES bytes sc & 15 | (mn & 15) << 4, then each
    lane's 32-bit word, bits 4k..4k+1 the top of sc of block k, 4k+2..4k+3 of mn), or None."""
    fd = factor(d, K4_BLOCKS, 0, 63)
    fm = factor(m, K4_BLOCKS, 0, 63) if fd is not None else None  # Dm carries m's sign
    if fd is None or fm is None:
        return None
    (D, sc), (Dm, mn) = fd, fm
    G, nb, L = d.shape
    nsb = nb // K4_BLOCKS
    sc = sc.reshape(G, nsb, K4_BLOCKS, L)
    mn = mn.reshape(G, nsb, K4_BLOCKS, L)
    lo = ((sc & 15) | ((mn & 15) << 4)).astype(np.uint8)
    shifts = (4 * np.arange(K4_BLOCKS, dtype=np.int64)).reshape(1, 1, K4_BLOCKS, 1)
    word = np.bitwise_or.reduce(((sc >> 4) << shifts) | ((mn >> 4) << (shifts + 2)), axis=2)
    hi = word.astype("<u4").view(np.uint8).reshape(G, nsb, 4 * L)
    scales = np.concatenate([lo.reshape(G, nsb, K4_BLOCKS * L), hi], axis=2)
    return to_half(np.stack([D, Dm], axis=2)), scales


def pack_k6(d: F32, m: F32) -> tuple[U16, NDArray[np.uint8]] | None:
    """SC_K6 arrays of d, m [G, nb, LANES] (m must be -32 d): (D as float16 bits
    [G, nsb, LANES], int8 sc as bytes [G, nsb, 16 LANES]), or None."""
    if not np.array_equal(m, (np.float32(-32.0) * d).astype(np.float32)):
        return None
    f = factor(d, K6_BLOCKS, -128, 127)
    if f is None:
        return None
    D, sc = f
    G, nb, L = d.shape
    return to_half(D), sc.astype(np.int8).view(np.uint8).reshape(G, nb // K6_BLOCKS, K6_BLOCKS * L)


def scale_form(bs: int, d: F32, m: F32, allowed: Callable[[int], bool]) -> tuple[int, U16, U16]:
    """The narrowest exact form of one segment's scales d, m (float32 [G, nb, LANES]) among
    those ``allowed(form)`` admits: (form, d16 bits flat, m16 bits flat)."""
    assert d.shape[-1] == LANES
    if bs == 16 and allowed(SC_K6):
        k6 = pack_k6(d, m)
        if k6 is not None:
            return SC_K6, k6[0].reshape(-1), k6[1].reshape(-1).view(np.uint16)
    c = common_ratio(d, m) if allowed(SC_D) else None
    if c is not None:
        return SC_D, to_half(d).reshape(-1), to_half(np.array([c], np.float32))
    if bs == 32 and allowed(SC_K4):
        k4 = pack_k4(d, m)
        if k4 is not None:
            return SC_K4, k4[0].reshape(-1), k4[1].reshape(-1).view(np.uint16)
    return SC_DM, to_half(d).reshape(-1), to_half(m).reshape(-1)


def unpack_scales(form: int, d16: U16, m16: U16, G: int, nb: int) -> tuple[F32, F32]:
    """scale_form's inverse: (d, m) float32 [G, nb, LANES] (tests)."""
    def f32(h: U16) -> F32:
        return np.ascontiguousarray(h).view(np.float16).astype(np.float32)

    if form == SC_DM:
        return f32(d16).reshape(G, nb, LANES), f32(m16).reshape(G, nb, LANES)
    if form == SC_D:
        d = f32(d16).reshape(G, nb, LANES)
        return d, (d * f32(m16)[0]).astype(np.float32)
    b = np.ascontiguousarray(m16).view(np.uint8)
    if form == SC_K6:
        nsb = nb // K6_BLOCKS
        D = f32(d16).reshape(G, nsb, 1, LANES)
        sc6 = b.view(np.int8).reshape(G, nsb, K6_BLOCKS, LANES).astype(np.float32)
        d = (D * sc6).reshape(G, nb, LANES).astype(np.float32)
        return d, (np.float32(-32.0) * d).astype(np.float32)
    nsb = nb // K4_BLOCKS
    DD = f32(d16).reshape(G, nsb, 2, 1, LANES)
    b = b.reshape(G, nsb, K4_BYTES * LANES)
    lo = b[:, :, :K4_BLOCKS * LANES].reshape(G, nsb, K4_BLOCKS, LANES).astype(np.int64)
    word = b[:, :, K4_BLOCKS * LANES:].copy().view("<u4").reshape(G, nsb, 1, LANES).astype(np.int64)
    k = (4 * np.arange(K4_BLOCKS)).reshape(1, 1, K4_BLOCKS, 1)
    sc = (lo & 15) | (((word >> k) & 3) << 4)
    mn = (lo >> 4) | (((word >> (k + 2)) & 3) << 4)
    d = (DD[:, :, 0] * sc.astype(np.float32)).reshape(G, nb, LANES).astype(np.float32)
    m = (DD[:, :, 1] * mn.astype(np.float32)).reshape(G, nb, LANES).astype(np.float32)
    return d, m
