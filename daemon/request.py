"""The one record of a request, created at admission, and the typed events about it.

A request is admitted on the I/O thread (verified, fresh, not a duplicate) and becomes one
`Request`. The same object crosses to the engine thread (through the admissions hand-off)
and back (inside every `EngineEvent`); nobody converts it into another shape. Its fields are
grouped by the thread that writes them:

  * set at admission, then read-only: identity, where and how to answer, what was asked;
  * the I/O thread's: the client's address, the next frame's sequence number, `closed`;
  * the engine thread's: prompt ids, KV sequence, sampled tokens, timings (its decoding
    state proper, detokenizer, stop checker, generator, penalties, the engine keeps to
    itself: engine.Decoding);
  * `cancel`: written once by the I/O thread, read by the engine at its next step boundary.

A plain attribute store is atomic under the GIL, so the one field both threads touch needs
no lock: the I/O thread sets `cancel` (a CancelReason), the engine reads it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.sampling_params import SamplingParams
from zerolayer.protocol.wire import FinishReason, InvokeBody, ResponseSigner, Timings, Usage

from .result_cache import CacheKey

if TYPE_CHECKING:
    from zerolayer.gpu.draft_model import DraftSeq
    from zerolayer.gpu.drafting import DraftLength
    from zerolayer.gpu.grammar import Matcher
    from zerolayer.gpu.kv_cache import Sequence

    from .carriers import Address


# A request's prompt_ids before it is tokenized (a tokenized prompt is never empty).
_NOT_TOKENIZED: npt.NDArray[np.int32] = np.zeros(0, np.int32)
_NOT_TOKENIZED.flags.writeable = False


class CancelReason(Enum):
    CLIENT = "client"      # CANCEL: the stream ends with DONE(cancelled)
    LEASE = "lease expired: no keepalive from the client"   # ERROR(CANCELLED)
    DRAIN = "drain timeout: the daemon is stopping"         # ERROR(CANCELLED)


@dataclass(eq=False)
class Request:
    # -- set at admission (I/O thread), read-only afterwards
    key: CacheKey
    params: SamplingParams
    body: InvokeBody | None = None        # prompt / messages / token ids, as received;
                                          # dropped once tokenized (only the ids are needed)
    signer: ResponseSigner | None = None
    run_id: int = 0
    received_at: float = field(default_factory=time.monotonic)  # first datagram
    ingress_us: int = 0                   # first datagram → the last of its body
    body_bytes: int = 0                   # the body's footprint while queued (memory_bounds.py)
    # -- the I/O thread's
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
    # -- both: written once by the I/O thread, read by the engine
    cancel: CancelReason | None = None
    # -- the engine thread's
    prompt_ids: npt.NDArray[np.int32] = field(default_factory=lambda: _NOT_TOKENIZED)
    tokenize_us: int = 0
    seq: Sequence | None = None
    prefilled: int = 0
    cached: int = 0                       # prompt positions reused from the prefix cache
    tokens: list[int] = field(default_factory=list)
    pending_row: int = -1                 # its token's row in the step in flight (overlap)
    pending_step: int = 0                 # ... and that step's number
    kv_step: int = 0                      # the last step that wrote its KV (prefix entries)
    lp_held: list[tuple[bytes, ...]] = field(default_factory=list)  # logprob entries of
                                          # tokens whose text is not out yet (logprobs.py)
    matcher: Matcher | None = None        # its constraint's state (structured output)
    spec: DraftLength | None = None       # speculative decoding's draft length (None: plain)
    draft: npt.NDArray[np.int32] | None = None  # the tokens guessed in the step in flight
    draft_seq: DraftSeq | None = None     # its sequence in the draft model's KV (if one)
    t_admit: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    step_max: float = 0.0                 # slowest gap between two tokens (jitter)
    done: bool = False

    @classmethod
    def for_ids(cls, key: CacheKey, ids: npt.ArrayLike, params: SamplingParams) -> Request:
        """A request whose prompt is already token ids (the engine's own tests and tools)."""
        r = cls(key, params)
        r.prompt_ids = np.asarray(ids, np.int32)
        return r


@dataclass(slots=True)
class AcceptedEvent:
    """The engine took the request into its queue (tokenized, within the context, room for
    it): from here on it is a model run, whatever becomes of it. Before this, the engine
    may still refuse it as a request that never started (FailedEvent, started=False)."""
    req: Request
    prompt_tokens: int
    tokenize_us: int


@dataclass(slots=True)
class TextEvent:
    """Text to send; with logprobs asked, the encoded entries of the tokens it completes
    (protocol/logprobs.py), which travel in the same frames as that text. `cached`: the
    prompt positions the engine reused from its prefix cache, for the I/O side's usage."""
    req: Request
    text: str
    n_tokens: int
    logprobs: tuple[tuple[bytes, ...], ...] = ()
    cached: int = 0


@dataclass(slots=True)
class DoneEvent:
    req: Request
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
    req: Request
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
