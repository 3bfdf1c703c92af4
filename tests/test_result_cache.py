"""Idempotency cache: attach to running, replay finished, TTL, bounds, leases."""
from __future__ import annotations

import pytest

from zerolayer.daemon.result_cache import ENTRY_OVERHEAD, FRAME_OVERHEAD, EntryStatus, ResultCache
from zerolayer.protocol.errors import OverloadedError


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


K1 = (1, b"a" * 16)
K2 = (1, b"b" * 16)
K3 = (2, b"a" * 16)   # same request id, other key: a different request


def test_duplicate_of_running_attaches_and_of_finished_replays() -> None:
    c = ResultCache(clock=Clock())
    assert c.lookup(K1) is None
    e = c.start(K1)
    assert e.status is EntryStatus.RUNNING and e.run_id != 0
    assert c.append(K1, b"tok0") == 0
    assert c.append(K1, b"tok1") == 1
    dup = c.lookup(K1)
    assert dup is e and dup.frames_from(0) == [b"tok0", b"tok1"]
    assert c.stats["attached"] == 1
    assert c.lookup(K3) is None               # key id is part of the identity
    c.append(K1, b"done")
    c.finish(K1)
    dup = c.lookup(K1)
    assert dup is not None and dup.status is EntryStatus.FINISHED
    assert dup.frames_from(1) == [b"tok1", b"done"] and dup.frames_from(3) == []
    assert dup.frames_from(0, limit=2) == [b"tok0", b"tok1"]
    assert c.stats["replayed"] == 1 and c.stats["started"] == 1
    with pytest.raises(ValueError):
        c.start(K1)                           # the caller must look up first
    with pytest.raises(ValueError):
        c.append(K1, b"late")


def test_finished_entries_expire_after_ttl_running_ones_do_not() -> None:
    clk = Clock()
    c = ResultCache(ttl_s=300, clock=clk)
    c.start(K1)
    c.start(K2)
    c.finish(K1)
    clk.t += 299
    assert c.get(K1) is not None
    clk.t += 2
    assert c.get(K1) is None and c.stats["expired"] == 1
    clk.t += 10_000
    assert c.get(K2) is not None              # running: ends by engine or lease only
    c.start(K1)                               # after expiry, the same id runs again


def test_state_dependent_errors_are_not_cached() -> None:
    c = ResultCache(clock=Clock())
    c.start(K1)
    c.append(K1, b"error-overloaded")
    c.finish(K1, cacheable=False)
    assert c.get(K1) is None and c.nbytes == 0 and c.stats["not_cached"] == 1


def test_run_ids_are_distinct_and_nonzero() -> None:
    c = ResultCache(clock=Clock())
    ids = set()
    for i in range(100):
        key = (1, i.to_bytes(16, "little"))
        ids.add(c.start(key).run_id)
        c.finish(key)
    assert len(ids) == 100 and 0 not in ids


def test_full_cache_evicts_oldest_finished_first() -> None:
    clk = Clock()
    c = ResultCache(max_entries=2, clock=clk)
    c.start(K1)
    c.finish(K1)
    clk.t += 1
    c.start(K2)
    c.finish(K2)
    c.start(K3)                                # evicts K1, the oldest finished
    assert c.get(K1) is None and c.get(K2) is not None and c.stats["evicted"] == 1


def test_full_cache_refuses_when_eviction_disabled_or_only_running() -> None:
    c = ResultCache(max_entries=2, evict_finished=False, clock=Clock())
    c.start(K1)
    c.finish(K1)
    c.start(K2)
    with pytest.raises(OverloadedError):
        c.start(K3)
    assert c.get(K1) is not None and c.stats["refused"] == 1
    c2 = ResultCache(max_entries=2, clock=Clock())
    c2.start(K1)
    c2.start(K2)
    with pytest.raises(OverloadedError):      # running entries are never evicted
        c2.start(K3)


def test_byte_budget_counts_frames_and_evicts_finished() -> None:
    frame = bytes(1000)
    per = ENTRY_OVERHEAD + 3 * (1000 + FRAME_OVERHEAD)
    c = ResultCache(max_bytes=2 * per + 10, clock=Clock())
    for key in (K1, K2):
        c.start(key)
        for _ in range(3):
            c.append(key, frame)
        c.finish(key)
    assert c.nbytes == 2 * per
    c.start(K3)
    c.append(K3, frame)                        # over budget → K1 goes
    assert c.get(K1) is None and c.get(K2) is not None
    assert c.nbytes <= c.max_bytes


def test_leases_expire_for_silent_clients_only() -> None:
    clk = Clock()
    c = ResultCache(clock=clk)
    c.start(K1)
    c.start(K2)
    c.start(K3)
    c.finish(K3)
    clk.t += 8
    c.touch(K2)                                # K2's client sent a keepalive
    clk.t += 4
    expired = c.expired_leases(lease_s=10)
    assert [e.key for e in expired] == [K1]    # K3 finished: no lease
    assert c.running == 2
