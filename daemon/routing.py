"""Which engine runs a request, when the daemon has several ([[engines]]); on the I/O thread.

Prefix affinity first, then load. The prefix cache that makes a shared prompt cheap is per
engine, so a request should go where its prompt's beginning was last seen. The I/O thread
never tokenizes (that cost grows with the request, see engine_thread.py), so the prefix is
approximated on the payload's bytes, as SGLang's cache-aware router does on text: a hash of
the payload's first 256, 1024, 4096 and 16384 bytes (those that it has; chat: the encoded
messages, system prompt first; prompt: its UTF-8; token ids: their bytes), computed in one
pass (blake2b, its state copied at each boundary). Each engine remembers the boundary hashes
of the requests it was given, a bounded LRU. A request goes to the engine that has its
longest boundary, unless that engine has more than `slack` requests above the least loaded
one ([engine] route_slack); then, and with no boundary known (every payload shorter than
256 bytes), to the least loaded engine, the lowest index on a tie. Load is the requests the
I/O thread handed to an engine and has not closed yet: queued, waiting or running, counted
on this thread exactly (the engine's own numbers lag by a step).

A guess, never a correctness matter: a wrong engine only prefills what it could have
reused. Dead engines are never chosen.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

BOUNDARIES = (256, 1024, 4096, 16384)   # payload bytes
REMEMBERED = 4096                       # boundary hashes kept per engine (LRU), ~100 B each


def boundary_hashes(payload: bytes | memoryview) -> list[bytes]:
    """The hashes of the payload's leading bytes at each boundary it reaches, shortest first."""
    out: list[bytes] = []
    if len(payload) < BOUNDARIES[0]:
        return out
    mv = memoryview(payload)
    h = hashlib.blake2b(digest_size=16)
    prev = 0
    for b in BOUNDARIES:
        if len(mv) < b:
            break
        h.update(mv[prev:b])
        prev = b
        out.append(h.copy().digest())
    return out


class Router:
    def __init__(self, n_engines: int, slack: int, remembered: int = REMEMBERED):
        self.slack = slack
        self.remembered = remembered
        self.seen: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(n_engines)]

    def choose(self, hashes: list[bytes], load: list[int], alive: list[bool]) -> tuple[int, str]:
        """(engine index, "prefix" or "load"); -1 when no engine is alive."""
        live = [i for i, ok in enumerate(alive) if ok]
        if not live:
            return -1, "load"
        least = min(live, key=lambda i: (load[i], i))
        for h in reversed(hashes):  # the longest prefix first
            holders = [i for i in live if h in self.seen[i]]
            if holders:
                best = min(holders, key=lambda i: (load[i], i))
                if load[best] - load[least] <= self.slack:
                    return best, "prefix"
                break  # the engine with the longest prefix is too busy: balance instead
        return least, "load"

    def record(self, engine: int, hashes: list[bytes]) -> None:
        seen = self.seen[engine]
        for h in hashes:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.remembered:
            seen.popitem(last=False)

    def forget(self, engine: int) -> None:
        """A dead engine's cache is gone."""
        self.seen[engine].clear()
