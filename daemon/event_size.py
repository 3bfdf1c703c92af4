"""What one engine → I/O event holds, in bytes, for the events buffer's gauge
(memory_bounds.py).

A flat figure per event (it was 512 B) under-counts a stream with logprobs 2-4 times: each
of its tokens carries up to 21 encoded entries (the sampled token and 20 alternatives),
each a bytes object of 12 B plus the token's bytes. So an event counts its base (the
object, its request reference, a few bytes of text) plus its text and every entry with its
object overhead, as CPython 3.11 lays them out (sys.getsizeof: a bytes object is 33 B plus
its length; a tuple 40 B plus 8 B a slot).
"""
from __future__ import annotations

from .request import EngineEvent, TextEvent

# The event object and what it refers to besides text and entries (measured with
# tracemalloc, as the other figures of memory_bounds.py).
EVENT_BYTES = 512
BYTES_OBJECT = 33      # a bytes object's header
TUPLE_BYTES = 40       # a tuple's header
SLOT_BYTES = 8         # one tuple slot
# The most one token's entries take: 21 entries of 12 B and a token of up to 64 bytes
# (longer tokens are rare in any vocabulary), each an object in a slot, in one tuple.
TOKEN_ENTRIES_BYTES = TUPLE_BYTES + 21 * (SLOT_BYTES + BYTES_OBJECT + 12 + 64)
# What the events bound assumes per event: one token's worth, with its entries.
EVENT_LIMIT_BYTES = EVENT_BYTES + TOKEN_ENTRIES_BYTES


def event_bytes(ev: EngineEvent) -> int:
    """The bytes `ev` holds: its base, and for text its characters (at most 4 B each) and
    its logprob entries."""
    if not isinstance(ev, TextEvent):
        return EVENT_BYTES
    n = EVENT_BYTES + 4 * len(ev.text)
    for position in ev.logprobs:
        n += TUPLE_BYTES + sum(SLOT_BYTES + BYTES_OBJECT + len(e) for e in position)
    return n
