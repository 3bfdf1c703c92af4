"""gpu/prefix_cache.py: entries remember the last step that wrote their KV, and a failed
device step takes the entries it (or a later step) wrote with it, blocks returned to the
arena; older entries stay and are still reused. Host bookkeeping only."""
from __future__ import annotations

import numpy as np

from zerolayer.gpu.kv_cache import KVArena
from zerolayer.gpu.prefix_cache import PrefixCache


def _finished(arena: KVArena, tokens: np.ndarray):
    seq = arena.new_sequence()
    seq.reserve(len(tokens))
    seq.length = len(tokens)
    return seq


def test_a_failed_step_drops_the_entries_it_wrote_and_frees_their_blocks():
    arena = KVArena(1, 1, 4, 8, 256, dtype=np.float32)
    cache = PrefixCache(arena, max_entries=4, min_tokens=4)
    old, new, newer = (np.arange(n, n + 20, dtype=np.int32) for n in (0, 100, 200))
    cache.store(_finished(arena, old), old, written_by=3)
    cache.store(_finished(arena, new), new, written_by=5)
    cache.store(_finished(arena, newer), newer, written_by=6)
    assert arena.free_blocks == 8 - 3
    assert cache.drop_written_since(5) == 2
    assert arena.free_blocks == 8 - 1 and cache.blocks == 1
    seq = arena.new_sequence()
    seq.reserve(30)
    assert cache.reuse(np.concatenate([new, [7]]).astype(np.int32), seq) == 0  # gone
    seq.release()
    seq = arena.new_sequence()
    seq.reserve(30)
    assert cache.reuse(np.concatenate([old, [7]]).astype(np.int32), seq) == 20  # kept
    assert cache.drop_written_since(7) == 0
