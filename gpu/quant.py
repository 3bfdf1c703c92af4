"""Quantized weight formats: GGUF block layouts repacked into kernel-friendly arrays.

GGUF stores blocks of 32 weights with their scales interleaved (Q4_1: f16 d, f16 m, 16 bytes
of nibbles). The kernels want the scales apart from the nibbles, as float32, so the inner loop
streams one contiguous byte array. Repacking is exact: every weight the kernels see equals the
ggml dequantization of the file.

Three internal formats cover the supported GGUF types:

* ``FMT_Q4`` nibbles + (d, m) per block:  w = d * q + m        (Q4_1; Q4_0 as m = -8 d)
* ``FMT_Q8`` bytes + (d, m) per block:    w = d * u + m        (Q8_0 as u = q + 128, m = -128 d)
* ``FMT_F32`` plain float32 rows                                 (F32, F16)

Quantized weights are then *row-interleaved* for the kernels: rows are padded to a multiple
of LANES and grouped, and within a group the bytes of one (block, position) of all LANES rows
are contiguous, so the matmul's innermost loop runs across rows (see gpu/ops/matmul.py):

    qs[g, b, j, l]  = byte j of block b of row g*LANES + l     (Q4: j < 16, Q8: j < 32)
    d[g, b, l], m[g, b, l]

A weight is a ``Weight`` tuple ``(fmt, qs, d, m, w)`` of arrays with a leading layer axis, so
one compiled forward pass serves every layer; unused arrays have zero size. F32 weights stay
row-major in ``w``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as QT

from .errors import UnsupportedModelError

QK = 32  # weights per block, for every supported quantized type
LANES = 64  # rows per interleaved group: 64 floats = 8 AVX2 registers of independent work
FMT_Q4, FMT_Q8, FMT_F32 = 0, 1, 2

# bytes per block in the file
_BLOCK_BYTES = {QT.Q4_0: 18, QT.Q4_1: 20, QT.Q8_0: 34}
SUPPORTED_TYPES = (QT.F32, QT.F16, QT.Q8_0, QT.Q4_0, QT.Q4_1)


class Weight(NamedTuple):
    fmt: int
    qs: np.ndarray  # uint8 [L, G, K/32, 16|32, LANES]
    d: np.ndarray   # float32 [L, G, K/32, LANES]
    m: np.ndarray   # float32 [L, G, K/32, LANES]
    w: np.ndarray   # float32 [L, R, K]

    @property
    def cols(self) -> int:
        if self.fmt == FMT_F32:
            return self.w.shape[2]
        return self.d.shape[2] * QK

    def layer(self, i: int) -> tuple:
        return (self.fmt, self.qs[i], self.d[i], self.m[i], self.w[i])


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


def _blocks(raw: np.ndarray, rows: int, cols: int, qt: QT) -> np.ndarray:
    if cols % QK:
        raise UnsupportedModelError(f"row length {cols} is not a multiple of {QK}")
    nb = cols // QK
    need = rows * nb * _BLOCK_BYTES[qt]
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if flat.size != need:
        raise UnsupportedModelError(f"{qt.name} tensor holds {flat.size} bytes, expected {need}")
    return flat.reshape(rows, nb, _BLOCK_BYTES[qt])


def repack(raw: np.ndarray, rows: int, cols: int, qt: QT) -> tuple[int, dict[str, np.ndarray]]:
    """Turn one GGUF tensor (``rows`` x ``cols``, row-major) into internal arrays (no layer axis)."""
    if qt == QT.F32:
        return FMT_F32, {"w": np.ascontiguousarray(raw, dtype=np.float32).reshape(rows, cols)}
    if qt == QT.F16:
        return FMT_F32, {"w": np.asarray(raw).view(np.float16).reshape(rows, cols).astype(np.float32)}
    blk = _blocks(raw, rows, cols, qt)
    d = blk[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if qt == QT.Q8_0:
        # int8 -> uint8 (q + 128): numba converts uint8 to float in vector registers, while
        # int8 arithmetic is widened to int64 first, which AVX2 can't convert
        u = (np.ascontiguousarray(blk[:, :, 2:34]).reshape(rows, cols) ^ np.uint8(0x80))
        return FMT_Q8, {"qs": u, "d": d, "m": (-128.0 * d).astype(np.float32)}
    if qt == QT.Q4_1:
        m = blk[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blk[:, :, 4:20]
    else:  # Q4_0: w = d * (q - 8) = d * q + (-8 d)
        m = (-8.0 * d).astype(np.float32)
        qs = blk[:, :, 2:18]
    return FMT_Q4, {"qs": np.ascontiguousarray(qs).reshape(rows, cols // 2), "d": d, "m": m}


def interleave(fmt: int, a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Natural row-major arrays -> the kernels' row-interleaved layout (rows zero-padded)."""
    if fmt == FMT_F32:
        return a
    rows, nb = a["d"].shape
    pad = -rows % LANES
    G = (rows + pad) // LANES

    def grouped(arr: np.ndarray, inner: int) -> np.ndarray:
        arr = arr.reshape(rows, nb, inner) if inner else arr
        if pad:
            arr = np.concatenate([arr, np.zeros((pad,) + arr.shape[1:], arr.dtype)])
        arr = arr.reshape((G, LANES) + arr.shape[1:])
        axes = (0, 2, 3, 1) if inner else (0, 2, 1)
        return np.ascontiguousarray(arr.transpose(axes))

    return {"qs": grouped(a["qs"], 16 if fmt == FMT_Q4 else QK), "d": grouped(a["d"], 0),
            "m": grouped(a["m"], 0)}


