"""Idempotency cache: (key id, request id) → the response frames of that request.

A retry or a lost-packet recovery never runs the model twice. The
cache makes that hold without knowing anything about the engine: it stores signed response
frames (bytes, indexed by their sequence number) and a status. The running generation
behind a RUNNING entry is the daemon's to find, in its in-flight record (in_flight.py),
under the same key.

- A duplicate of a RUNNING request attaches: the daemon replays the frames so far and keeps
  streaming.
- A duplicate of a FINISHED request gets its frames replayed; the model does not run.
- RESEND(from_seq) is answered from `entry.frames_from(from_seq)`, running or finished.
- Finished entries live `ttl_s` (300 s) after they finished. Running entries never expire
  by age; they end through the engine, or through the lease (`expired_leases`) when their
  client went quiet.

Bounds and the policy when full (docs/PROTOCOL.md §8): at most `max_entries` entries and
about `max_bytes` of frames. When a new request does not fit, the oldest finished entries
are evicted first (counted in stats["evicted"]: each is a duplicate that would now run
again); with `evict_finished=False`, or when only running entries remain, the new request is
refused with OVERLOADED. Frames appended to a running entry are never refused (a stream
cannot be cut half way); their total is bounded by the engine's concurrency × max_tokens,
and any overshoot past max_bytes is evicted from finished entries or counted.
"""
from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from zerolayer.protocol.errors import OverloadedError

CacheKey = tuple[int, bytes]  # (key id, request id)

# Python's per-object overhead of a bytes frame and its list slot, so that max_bytes tracks
# real memory rather than just payload bytes.
FRAME_OVERHEAD = 33 + 8
ENTRY_OVERHEAD = 400


class EntryStatus(Enum):
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class CacheEntry:
    key: CacheKey
    run_id: int                  # identifies this generation run in every frame it emits
    status: EntryStatus
    created: float
    last_seen: float             # last time the client was heard from (lease)
    frames: list[bytes] = field(default_factory=list)   # frames[seq]
    finished_at: float | None = None
    nbytes: int = ENTRY_OVERHEAD

    @property
    def next_seq(self) -> int:
        return len(self.frames)

    def frames_from(self, seq: int, limit: int | None = None) -> list[bytes]:
        """Frames with sequence number >= seq (at most `limit`), for RESEND and replay."""
        end = len(self.frames) if limit is None else min(len(self.frames), seq + limit)
        return self.frames[seq:end] if seq < end else []


