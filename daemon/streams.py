"""Engine events become frames, on the I/O thread: TOKEN, DONE, ERROR, each stored in the
result cache before it is sent, and the metrics and lifecycle events that a request's end
brings.

Every frame of a request goes through `emit`, which numbers it, stores it and queues it for
the carrier that owns the request's address, in that order: a RESEND or a duplicate can then
only ever be answered with frames that exist. A request's last frame (DONE or ERROR) closes
it in the in-flight record in the same call, so a late event for it (the engine a step
behind a CANCEL, a lease or a drain) finds no record and is dropped, never sent. Events name
their request by what the engine was given (request.Admitted); the record is looked up from
that, so nothing here reads the engine's state.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from zerolayer.protocol.errors import ERROR_INFO, ErrorCode
from zerolayer.protocol.logprobs import pack_frames
from zerolayer.protocol.wire import MAX_TEXT, FinishReason, Timings, Usage, split_utf8

from .carriers import Address
from .in_flight import InFlight
from .lifecycle_events import Publisher
from .ops.metrics import Metrics
from .request import AcceptedEvent, CancelReason, DoneEvent, EngineEvent, FailedEvent, Request, TextEvent

Send = Callable[[bytes, Address], None]


def ids(r: Request) -> dict[str, int | str]:
    """A request's identity in a lifecycle event."""
    return {"key_id": r.key[0], "request_id": r.key[1].hex(), "run_id": r.run_id}


