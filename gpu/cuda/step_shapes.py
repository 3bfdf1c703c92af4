"""Model shapes for step_plan.py's printout, with no weights: the arrays of each quant.Weight
are zero-strided views (``np.broadcast_to``) that have the real shapes and byte counts but
take no memory, so the plan of a 1B model costs nothing to compute in CI.

The formats are the bundled SmolLM2-135M file's (Q4_1 layers, a tied Q8_0 embedding and
output), used for both shapes so that they compare: the Llama-3.2-1B shapes are that
architecture quantized the same way, not a particular file.
"""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from ..quant import FMT_Q4, FMT_Q8, LANES, QK, Weight
from .step_geometry import KERNEL

SHAPES = {
    # HF SmolLM2-135M-Instruct config (docs/BRIEF: 30 layers, d 576, FFN 1536, 9/3 heads)
    "smollm2-135m": dict(n_layer=30, d_model=576, n_ff=1536, n_head=9, n_kv=3, head_dim=64,
                         vocab=49152),
    # HF Llama-3.2-1B config: 16 layers, d 2048, FFN 8192, 32/8 heads of 64, vocab 128256
    "llama-3.2-1b": dict(n_layer=16, d_model=2048, n_ff=8192, n_head=32, n_kv=8, head_dim=64,
                         vocab=128256),
}

# A cut the kernel does not make yet, priced by the same model: the kernel's (16-row items,
# K split up to 8 ways, 3 barriers a layer) with 16-byte weight loads 4 deep.
PROPOSED = replace(KERNEL, load_bytes=16, loads_in_flight=4)
GEOMETRIES = {"kernel": KERNEL, "proposed": PROPOSED}


def _weight(fmt: int, L: int, rows: int, cols: int) -> Weight:
    G, nb = -(-rows // LANES), cols // QK
    bs = QK // 2 if fmt == FMT_Q4 else QK

    def ghost(shape, dtype):
        return np.broadcast_to(np.zeros(1, dtype), shape)
    return Weight(fmt, ghost((L, G, nb, bs, LANES), np.uint8),
                  ghost((L, G, nb, LANES), np.float32), ghost((L, G, nb, LANES), np.float32),
                  ghost((L, 0, 0), np.float32))


def synthetic(name: str) -> tuple[SimpleNamespace, SimpleNamespace]:
    """(cfg, weights) of the named shapes, for step_plan.plan."""
    s = SHAPES[name]
    cfg = SimpleNamespace(**s)
    L, D, F, hd = s["n_layer"], s["d_model"], s["n_ff"], s["head_dim"]
    emb = _weight(FMT_Q8, 1, s["vocab"], D)
    w = SimpleNamespace(
        wqkv=_weight(FMT_Q4, L, (s["n_head"] + 2 * s["n_kv"]) * hd, D),
        wo=_weight(FMT_Q4, L, D, s["n_head"] * hd),
        wgu=_weight(FMT_Q4, L, 2 * F, D),
        wdown=_weight(FMT_Q4, L, D, F),
        emb=emb, output=emb)
    return cfg, w
