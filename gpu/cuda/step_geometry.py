"""How the fused step kernel (step_kernel.py) cuts its work, as plain numbers: the kernel
takes its constants from here and step_plan.py predicts from the same ones, so the model
of the kernel cannot drift from the kernel. No CUDA import: CI reads it without a GPU.

``Geometry`` is one way of cutting the work; ``KERNEL`` is the one the kernel compiles.
step_plan evaluates any Geometry, so a proposed cut can be priced before it is written.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..quant import LANES


@dataclass(frozen=True)
class Geometry:
    threads: int = 256              # threads per block; one block per multiprocessor
    rows_per_item: int = LANES      # output rows a matmul work item computes
    k_splits: int = 1               # slices of K per row group (split-K; 1: none)
    load_bytes: int = 4             # bytes per weight load instruction and thread
    loads_in_flight: int = 4        # weight loads a thread issues before using any
    # attention's K and V reads: one 4-byte value per thread and load; the head-dim loop's
    # loads are independent, so some are in flight together (an assumption: 4)
    attention_loads_in_flight: int = 4
    # flash-decoding splits aim at this many items per SM (two, as the per-op path: a block
    # that finishes its split early takes another instead of idling at the barrier)
    attention_items_per_sm: int = 2
    stages_per_layer: int = 5       # A qkv, B attention, C o-proj, D gate|up, E down
    grid_syncs_per_layer: int = 5   # one grid-wide barrier after every stage

    @property
    def bytes_in_flight(self) -> int:
        """Weight bytes one block has requested and not yet received, at most."""
        return self.threads * self.load_bytes * self.loads_in_flight


KERNEL = Geometry()
