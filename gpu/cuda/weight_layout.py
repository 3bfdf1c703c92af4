"""The one device layout of a quantized weight's bytes, read by every CUDA kernel.

gpu/quant.py lays a weight out for the CPU kernels as qs[..., G, nb, bs, LANES]: per row group
g and K block b, byte position j of the LANES rows side by side. On the device the same bytes
are words[..., G, nb, LANES // 4, bs] (uint32): word (lq, j) holds byte j of rows 4 lq .. 4 lq
+ 3, so one row quad's bytes of a block lie side by side and the fused step kernel
(step_kernel.py) reads four byte positions in one 16-byte load. The per-op kernels
(matmul.py, dequant.py, embedding.py) read that array as bytes[..., G, nb, LANES // 4, bs, 4]:
byte (lq, j, i) is position j of row 4 lq + i. One copy on the device serves both paths.
"""
from __future__ import annotations

import numpy as np

from ..quant import Array


def device_words(qs: Array) -> Array:
    """quant.py's qs[..., G, nb, bs, LANES] (uint8) -> words[..., G, nb, LANES // 4, bs]."""
    words = np.ascontiguousarray(qs).view(np.uint32)    # [..., bs, LANES // 4]
    return np.ascontiguousarray(np.swapaxes(words, -2, -1))


def as_bytes(words):  # a host or a device array; the same kind back
    """words[..., LANES // 4, bs] (host or device, C-contiguous) -> the per-op kernels' view
    bytes[..., LANES // 4, bs, 4], no copy."""
    return words.view(np.uint8).reshape(tuple(words.shape) + (4,))


def device_layer(fmt: int, qs: Array, d: Array, m: Array, w: Array) -> tuple:
    """One layer's host arrays (quant.Weight.layer) with its bytes in the device layout, for
    the per-op kernels' callers that start from host arrays (checks, benchmarks)."""
    return fmt, (as_bytes(device_words(qs)) if qs.size else qs), d, m, w