class Streams:
    def __init__(self, in_flight: InFlight, metrics: Metrics, send: Send,
                 publisher: Publisher | None = None) -> None:
        self.in_flight = in_flight
        self.metrics = metrics
        self.send = send
        self.publisher = publisher
        self.tokens_out = 0          # tokens generated, for systemd's STATUS line's tok/s

    def on_event(self, ev: EngineEvent, now: float) -> None:
        """An engine's event about one request (EngineDied is the daemon's, not a stream's),
        at monotonic time `now`."""
        if isinstance(ev, AcceptedEvent):  # the engine took it: a model run, even if it was
            self.metrics.model_runs.inc()  # cancelled meanwhile (its DONE is in its stream)
        r = self.in_flight.record(ev.req)  # type: ignore[union-attr]
        if r is None:
            return  # answered already (cancelled, lease, drain): the engine caught up
        if isinstance(ev, AcceptedEvent):
            r.reported_prompt, r.reported_tokenize_us = ev.prompt_tokens, ev.tokenize_us
        elif isinstance(ev, TextEvent):
            self._text(r, ev, now)
        elif isinstance(ev, DoneEvent):
            self.done(r, ev.reason, ev.usage, ev.timings, now, ev.stop_index)
            self.metrics.speculative_tokens.labels("drafted").inc(ev.drafted)
            self.metrics.speculative_tokens.labels("accepted").inc(ev.accepted)
        elif isinstance(ev, FailedEvent):
            self.fail(r, ev.code, ev.message, started=ev.started)

    def _text(self, r: Request, ev: TextEvent, now: float) -> None:
        r.reported_cached = ev.cached
        if r.sent_tokens == 0 and ev.n_tokens:
            # TTFT, the one definition: first datagram received -> first token's frame sent
            # (the metric and the lifecycle event alike), on the clock of the side that sends
            ttft = now - r.received_at
            self.metrics.ttft.observe(ttft)
            if self.publisher is not None:
                self.publisher.publish("first_token", **ids(r), ttft_s=round(ttft, 6))
        if r.t_text and ev.n_tokens:
            gap = (now - r.t_text) / ev.n_tokens
            for _ in range(ev.n_tokens):
                self.metrics.token_gap.observe(gap)
        if ev.n_tokens:
            r.t_text = now
        pieces = split_utf8(ev.text.encode("utf-8"), MAX_TEXT)
        # With logprobs asked, their entries follow the text, in as many frames as they
        # need; without, the frames are the text's alone (no entries: lp_len 0).
        frames = (pack_frames(pieces, ev.n_tokens, ev.logprobs, MAX_TEXT) if ev.logprobs else
                  [(p, b"", ev.n_tokens if i == len(pieces) - 1 else 0)
                   for i, p in enumerate(pieces)])
        for piece, entries, n in frames:
            self.emit(r, r.signer.token(self._seq(r), r.run_id, piece, n, entries))
        r.sent_tokens += ev.n_tokens

    def emit(self, r: Request, frame: bytes) -> None:
        self.in_flight.cache.append(r.key, frame)
        self.send(frame, r.addr)

    def _seq(self, r: Request) -> int:
        return self.in_flight.cache.next_seq(r.key)

    def cancel(self, r: Request, why: CancelReason, now: float) -> None:
        """Stop a request now, on the I/O thread: its last frame goes out at once (DONE
        cancelled for the client's own CANCEL, ERROR CANCELLED when the daemon decides), and
        the engine frees its KV at its next step boundary (keeping the prompt's KV for
        reuse). Tokens of a step in flight for it are dropped when they arrive."""
        if r.closed:
            return
        r.cancel(why)
        if why is not CancelReason.CLIENT:
            return self.fail(r, ErrorCode.CANCELLED, why.value)
        # what the engine's events said so far: the I/O side never reads the engine's fields
        usage = Usage(r.reported_prompt, r.reported_cached, r.sent_tokens)
        self.done(r, FinishReason.CANCELLED, usage, Timings(tokenize_us=r.reported_tokenize_us),
                  now)

    def done(self, r: Request, fr: FinishReason, usage: Usage, t: Timings, now: float,
             stop_index: int = 0) -> None:
        """The request's last frame, a DONE. The engine's timings are its stages; total_us
        (first datagram received -> this DONE sent) and ingress_us are set here, the one side
        that sees both ends of the request."""
        t = dataclasses.replace(t, total_us=int((now - r.received_at) * 1e6),
                                ingress_us=r.admitted.ingress_us)
        self.emit(r, r.signer.done(self._seq(r), r.run_id, fr, usage, t, stop_index))
        self.in_flight.close(r, cacheable=True)
        if self.publisher is not None:
            self.publisher.publish("finished", **ids(r), finish_reason=fr.label,
                                   usage=dataclasses.asdict(usage),
                                   timings=dataclasses.asdict(t))
        m = self.metrics
        m.requests.labels(fr.label).inc()
        m.prompt_tokens.inc(usage.prompt_tokens)
        m.generated_tokens.inc(usage.completion_tokens)
        self.tokens_out += usage.completion_tokens
        m.e2e.observe(now - r.received_at)
        if usage.completion_tokens > 1 and fr is not FinishReason.CANCELLED:
            m.itl.observe(t.decode_per_token_us / 1e6)
            m.step_max.observe(t.decode_step_max_us / 1e6)
        for stage, us in (("queue", t.queue_us), ("tokenize", t.tokenize_us),
                          ("prefill", t.prefill_us), ("decode", t.decode_us)):
            m.stage.labels(stage).observe(us / 1e6)
        m.prefix_tokens.labels("hit").inc(usage.cached_prompt_tokens)
        m.prefix_tokens.labels("miss").inc(usage.prompt_tokens - usage.cached_prompt_tokens)

    def fail(self, r: Request, code: ErrorCode, msg: str, started: bool = True) -> None:
        """The request's last frame, an ERROR. started=False (the engine refused it before
        accepting it): framed as a request that never started, seq 0xFFFFFFFF and run id 0
        (docs/PROTOCOL.md §5.3), though its ACK went out; stored like any last frame, so a
        duplicate or a RESEND gets the same answer."""
        self.metrics.errors.labels(code.name).inc()
        self.metrics.requests.labels("error").inc()
        self.emit(r, r.signer.error(code, msg, self._seq(r), r.run_id) if started
                  else r.signer.error(code, msg))
        self.in_flight.close(r, cacheable=ERROR_INFO[code].cacheable)
        if self.publisher is not None:
            self.publisher.publish("failed", **ids(r), code=code.name, message=msg)

