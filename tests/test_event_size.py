"""The events buffer's gauge counts each engine → I/O event as it is (daemon/event_size.py):
a stream with top_logprobs 20 carries 21 entries a token, which a flat 512 B an event
under-counted several times over. The events are the engine's own, from the bundled model."""
from __future__ import annotations

import sys

import numpy as np

from zerolayer.daemon.engine import Engine
from zerolayer.daemon.event_size import EVENT_BYTES, EVENT_LIMIT_BYTES, event_bytes
from zerolayer.daemon.handoff import Handoff
from zerolayer.daemon.request import Admitted, TextEvent
from zerolayer.protocol.sampling_params import SamplingParams


def _events(generator, top: int | None) -> list:
    events: list = []
    eng = Engine(generator.model, generator.tokenizer, emit=events.append)
    ids = np.array(generator.tokenizer.encode("The capital of France is"), np.int32)
    p = (SamplingParams(max_tokens=6) if top is None else
         SamplingParams(max_tokens=6, logprobs=True, top_logprobs=top))
    eng.submit(Admitted(0, p), ids)
    while eng.has_work:
        eng.step()
    eng.prefix.clear()
    return [ev for ev in events if isinstance(ev, TextEvent)]


def _measured(ev: TextEvent) -> int:
    """What CPython itself says the text and the entries take (sys.getsizeof)."""
    return (sys.getsizeof(ev.text) + sum(sys.getsizeof(pos) + sum(map(sys.getsizeof, pos))
                                         for pos in ev.logprobs))


def test_an_event_with_top_logprobs_20_counts_its_entries(generator):
    plain = _events(generator, None)
    rich = _events(generator, 20)
    assert rich and all(len(pos) == 21 for ev in rich for pos in ev.logprobs)
    for ev in rich:
        n = event_bytes(ev)
        assert n >= EVENT_BYTES + _measured(ev) - sys.getsizeof("")  # never under
        assert n >= 2 * EVENT_BYTES          # what the flat figure missed: 2x and more
    assert all(event_bytes(ev) < 2 * EVENT_BYTES for ev in plain)
    one_token = [ev for ev in rich if len(ev.logprobs) == 1]
    assert one_token and all(event_bytes(ev) <= EVENT_LIMIT_BYTES for ev in one_token)


def test_the_events_hand_off_holds_what_is_queued(generator):
    rich = _events(generator, 20)
    h: Handoff = Handoff(len(rich), "events", sizer=event_bytes)
    for ev in rich:
        assert h.put(ev, wake=False)
    assert h.nbytes == sum(map(event_bytes, rich))
    h.drain(limit=1)
    assert h.nbytes == sum(map(event_bytes, rich[1:]))
    h.drain()
    assert h.nbytes == 0
