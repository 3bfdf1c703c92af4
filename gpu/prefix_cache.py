"""Prefix reuse: the KV of recently finished sequences, for new prompts that start the same way.

A chat template puts the same system prompt in front of every conversation, clients repeat
questions, and a multi-turn chat re-sends the whole history: the positions they share with a
recent sequence need no prefill. Finished sequences are kept (trimmed to the positions they
wrote) in a small LRU; a new prompt copies the KV blocks of its longest common prefix
(whole blocks: positions past the prefix are overwritten by its own prefill before attention
reads them) and prefills only the rest. At least one prompt token is always recomputed, for
its logits. Under memory pressure the engine evicts entries before refusing work.

Each entry remembers the last step that wrote its KV (``written_by``, the engine's step
number): a device step that turns out to have failed after its sequence finished (overlap:
a finished sequence's last token is written by the step still in flight) takes the entries
it wrote with it (``drop_written_since``), so a later prompt never copies its garbage.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .kv_cache import KVArena, Sequence
from .ops.attention import BLOCK_TOKENS


class PrefixCache:
    def __init__(self, arena: KVArena, max_entries: int = 4, min_tokens: int = 16):
        self.arena = arena
        self.max_entries = max_entries
        self.min_tokens = min_tokens
        self._entries: list[tuple[npt.NDArray[np.int32], Sequence]] = []  # oldest first
        self._written_by: dict[int, int] = {}  # id(seq) -> the last step that wrote it
        self.hits = 0
        self.reused_tokens = 0

    @property
    def blocks(self) -> int:
        return sum(len(s.blocks) for _, s in self._entries)

    def store(self, seq: Sequence, tokens: npt.NDArray[np.int32], written_by: int = 0) -> None:
        """Take ownership of a finished sequence whose first seq.length positions hold the
        KV of `tokens[:seq.length]`, the last of them written by step `written_by`."""
        n = min(seq.length, len(tokens))
        if n < self.min_tokens or self.max_entries == 0:
            seq.release()
            return
        seq.trim()
        self._entries.append((np.asarray(tokens[:n], np.int32).copy(), seq))
        self._written_by[id(seq)] = written_by
        while len(self._entries) > self.max_entries:
            self.evict_one()

    def evict_one(self) -> bool:
        if not self._entries:
            return False
        self._drop(0)
        return True

    def drop_written_since(self, step: int) -> int:
        """Release the entries whose KV a step numbered `step` or later wrote; how many."""
        doomed = [i for i, (_, s) in enumerate(self._entries) if self._written_by[id(s)] >= step]
        for i in reversed(doomed):
            self._drop(i)
        return len(doomed)

    def _drop(self, i: int) -> None:
        seq = self._entries.pop(i)[1]
        del self._written_by[id(seq)]
        seq.release()

    def clear(self) -> None:
        while self.evict_one():
            pass

    def reuse(self, prompt: npt.NDArray[np.int32], seq: Sequence) -> int:
        """Copy the longest cached prefix of `prompt` into the empty `seq` (its blocks already
        reserved); returns how many positions it now holds (0: nothing worth reusing)."""
        best, src = 0, None
        for toks, s in self._entries:
            m = min(len(toks), len(prompt) - 1)
            neq = np.flatnonzero(toks[:m] != prompt[:m])
            lcp = int(neq[0]) if neq.size else m
            if lcp > best:
                best, src = lcp, s
        if best < self.min_tokens or src is None:
            return 0
        a = self.arena
        for i in range(-(-best // BLOCK_TOKENS)):
            a.k_pool[seq.table[i]] = a.k_pool[src.table[i]]
            a.v_pool[seq.table[i]] = a.v_pool[src.table[i]]
        seq.length = best
        # most recently useful last: it is evicted last
        self._entries.sort(key=lambda e: e[1] is src)
        self.hits += 1
        self.reused_tokens += best
        return best