def stack(parts: list[tuple[int, dict[str, np.ndarray]]]) -> Weight:
    """Stack per-layer repacked tensors (already concatenated by rows) into one Weight.

    Layers share one compiled kernel, so they share one format: a stack of mixed formats
    widens to float32, which is exact for every source format.
    """
    fmts = {f for f, _ in parts}
    fmt = fmts.pop() if len(fmts) == 1 else FMT_F32
    arrays: dict[str, list[np.ndarray]] = {"qs": [], "d": [], "m": [], "w": []}
    for pfmt, a in parts:
        if pfmt != fmt:
            a = {"w": dequantize(pfmt, a)}
        a = interleave(fmt, a)
        for k in arrays:
            if k in a:
                arrays[k].append(a[k])
    L = len(parts)
    # numba compiles per array rank, so unused arrays keep the rank of their format
    ndim = {"qs": 4, "d": 3, "m": 3, "w": 2}

    def cat(k: str, dtype) -> np.ndarray:
        if arrays[k]:
            return np.ascontiguousarray(np.stack(arrays[k]).astype(dtype, copy=False))
        return np.zeros((L,) + (0,) * ndim[k], dtype=dtype)

    return Weight(fmt, cat("qs", np.uint8), cat("d", np.float32), cat("m", np.float32), cat("w", np.float32))


def concat_rows(parts: list[tuple[int, dict[str, np.ndarray]]]) -> tuple[int, dict[str, np.ndarray]]:
    """Concatenate tensors of one layer by rows (fused Q|K|V or gate|up). Mixed formats widen."""
    fmt = parts[0][0]
    if any(p[0] != fmt for p in parts):
        return FMT_F32, {"w": np.concatenate([dequantize(f, a) for f, a in parts])}
    keys = parts[0][1].keys()
    return fmt, {k: np.concatenate([a[k] for _, a in parts]) for k in keys}


def dequantize(fmt: int, a: dict[str, np.ndarray], dtype=np.float32) -> np.ndarray:
    """Internal arrays -> dense weights (used to widen mixed stacks, and by tests)."""
    if fmt == FMT_F32:
        return a["w"].astype(dtype)
    d = a["d"].astype(dtype)
    rows, nb = d.shape
    if fmt == FMT_Q8:
        q = a["qs"].reshape(rows, nb, QK).astype(dtype)
        return (q * d[..., None] + a["m"].astype(dtype)[..., None]).reshape(rows, nb * QK)
    qs = a["qs"].reshape(rows, nb, QK // 2)
    q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(dtype)
    return (q * d[..., None] + a["m"].astype(dtype)[..., None]).reshape(rows, nb * QK)

