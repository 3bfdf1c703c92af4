"""Streams on a fake clock (the time passed in with each event): the I/O side alone defines a
request's TTFT and its DONE's total_us (first datagram received -> first token's frame / DONE
sent), whatever the engine's timings say. No socket, no model: a real result cache, in-flight
record, metrics and signer."""
from __future__ import annotations

import pytest

from zerolayer.daemon.in_flight import InFlight
from zerolayer.daemon.ops.metrics import Metrics
from zerolayer.daemon.request import AcceptedEvent, Admitted, CancelReason, DoneEvent, Request, TextEvent
from zerolayer.daemon.result_cache import ResultCache
from zerolayer.daemon.streams import Streams
from zerolayer.protocol.sampling_params import SamplingParams
from zerolayer.protocol.wire import (
    DoneFrame,
    FinishReason,
    ResponseSigner,
    Timings,
    TokenFrame,
    Usage,
    decode_response,
)

SECRET = bytes(range(32))
RID = bytes(16)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def monotonic(self) -> float:
        return self.t


@pytest.fixture
def setup():
    clock = Clock(100.0)
    cache = ResultCache(clock=clock.monotonic)
    in_flight = InFlight(cache, 1)
    sent: list[bytes] = []
    metrics = Metrics()
    s = Streams(in_flight, metrics, lambda frame, addr: sent.append(frame))
    r = Request(Admitted((7, RID), SamplingParams(), received_at=100.0, ingress_us=40),
                ResponseSigner(7, SECRET, RID))
    cache.start(r.key)
    in_flight.admit(r)
    return clock, s, r, metrics, sent


def ttft_count_and_sum(metrics: Metrics) -> tuple[float, float]:
    samples = {s.name: s.value for fam in metrics.ttft.collect() for s in fam.samples}
    return (samples["zerolayer_time_to_first_token_seconds_count"],
            samples["zerolayer_time_to_first_token_seconds_sum"])


def test_ttft_is_first_datagram_to_first_token_frame_once(setup):
    clock, s, r, metrics, sent = setup
    clock.t = 100.125
    s.on_event(TextEvent(r.admitted, "", 0), clock.t)  # text held back, no token yet: not the first
    assert ttft_count_and_sum(metrics) == (0, 0)
    clock.t = 100.25
    s.on_event(TextEvent(r.admitted, "Par", 1), clock.t)
    clock.t = 100.5
    s.on_event(TextEvent(r.admitted, "is", 1), clock.t)
    assert ttft_count_and_sum(metrics) == (1, 0.25)
    clock.t = 100.75
    s.on_event(DoneEvent(r.admitted, FinishReason.STOP, Usage(3, 0, 2), Timings(prefill_us=5)),
               clock.t)
    assert ttft_count_and_sum(metrics) == (1, 0.25)
    assert sum(isinstance(decode_response(f, SECRET), TokenFrame) for f in sent) == 3


def test_total_us_is_first_datagram_to_done_sent(setup):
    clock, s, r, metrics, sent = setup
    clock.t = 100.75
    # whatever total the event carries, the DONE says what the I/O side saw
    s.on_event(DoneEvent(r.admitted, FinishReason.LENGTH, Usage(3, 0, 1),
                         Timings(queue_us=10, prefill_us=20, total_us=1)), clock.t)
    done = decode_response(sent[-1], SECRET)
    assert isinstance(done, DoneFrame)
    assert done.timings.total_us == 750_000
    assert done.timings.ingress_us == 40
    assert (done.timings.queue_us, done.timings.prefill_us) == (10, 20)
    assert r.closed


def test_the_stop_index_is_the_engines_event(setup):
    """DONE's stop_index comes in the engine's DoneEvent: the I/O side never reads the
    engine's stop checker (which the engine keeps to itself)."""
    clock, s, r, metrics, sent = setup
    s.on_event(DoneEvent(r.admitted, FinishReason.STOP, Usage(3, 0, 2), Timings(), stop_index=2),
               clock.t)
    done = decode_response(sent[-1], SECRET)
    assert isinstance(done, DoneFrame)
    assert (done.finish_reason, done.stop_index) == (FinishReason.STOP, 2)


def test_a_cancels_usage_is_what_the_engines_events_reported(setup):
    """The client's CANCEL is answered on the I/O thread at once: its DONE's usage and
    tokenizing time come from the events the engine sent, never from the engine's own fields
    (which the engine thread may be writing meanwhile)."""
    clock, s, r, metrics, sent = setup
    s.on_event(AcceptedEvent(r.admitted, 37, 512), clock.t)
    s.on_event(TextEvent(r.admitted, "Par", 1, cached=36), clock.t)
    s.on_event(TextEvent(r.admitted, "", 0, cached=36), clock.t)  # held text: no token framed
    clock.t = 100.5
    s.cancel(r, CancelReason.CLIENT, clock.t)
    done = decode_response(sent[-1], SECRET)
    assert isinstance(done, DoneFrame) and done.finish_reason is FinishReason.CANCELLED
    assert (done.usage.prompt_tokens, done.usage.cached_prompt_tokens,
            done.usage.completion_tokens) == (37, 36, 1)
    assert done.timings.tokenize_us == 512 and done.timings.total_us == 500_000
