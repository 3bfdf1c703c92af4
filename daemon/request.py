"""A request on each side of the thread boundary, and the typed events about it.

A request is admitted on the I/O thread (verified, fresh, not a duplicate). From then on it is
three things, each written by one thread:

  * `Admitted`: what was asked, frozen at admission: identity, sampling parameters, when it
    arrived. The engine is handed this and nothing else of the I/O side's, with the body in
    the same `Submission` (the engine thread drops the body once it is tokenized).
  * `Request`: the I/O thread's record: the client's address, the signer, the run id, what
    was framed so far, and what the engine's events reported. The engine never sees it.
  * the engine's run record (engine.Run): prompt ids, KV sequence, sampled tokens, timings.
    The I/O thread never sees it; what it needs arrives as events.

Events name their request by its `Admitted`; the I/O side finds its record from that
(in_flight.InFlight.record). The one thing both threads touch is the `CancelFlag` inside
`Admitted`: written once by the I/O thread, read by the engine at its next step boundary. A
plain attribute store is atomic under the GIL, so it needs no lock.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.sampling_params import SamplingParams
from zerolayer.protocol.wire import FinishReason, InvokeBody, ResponseSigner, Timings, Usage

from .result_cache import CacheKey

if TYPE_CHECKING:
    from .carriers import Address


class CancelReason(Enum):
    CLIENT = "client"      # CANCEL: the stream ends with DONE(cancelled)
    LEASE = "lease expired: no keepalive from the client"   # ERROR(CANCELLED)
    DRAIN = "drain timeout: the daemon is stopping"         # ERROR(CANCELLED)


class CancelFlag:
    """Set once by the I/O thread; the engine reads `reason` at its step boundaries."""
    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: CancelReason | None = None


@dataclass(frozen=True, eq=False, slots=True)
class Admitted:
    """A request as admitted: what the engine is given. Identity compares (eq=False): two
    runs under one key (a retry after an uncacheable end) are two objects."""
    key: CacheKey
    params: SamplingParams
    received_at: float = field(default_factory=time.monotonic)  # its first datagram
    ingress_us: int = 0     # first datagram -> the last of its body
    body_bytes: int = 0     # the body's footprint while queued (memory_bounds.py)
    cancel: CancelFlag = field(default_factory=CancelFlag)


@dataclass(slots=True)
class Submission:
    """What crosses the admissions hand-off: the admitted request and its body (prompt,
    messages or token ids, as received), which only the engine thread reads."""
    admitted: Admitted
    body: InvokeBody


@dataclass(eq=False)
class Request:
    """The I/O thread's record of a request in flight."""
    admitted: Admitted
    signer: ResponseSigner
    run_id: int = 0
    addr: Address | None = None           # where frames go, its carrier's (the client may move)
    closed: bool = False                  # its last frame (DONE/ERROR) was emitted
    sent_tokens: int = 0                  # tokens whose text was framed (usage on CANCEL)
    # what the engine's events reported (a CANCEL's usage and timings): the prompt's size,
    # its positions reused from the prefix cache, its tokenizing time
    reported_prompt: int = 0
    reported_cached: int = 0
    reported_tokenize_us: int = 0
    t_text: float = 0.0                   # when its last text was framed (token gaps)
    engine: int = 0                       # the engine it was handed to ([[engines]])

    @property
    def key(self) -> CacheKey:
        return self.admitted.key

    @property
    def received_at(self) -> float:
        return self.admitted.received_at

    def cancel(self, why: CancelReason) -> None:
        """Tell the engine to stop it (at its next step boundary)."""
        self.admitted.cancel.reason = why


@dataclass(slots=True)
class AcceptedEvent:
    """The engine took the request into its queue (tokenized, within the context, room for
    it): from here on it is a model run, whatever becomes of it. Before this, the engine
    may still refuse it as a request that never started (FailedEvent, started=False)."""
    req: Admitted
    prompt_tokens: int
    tokenize_us: int


@dataclass(slots=True)
class TextEvent:
    """Text to send; with logprobs asked, the encoded entries of the tokens it completes
    (protocol/logprobs.py), which travel in the same frames as that text. `cached`: the
    prompt positions the engine reused from its prefix cache, for the I/O side's usage."""
    req: Admitted
    text: str
    n_tokens: int
    logprobs: tuple[tuple[bytes, ...], ...] = ()
    cached: int = 0


@dataclass(slots=True)
class DoneEvent:
    req: Admitted
    reason: FinishReason
    usage: Usage
    timings: Timings
    drafted: int = 0   # speculative decoding: tokens guessed for it, and kept
    accepted: int = 0
    stop_index: int = 0  # DONE's stop_index: k when the k-th stop string ended it, else 0


@dataclass(slots=True)
class FailedEvent:
    """started=False: the engine refused the request before accepting it (a text prompt
    over the context, an id outside the vocabulary): it never started, and its ERROR is
    framed as such (docs/PROTOCOL.md §5.3), though its ACK (queued) has gone out."""
    req: Admitted
    code: ErrorCode
    message: str
    started: bool = True
    detail: str = ""  # for the daemon's log only (the grammar engine's own message)


@dataclass(slots=True)
class EngineDied:
    """The engine thread ended with an exception outside any one request: the I/O thread
    fails every request in flight with INTERNAL and the daemon exits non-zero."""
    message: str


EngineEvent = AcceptedEvent | TextEvent | DoneEvent | FailedEvent | EngineDied
