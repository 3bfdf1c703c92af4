"""Reassembly of multi-fragment INVOKE bodies, within a fixed memory budget and a timeout.

Only fragments whose HMAC already verified arrive here (see ingress.py), so every byte
held was sent by a key holder; the budget and the timeout bound what even a key holder can
make the daemon hold. Single-fragment requests never come here.

Policy (docs/PROTOCOL.md §9):
- A message reserves its whole declared total_len against the budget when its first
  fragment arrives (not as fragments trickle in), so the budget is a hard bound on memory
  and a full budget is detected at once.
- One key holds at most `per_key_bytes` (half the budget) and `per_key_messages` (half the
  slots): a key that could take every slot would get every other key refused even though
  its bytes were small (4,096 tiny two-fragment starts).
- Budget or slots full → a newcomer whose key holds less than the heaviest key evicts that
  key's oldest messages (max-min fairness: only the key holding the most ever loses, and
  only to a key holding less); otherwise the newcomer is refused (OVERLOADED). So a flood
  from one key costs that key its own oldest starts, never another key's requests.
- A message not complete `timeout_s` after its first fragment is dropped and counted
  (`expired`); the client's retry (fresh nonce) starts over. v1 has no per-fragment NACK.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from zerolayer.protocol.errors import MalformedError, OverloadedError


@dataclass(slots=True)
class _Pending:
    started: float
    total_len: int
    frag_count: int
    chunk_len: int
    meta: Hashable                    # fields every fragment must repeat identically
    parts: dict[int, bytes] = field(default_factory=dict)
    received: int = 0                 # body bytes held


class Assembled(NamedTuple):
    body: bytes
    started: float      # when the first fragment arrived (the request's receive time)


class Reassembler:
    """Messages are keyed (key id, request id, nonce): the first element is the key whose
    share is charged. per_key_bytes / per_key_messages (0 = half the budget / half the
    slots) bound what one key holder can reserve, so the rest stays open to other keys."""

    def __init__(self, budget_bytes: int = 64 << 20, timeout_s: float = 5.0,
                 max_messages: int = 4096, per_key_bytes: int = 0, per_key_messages: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_bytes = budget_bytes
        self.per_key_bytes = per_key_bytes or budget_bytes // 2
        self.per_key_messages = per_key_messages or max(1, max_messages // 2)
        # Per key: its messages in start order (the front is the one eviction takes) and
        # the bytes they reserve.
        self._key_msgs: dict[Hashable, OrderedDict[Hashable, None]] = {}
        self._key_bytes: dict[Hashable, int] = {}
        self.timeout_s = timeout_s
        self.max_messages = max_messages
        self._clock = clock
        # Insertion order == start order, and the timeout is the same for all, so the
        # oldest entries are always at the front: expiry is a scan from the left.
        self._pending: OrderedDict[Hashable, _Pending] = OrderedDict()
        self.reserved_bytes = 0
        self.stats = {"started": 0, "completed": 0, "expired": 0, "expired_bytes": 0,
                      "refused_budget": 0, "refused_key_share": 0, "evicted": 0,
                      "evicted_bytes": 0, "duplicate_fragments": 0, "inconsistent": 0}

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._pending

    def add(self, key: Hashable, frag_index: int, frag_count: int, total_len: int,
            chunk_len: int, body: bytes, meta: Hashable = None,
            now: float | None = None) -> Assembled | None:
        """Add one verified fragment. Returns the whole body when this fragment completes
        it, else None. Raises OverloadedError (budget/slots full) or MalformedError (the
        fragment disagrees with earlier fragments of the same message)."""
        now = self._clock() if now is None else now
        self.expire(now)
        p = self._pending.get(key)
        if p is None:
            owner = _owner(key)
            if (self._key_bytes.get(owner, 0) + total_len > self.per_key_bytes
                    or len(self._key_msgs.get(owner, ())) >= self.per_key_messages):
                self.stats["refused_key_share"] += 1
                raise OverloadedError("this key's share of the reassembly budget is full")
            self._make_room(owner, total_len)
            p = _Pending(now, total_len, frag_count, chunk_len, meta)
            self._pending[key] = p
            self._key_msgs.setdefault(owner, OrderedDict())[key] = None
            self._charge(owner, total_len)
            self.stats["started"] += 1
        elif (p.total_len, p.frag_count, p.chunk_len, p.meta) != (total_len, frag_count,
                                                                    chunk_len, meta):
            # The same (key, request id, nonce) with different framing: a client bug. Drop
            # the whole message; nothing sensible can be assembled from it.
            self._drop(key, p)
            self.stats["inconsistent"] += 1
            raise MalformedError("fragment header disagrees with earlier fragments")
        if frag_index in p.parts:
            self.stats["duplicate_fragments"] += 1
            return None
        p.parts[frag_index] = body
        p.received += len(body)
        if len(p.parts) < p.frag_count:
            return None
        self._drop(key, p)
        self.stats["completed"] += 1
        return Assembled(b"".join(p.parts[i] for i in range(p.frag_count)), p.started)

    def expire(self, now: float | None = None) -> int:
        """Drop messages older than the timeout; returns how many were dropped."""
        now = self._clock() if now is None else now
        n = 0
        deadline = now - self.timeout_s
        while self._pending:
            key, p = next(iter(self._pending.items()))
            if p.started > deadline:
                break
            self._drop(key, p)
            self.stats["expired"] += 1
            self.stats["expired_bytes"] += p.received
            n += 1
        return n

    def _make_room(self, owner: Hashable, total_len: int) -> None:
        """Free a slot and total_len bytes for a new message of `owner` by evicting the
        oldest messages of whichever key holds the most, as long as that key still holds
        more than `owner` would with this message. The evictions are planned first, so a
        newcomer that cannot get in is refused (OverloadedError) without evicting anyone."""
        slots = len(self._pending) + 1 - self.max_messages
        over = self.reserved_bytes + total_len - self.budget_bytes
        if slots <= 0 and over <= 0:
            return
        count = {k: len(m) for k, m in self._key_msgs.items()}
        held = dict(self._key_bytes)
        mine = (len(self._key_msgs.get(owner, ())) + 1, self._key_bytes.get(owner, 0) + total_len)
        queues = {k: iter(m) for k, m in self._key_msgs.items() if k != owner}
        victims = []
        while slots > 0 or over > 0:
            by_bytes = over > 0
            heavy = max(queues, key=held.__getitem__ if by_bytes else count.__getitem__,
                        default=None)
            if heavy is None or (held[heavy] <= mine[1] if by_bytes
                                 else count[heavy] <= mine[0]):
                self.stats["refused_budget"] += 1
                raise OverloadedError("reassembly budget full")
            victim = next(queues[heavy])
            victims.append(victim)
            n = self._pending[victim].total_len
            held[heavy] -= n
            count[heavy] -= 1
            over -= n
            slots -= 1
            if not count[heavy]:
                del queues[heavy]
        for victim in victims:
            p = self._pending[victim]
            self._drop(victim, p)
            self.stats["evicted"] += 1
            self.stats["evicted_bytes"] += p.received

    def _drop(self, key: Hashable, p: _Pending) -> None:
        del self._pending[key]
        owner = _owner(key)
        msgs = self._key_msgs[owner]
        del msgs[key]
        if not msgs:
            del self._key_msgs[owner]
        self._charge(owner, -p.total_len)

    def _charge(self, owner: Hashable, n: int) -> None:
        self.reserved_bytes += n
        left = self._key_bytes.get(owner, 0) + n
        if left:
            self._key_bytes[owner] = left
        else:
            self._key_bytes.pop(owner, None)


def _owner(key: Hashable) -> Hashable:
    """The key id of a (key id, request id, nonce) message key; other keys are their own."""
    return key[0] if isinstance(key, tuple) and key else key
