"""Reassembly: bounded budget, timeout, counters, any arrival order."""
from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from zerolayer.daemon.reassembly import Reassembler
from zerolayer.protocol.errors import MalformedError, OverloadedError


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _chunks(body: bytes, chunk: int) -> list[bytes]:
    return [body[i:i + chunk] for i in range(0, len(body), chunk)]


def _feed(r: Reassembler, key: object, body: bytes, chunk: int, order: list[int],
          meta: object = "m") -> bytes | None:
    parts = _chunks(body, chunk)
    out = None
    for i in order:
        got = r.add(key, i, len(parts), len(body), chunk, parts[i], meta=meta)
        if got is not None:
            assert out is None
            out = got.body
    return out


@given(body=st.binary(min_size=257, max_size=4000), chunk=st.integers(256, 1252),
       data=st.data())
def test_any_order_with_duplicates_reassembles_exactly(body: bytes, chunk: int,
                                                       data: st.DataObject) -> None:
    n = len(_chunks(body, chunk))
    assume(n >= 2)      # single-fragment requests never reach the reassembler
    order = data.draw(st.permutations(range(n)))
    # Duplicates of fragments already received, arriving before the last new fragment so
    # they hit the open buffer.
    dups = data.draw(st.lists(st.sampled_from(order[:-1]), max_size=4))
    order = list(order[:-1]) + dups + [order[-1]]
    r = Reassembler()
    assert _feed(r, "k", body, chunk, order) == body
    assert r.reserved_bytes == 0 and len(r) == 0
    assert r.stats["completed"] == 1 and r.stats["duplicate_fragments"] == len(dups)


def test_budget_is_reserved_up_front_and_refuses_new_messages() -> None:
    r = Reassembler(budget_bytes=5000, per_key_bytes=5000, clock=Clock())
    body = bytes(3000)
    parts = _chunks(body, 1000)
    assert r.add("a", 0, 3, 3000, 1000, parts[0]) is None
    assert r.reserved_bytes == 3000           # the whole message, not the 1000 received
    with pytest.raises(OverloadedError):
        r.add("b", 0, 3, 3000, 1000, parts[0])
    assert r.stats["refused_budget"] == 1
    # The message in progress was not evicted and still completes.
    r.add("a", 1, 3, 3000, 1000, parts[1])
    assert r.add("a", 2, 3, 3000, 1000, parts[2]) is not None
    assert r.reserved_bytes == 0
    # Now there is room again.
    assert r.add("b", 0, 3, 3000, 1000, parts[0]) is None


def test_message_count_cap() -> None:
    r = Reassembler(max_messages=2, clock=Clock())
    r.add("a", 0, 2, 600, 300, bytes(300))
    r.add("b", 0, 2, 600, 300, bytes(300))
    with pytest.raises(OverloadedError):
        r.add("c", 0, 2, 600, 300, bytes(300))


def test_incomplete_messages_time_out_and_are_counted() -> None:
    clk = Clock()
    r = Reassembler(timeout_s=5.0, clock=clk)
    r.add("a", 0, 3, 3000, 1000, bytes(1000))
    clk.t += 2
    r.add("b", 1, 2, 2000, 1000, bytes(1000))
    clk.t += 3.5                                 # a is 5.5 s old, b 3.5 s
    assert r.expire() == 1
    assert "a" not in r and "b" in r
    assert r.stats["expired"] == 1 and r.stats["expired_bytes"] == 1000
    assert r.reserved_bytes == 2000
    # A late fragment of the dropped message starts over rather than completing it.
    assert r.add("a", 1, 3, 3000, 1000, bytes(1000)) is None
    clk.t += 10
    r.expire()
    assert len(r) == 0 and r.reserved_bytes == 0 and r.stats["expired"] == 3


def test_add_expires_lazily() -> None:
    clk = Clock()
    r = Reassembler(budget_bytes=3000, per_key_bytes=3000, timeout_s=1.0, clock=clk)
    r.add("a", 0, 3, 3000, 1000, bytes(1000))
    clk.t += 2
    # The budget is full, but the stale message is dropped first, so this one fits.
    assert r.add("b", 0, 3, 3000, 1000, bytes(1000)) is None
    assert r.stats["expired"] == 1


def test_inconsistent_fragments_drop_the_message() -> None:
    r = Reassembler(clock=Clock())
    r.add("a", 0, 3, 3000, 1000, bytes(1000), meta=("ts1", "digest"))
    with pytest.raises(MalformedError):
        r.add("a", 1, 3, 3000, 1000, bytes(1000), meta=("ts2", "digest"))
    assert "a" not in r and r.reserved_bytes == 0 and r.stats["inconsistent"] == 1
    r.add("b", 0, 3, 3000, 1000, bytes(1000))
    with pytest.raises(MalformedError):
        r.add("b", 1, 4, 3500, 1000, bytes(1000))


