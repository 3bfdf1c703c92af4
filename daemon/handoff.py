"""A bounded single-producer / single-consumer queue with a wake-up fd: the hand-off between
the I/O thread and the engine thread (one each way).

No lock on the hot path: in CPython, `deque.append` and `deque.popleft` are atomic, and with
one producer and one consumer the only shared judgement is the length, which only the
consumer lowers, so a producer that saw room still has it. The consumer sleeps in
select/poll on `fileno()` (an eventfd); the producer makes it readable after putting items.
Items are put first and the fd written second, and the consumer clears the fd before it
drains, so a wake-up is never lost: at worst the consumer wakes once with nothing to do.

Draining an empty queue costs no system call: a busy-polling consumer (the I/O thread
under busy_poll) looks every few microseconds and never sleeps on the fd, so it never needs
it clear. The fd can then be left readable with nothing queued (the producer's write came
after the items were taken); a consumer about to sleep on it calls `rearm()` first, which
clears it and then looks at the queue once more, so that sleep is neither lost nor empty.

A full queue is the producer's to handle, explicitly: `put` returns False and counts it in
`full`; the I/O thread answers OVERLOADED, the engine thread waits for room. Never a drop.
"""
from __future__ import annotations

import os
import select
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    """`sizer`, if given, is what an item holds in bytes: `nbytes` is then the bytes queued
    now, kept as two counters that only one side each writes (the producer its puts, the
    consumer its takes), so no lock is needed."""

    def __init__(self, capacity: int, name: str = "",
                 sizer: Callable[[T], int] | None = None):
        if capacity < 1:
            raise ValueError("a hand-off queue needs capacity >= 1")
        self.capacity = capacity
        self.name = name
        self._sizer = sizer
        self.put_bytes = 0       # written by the producer only
        self.taken_bytes = 0     # written by the consumer only
        self._q: deque[T] = deque()
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.full = 0            # puts refused for want of room (producer side)
        self.high_water = 0

    @property
    def nbytes(self) -> int:
        """Bytes queued now (with a sizer; else 0). Read from either side, it may lag the
        other side's last put or take by that one item."""
        return max(0, self.put_bytes - self.taken_bytes)

    def fileno(self) -> int:
        return self._fd

    def __len__(self) -> int:
        return len(self._q)

    def put(self, item: T, wake: bool = True) -> bool:
        """Queue an item; False (and counted) when full. wake=False defers the wake-up to a
        later `wake()`, to signal a batch of items with one write."""
        q = self._q
        if len(q) >= self.capacity:
            self.full += 1
            return False
        if self._sizer is not None:
            self.put_bytes += self._sizer(item)
        q.append(item)
        if len(q) > self.high_water:
            self.high_water = len(q)
        if wake:
            self.wake()
        return True

    def wake(self) -> None:
        try:
            os.eventfd_write(self._fd, 1)
        except BlockingIOError:  # the counter is saturated: the consumer is awake anyway
            pass

    def drain(self, limit: int | None = None) -> list[T]:
        """Take every queued item (at most `limit`), oldest first. Clears the wake-up first;
        with nothing queued, returns at once (no system call)."""
        q = self._q
        if not q:
            return []
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            pass
        n = len(q) if limit is None else min(limit, len(q))
        out = [q.popleft() for _ in range(n)]
        if self._sizer is not None:
            self.taken_bytes += sum(map(self._sizer, out))
        if q:  # left behind by `limit`: stay readable
            self.wake()
        return out

    def rearm(self) -> bool:
        """Before sleeping on the fd: clear it, then True if something is queued (do not
        sleep). An item put meanwhile is seen here or keeps the fd readable."""
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            pass
        return bool(self._q)

    def wait(self, timeout: float | None) -> bool:
        """Sleep until something is queued (or timeout); True if there is."""
        if self._q:
            return True
        select.select([self._fd], [], [], timeout)
        return bool(self._q) or self.rearm()   # woken with nothing queued: clear the fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
