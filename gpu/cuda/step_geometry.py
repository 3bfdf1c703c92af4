"""How the fused step kernel (step_kernel.py) cuts its work, as plain numbers: the kernel
takes its constants from here and step_plan.py predicts from the same ones, so the model
of the kernel cannot drift from the kernel. No CUDA import: CI reads it without a GPU.

``Geometry`` is one way of cutting the work; ``KERNEL`` is the one the kernel compiles.
step_plan evaluates any Geometry, so a proposed cut can be priced before it is written.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..quant import FMT_F32, LANES, Weight, f16_exact


@dataclass(frozen=True)
class Geometry:
    threads: int = 256              # threads per block; one block per multiprocessor
    rows_per_item: int = LANES      # output rows a matmul work item computes
    k_splits: int = 1               # at most this many slices of K per row group (split-K)
    # split-K aims at this many matmul items per SM (``k_splits_for``): two, so a block that
    # finishes early takes another item instead of idling at the barrier
    matmul_items_per_sm: int = 2
    load_bytes: int = 4             # bytes per weight load instruction and thread
    loads_in_flight: int = 4        # weight loads a thread issues before using any
    # attention's K and V reads: one 4-byte value per thread and load; the head-dim loop's
    # loads are independent, so some are in flight together (an assumption: 4)
    # weight bytes a thread warms in L2, before a grid barrier, of its block's first item of
    # the matmul stage after it (0: none): weights do not depend on activations
    prefetch_bytes: int = 0
    attention_loads_in_flight: int = 4
    # flash-decoding splits aim at this many items per SM (two, as the per-op path: a block
    # that finishes its split early takes another instead of idling at the barrier)
    attention_items_per_sm: int = 2
    stages_per_layer: int = 5       # A qkv, B attention, C o-proj, D gate|up, E down
    grid_syncs_per_layer: int = 5   # grid-wide barriers a layer (the rest: ready counters)
    # after which of a layer's stages (A..E) every block waits at a grid barrier; the reader
    # of a stage with none waits on ready counters for just what it reads
    barrier_after: tuple[bool, ...] = (True, True, True, True, True)

    @property
    def bytes_in_flight(self) -> int:
        """Weight bytes one block has requested and not yet received, at most."""
        return self.threads * self.load_bytes * self.loads_in_flight


def k_splits_for(row_items: int, k_blocks: int, target: int, most: int) -> int:
    """Slices of K for a matmul stage of `row_items` (row group, token tile) items over
    `k_blocks` K blocks: just enough for `target` items in all, at most `most` and never
    more than the K blocks (no slice is empty). The kernel and step_plan both call this."""
    want = (target + row_items - 1) // row_items
    return max(1, min(want, most, k_blocks))


# 16-row items (four row quads of a quant row group) and K split up to 8 ways: every matmul
# stage of SmolLM2-135M and Llama-3.2-1B has >= 2 items per SM of an H100 at batch 1.
# Ready counters instead of grid barriers after A and D: an attention item waits for its KV
# head's Q, K and V row groups, a down-projection slice for the gate|up groups of its h
# columns (and its residual write for every gate|up item of its tile, readers of x).
# A thread's weight bytes: four byte positions of its row quad in one 16-byte load, one in
# flight (the same 16 bytes a thread as four 4-byte loads, in a quarter of the instructions).
# Before each grid barrier a thread warms L2 with the 16 bytes it loads first after it.
KERNEL = Geometry(rows_per_item=16, k_splits=8, grid_syncs_per_layer=3, load_bytes=16,
                  loads_in_flight=1, prefetch_bytes=16,
                  barrier_after=(False, True, True, False, True))


def scale_type(weights: Sequence[Weight]) -> type:
    """The fused kernel's scale type for a model's weights: float16 when every quantized
    one's (d, m) are float16 values (quant.f16_exact: Q4_0, Q4_1, Q8_0 files), so the kernel
    reads a sixth fewer bytes a Q4_1 weight and computes the same weights; float32 when any
    is not (the K-quants' products). One kernel variant for the whole model."""
    quantized = [a for wt in weights if wt.fmt != FMT_F32 for a in (wt.d, wt.m)]
    return np.float16 if f16_exact(*quantized) else np.float32