def test_assembled_reports_first_fragment_time() -> None:
    clk = Clock()
    r = Reassembler(clock=clk)
    r.add("a", 1, 2, 600, 300, bytes(300))
    clk.t += 0.25
    got = r.add("a", 0, 2, 600, 300, bytes(300))
    assert got is not None and got.started == 100.0


def test_one_key_cannot_take_the_whole_budget():
    """Key 1 may reserve half the budget; its next message is refused while key 2's fits;
    completing a message gives the share back."""
    r = Reassembler(budget_bytes=4000, clock=Clock())
    assert r.per_key_bytes == 2000
    r.add((1, b"a", b"n1"), 0, 2, 2000, 1000, b"x" * 1000)
    with pytest.raises(OverloadedError, match="this key's share"):
        r.add((1, b"b", b"n2"), 0, 2, 1000, 500, b"x" * 500)
    r.add((2, b"c", b"n3"), 0, 2, 2000, 1000, b"y" * 1000)
    assert r.stats["refused_key_share"] == 1 and r.reserved_bytes == 4000
    assert r.add((1, b"a", b"n1"), 1, 2, 2000, 1000, b"x" * 1000) is not None
    r.add((1, b"b", b"n2"), 0, 2, 1000, 500, b"x" * 500)  # key 1's share is free again


def _start(r: Reassembler, key_id: int, n: int, total: int = 600) -> None:
    """The first of two fragments of message n of key `key_id`: a slot held open."""
    r.add((key_id, b"r%d" % n, b"n%d" % n), 0, 2, total, 300, bytes(300))


def test_a_flooding_key_cannot_get_another_key_refused():
    """The slot-flooding attack: one key fills every slot with tiny two-fragment starts.
    It gets half the slots; the other half stays open, and another key's requests all
    complete while the flood goes on."""
    r = Reassembler(max_messages=64, clock=Clock())
    assert r.per_key_messages == 32
    refused = 0
    for n in range(200):                      # far more starts than there are slots
        try:
            _start(r, 1, n)
        except OverloadedError:
            refused += 1
    assert len(r) == 32 and refused == 200 - 32
    assert r.stats["refused_key_share"] == refused
    for n in range(200):                      # key 2: 200 multi-fragment requests, none refused
        key = (2, b"q%d" % n, b"m%d" % n)
        assert r.add(key, 0, 2, 600, 300, bytes(300)) is None
        assert r.add(key, 1, 2, 600, 300, bytes(300)) is not None
        with pytest.raises(OverloadedError):  # while the flood keeps going
            _start(r, 1, 1000 + n)
    assert r.stats["completed"] == 200


def test_full_slots_evict_the_heaviest_keys_oldest_message_for_a_lighter_key():
    """Two flooding keys together fill every slot: a key holding less than the heaviest
    still gets in, at the cost of the heaviest key's oldest start; never the reverse."""
    r = Reassembler(max_messages=8, clock=Clock())
    for n in range(4):
        _start(r, 1, n)                       # key 1: its share, 4 slots
    for n in range(4):
        _start(r, 3, 10 + n)                  # key 3: the other 4; all slots taken
    with pytest.raises(OverloadedError):      # key 1 may not take key 3's (its share is full)
        _start(r, 1, 4)
    _start(r, 2, 20)                          # key 2 holds none: key 1's oldest goes
    assert (1, b"r0", b"n0") not in r and r.stats["evicted"] == 1 and len(r) == 8
    _start(r, 2, 21)                          # now key 3 holds most: its oldest goes
    assert (3, b"r10", b"n10") not in r and r.stats["evicted"] == 2
    with pytest.raises(OverloadedError, match="budget full"):
        _start(r, 2, 22)                      # 3 would hold as much as the others: refused
    assert r.stats["evicted"] == 2 and len(r) == 8
    assert {k: len(m) for k, m in r._key_msgs.items()} == {1: 3, 3: 3, 2: 2}


def test_full_bytes_evict_for_a_lighter_key_and_never_evict_in_vain():
    r = Reassembler(budget_bytes=6000, max_messages=100, clock=Clock())
    assert r.per_key_bytes == 3000
    for n in range(3):
        _start(r, 1, n, total=1000)           # key 1: 3000 bytes, its share
    for n in range(3):
        _start(r, 3, 10 + n, total=1000)      # key 3: 3000; the budget is full
    # key 2 asks for 2500: after two evictions the others would hold 2000 each, less than
    # 2500, so it is refused, and nothing is evicted for it
    with pytest.raises(OverloadedError, match="budget full"):
        r.add((2, b"big", b"n"), 0, 3, 2500, 1000, bytes(1000))
    assert r.stats["evicted"] == 0 and r.reserved_bytes == 6000
    r.add((2, b"mid", b"n"), 0, 2, 2000, 1000, bytes(1000))   # 2000 fits after two evictions
    assert r.stats["evicted"] == 2 and r.stats["evicted_bytes"] == 600
    assert r.reserved_bytes == 6000 and r._key_bytes == {1: 2000, 3: 2000, 2: 2000}
