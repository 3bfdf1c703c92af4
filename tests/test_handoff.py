"""The hand-off queue between the I/O thread and the engine thread (daemon/handoff.py):
bounded, order-keeping, a full queue refused and counted (never a drop), and a wake-up that
is never lost between one producer thread and one consumer thread."""
from __future__ import annotations

import select
import threading

import pytest

from zerolayer.daemon.handoff import Handoff


def readable(h: Handoff) -> bool:
    return bool(select.select([h], [], [], 0)[0])


def test_full_queue_refuses_and_counts() -> None:
    h: Handoff[int] = Handoff(2, "admissions")
    assert h.put(1) and h.put(2)
    assert not h.put(3) and not h.put(4)
    assert h.full == 2 and len(h) == 2 and h.high_water == 2
    assert h.drain() == [1, 2]  # the refused items were never queued
    assert h.put(5) and h.drain() == [5]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Handoff(0)


def test_wake_up_and_drain_clear_it() -> None:
    h: Handoff[str] = Handoff(8)
    assert not readable(h)
    h.put("a")
    assert readable(h)
    assert h.drain() == ["a"]
    assert not readable(h)
    h.put("b", wake=False)  # deferred: the producer signals a batch once
    h.put("c", wake=False)
    assert not readable(h) and h.wait(0)  # wait() looks at the queue, not only the fd
    h.wake()
    assert readable(h) and h.drain() == ["b", "c"]


def test_a_wake_up_after_the_items_were_taken_is_cleared_by_rearm() -> None:
    """The producer's fd write can come after the consumer took its items. A busy-polling
    consumer leaves that fd alone (draining an empty queue is free); one about to sleep
    rearms first, and wait() clears it by itself, so neither spins on a readable fd."""
    h: Handoff[str] = Handoff(8)
    h.put("a", wake=False)
    assert h.drain() == ["a"]
    h.wake()                                  # the late write
    assert h.drain() == [] and readable(h)    # no system call on an empty queue
    assert h.rearm() is False and not readable(h)
    h.put("b")
    assert h.rearm() is True and h.drain() == ["b"]   # queued: do not sleep
    h.wake()
    assert h.wait(0) is False and not readable(h)


def test_drain_with_a_limit_stays_readable_for_the_rest() -> None:
    h: Handoff[int] = Handoff(8)
    for i in range(5):
        h.put(i)
    assert h.drain(limit=2) == [0, 1]
    assert readable(h)
    assert h.drain() == [2, 3, 4]
    assert not readable(h)


def test_wait_times_out_when_empty() -> None:
    h: Handoff[int] = Handoff(1)
    assert h.wait(0.01) is False


def test_one_producer_one_consumer_keep_order_and_lose_nothing() -> None:
    """A producer that retries when refused (as the engine thread does with its events)
    and a consumer that sleeps on the fd: every item arrives once, in order."""
    n = 20000
    h: Handoff[int] = Handoff(16)
    got: list[int] = []

    def consume() -> None:
        while len(got) < n:
            h.wait(1.0)
            got.extend(h.drain())

    t = threading.Thread(target=consume)
    t.start()
    for i in range(n):
        while not h.put(i):
            pass
    t.join(60)
    assert not t.is_alive()
    assert got == list(range(n))
    assert h.high_water <= 16
