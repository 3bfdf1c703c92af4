"""The KV arena: fixed-size blocks of positions shared by all sequences, and block tables.

One pair of pools holds every sequence's keys and values (layout in gpu/ops/attention.py).
A sequence owns a list of block ids; its block table row maps position // BLOCK_TOKENS to a
block. Blocks return to the free list when the sequence is released (finished, cancelled),
so memory is bounded by the arena and not by the number of requests ever served. The pools
are allocated with np.zeros, which the OS backs lazily: untouched blocks cost no RAM.
Keys and values are stored as float16 (uint16 bits, see gpu/ops/half.py), as llama.cpp's
default cache type, or float32 (``dtype``; the default from ZEROLAYER_CPU_KV,
gpu/ops/cpu_features.py).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .errors import ContextOverflowError, KVCacheFullError
from .ops import cpu_features
from .ops.attention import BLOCK_TOKENS


class KVArena:
    def __init__(self, n_layer: int, n_kv: int, head_dim: int, n_blocks: int, max_seq_len: int,
                 dtype: npt.DTypeLike | None = None):
        self.n_blocks = n_blocks
        self.max_seq_len = max_seq_len
        self.max_blocks_per_seq = -(-max_seq_len // BLOCK_TOKENS)
        dtype = cpu_features.KV_DTYPE if dtype is None else dtype
        self.k_pool = np.zeros((n_blocks, n_layer, n_kv, head_dim, BLOCK_TOKENS), dtype)
        self.v_pool = np.zeros((n_blocks, n_layer, n_kv, BLOCK_TOKENS, head_dim), dtype)
        self._free = list(range(n_blocks - 1, -1, -1))
        self.bytes_per_block = 2 * self.k_pool[0].nbytes

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def new_sequence(self) -> Sequence:
        return Sequence(self)

    def _take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise KVCacheFullError(f"KV arena full: {n} blocks needed, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def _give(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


class Sequence:
    """One sequence's view of the arena: its length and its blocks."""

    def __init__(self, arena: KVArena):
        self.arena = arena
        self.length = 0  # positions written so far
        self.blocks: list[int] = []
        self.table = np.zeros(arena.max_blocks_per_seq, np.int32)

    def reserve(self, n_new: int) -> None:
        """Make room for n_new more positions (typed errors, never a crash)."""
        need = self.length + n_new
        if need > self.arena.max_seq_len:
            raise ContextOverflowError(need, self.arena.max_seq_len)
        n_blocks = -(-need // BLOCK_TOKENS)
        if n_blocks > len(self.blocks):
            new = self.arena._take(n_blocks - len(self.blocks))
            self.table[len(self.blocks):n_blocks] = new
            self.blocks.extend(new)

    def trim(self) -> None:
        """Give back the blocks past the positions written (a finished sequence kept for
        prefix reuse doesn't need the room it reserved for generation)."""
        keep = -(-self.length // BLOCK_TOKENS)
        if keep < len(self.blocks):
            self.arena._give(self.blocks[keep:])
            self.blocks = self.blocks[:keep]

    def release(self) -> None:
        self.arena._give(self.blocks)
        self.blocks = []
        self.length = 0