class ResultCache:
    def __init__(self, ttl_s: float = 300.0, max_entries: int = 65_536,
                 max_bytes: int = 256 << 20, evict_finished: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.evict_finished = evict_finished
        self._clock = clock
        self._entries: dict[CacheKey, CacheEntry] = {}
        # Finished entries in finish order (the clock is monotonic): TTL expiry and
        # eviction both take from the front.
        self._finished: OrderedDict[CacheKey, None] = OrderedDict()
        self.nbytes = 0
        self._next_run = secrets.randbits(32) or 1
        self.stats = {"started": 0, "attached": 0, "replayed": 0, "finished": 0,
                      "not_cached": 0, "expired": 0, "evicted": 0, "refused": 0,
                      "lease_expired": 0}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def running(self) -> int:
        return len(self._entries) - len(self._finished)

    def lookup(self, key: CacheKey, now: float | None = None) -> CacheEntry | None:
        """The live entry for a key, or None. Counts a hit as `attached` (running) or
        `replayed` (finished): call it once per duplicate request, use get() otherwise."""
        e = self.get(key, now)
        if e is not None:
            self.stats["attached" if e.status is EntryStatus.RUNNING else "replayed"] += 1
        return e

    def get(self, key: CacheKey, now: float | None = None) -> CacheEntry | None:
        now = self._clock() if now is None else now
        self.purge(now)
        return self._entries.get(key)

    def start(self, key: CacheKey, now: float | None = None) -> CacheEntry:
        """Register a new running request. Raises ValueError if the key is live (the
        caller must lookup() first) and OverloadedError if the cache cannot take it."""
        now = self._clock() if now is None else now
        self.purge(now)
        if key in self._entries:
            raise ValueError("request already in the cache; lookup() first")
        self._make_room(ENTRY_OVERHEAD, new_entry=True)
        run_id = self._next_run
        self._next_run = (self._next_run + 1) & 0xFFFFFFFF or 1  # 0 means "no run"
        e = CacheEntry(key, run_id, EntryStatus.RUNNING, now, now)
        self._entries[key] = e
        self.nbytes += e.nbytes
        self.stats["started"] += 1
        return e

    def next_seq(self, key: CacheKey) -> int:
        """The sequence number the next frame of a running request gets: its frames are
        numbered by their place here, so this is the one count of them."""
        return self._entries[key].next_seq

    def append(self, key: CacheKey, frame: bytes) -> int:
        """Store the next frame of a running request; returns its sequence number (the
        frame must already carry it: frames are stored in the order they are made)."""
        e = self._entries[key]
        if e.status is not EntryStatus.RUNNING:
            raise ValueError("cannot append to a finished entry")
        e.frames.append(frame)
        n = len(frame) + FRAME_OVERHEAD
        e.nbytes += n
        self.nbytes += n
        if self.nbytes > self.max_bytes and self.evict_finished:
            self._evict_until(lambda: self.nbytes <= self.max_bytes)
        return len(e.frames) - 1

    def finish(self, key: CacheKey, cacheable: bool = True,
               now: float | None = None) -> None:
        """Mark a request finished (its last frame, DONE or ERROR, already appended).
        cacheable=False (state-dependent errors: OVERLOADED, DRAINING, CANCELLED, INTERNAL)
        removes it, so a retry with the same request id runs again."""
        now = self._clock() if now is None else now
        e = self._entries.get(key)
        if e is None or e.status is EntryStatus.FINISHED:
            return
        if not cacheable:
            self._remove(key)
            self.stats["not_cached"] += 1
            return
        e.status = EntryStatus.FINISHED
        e.finished_at = now
        self._finished[key] = None
        self.stats["finished"] += 1

    def flush_finished(self) -> int:
        """Forget every finished entry (the operator's `cache-flush`); returns how many."""
        n = len(self._finished)
        for key in list(self._finished):
            self._remove(key)
        return n

    def discard(self, key: CacheKey) -> None:
        if key in self._entries:
            self._remove(key)

    def touch(self, key: CacheKey, now: float | None = None) -> None:
        """The client was heard from (RESEND, keepalive, duplicate INVOKE): renew its lease."""
        e = self._entries.get(key)
        if e is not None:
            e.last_seen = self._clock() if now is None else now

    def expired_leases(self, lease_s: float, now: float | None = None) -> list[CacheEntry]:
        """Running entries whose client has been silent longer than lease_s. The daemon
        cancels each (ERROR CANCELLED, frees its KV cache) and then finish(cacheable=False)."""
        now = self._clock() if now is None else now
        out = [e for e in self._entries.values()
               if e.status is EntryStatus.RUNNING and now - e.last_seen > lease_s]
        self.stats["lease_expired"] += len(out)
        return out

    def purge(self, now: float | None = None) -> int:
        """Drop finished entries older than the TTL."""
        now = self._clock() if now is None else now
        n = 0
        while self._finished:
            key = next(iter(self._finished))
            e = self._entries[key]
            assert e.finished_at is not None
            if now - e.finished_at < self.ttl_s:
                break
            self._remove(key)
            n += 1
        self.stats["expired"] += n
        return n

    def _make_room(self, nbytes: int, new_entry: bool) -> None:
        def fits() -> bool:
            return (self.nbytes + nbytes <= self.max_bytes
                    and (not new_entry or len(self._entries) < self.max_entries))
        if not fits() and self.evict_finished:
            self._evict_until(fits)
        if not fits():
            self.stats["refused"] += 1
            raise OverloadedError("result cache full")

    def _evict_until(self, done: Callable[[], bool]) -> None:
        while self._finished and not done():
            self._remove(next(iter(self._finished)))
            self.stats["evicted"] += 1

    def _remove(self, key: CacheKey) -> None:
        e = self._entries.pop(key)
        self._finished.pop(key, None)
        self.nbytes -= e.nbytes
