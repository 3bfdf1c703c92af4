"""Draft tokens for speculative decoding, from the request's own text (n-gram prompt lookup).

Decode at batch 1 waits on the weights' bytes: a forward pass over k+1 positions of one
sequence reads them once, so checking k guessed tokens costs little more than making one.
Where the answer copies its context (extraction, quotation, a list repeated with edits,
code), the tokens that followed the last n tokens the previous time they appeared are a
good guess for what follows now. That is prompt lookup decoding (vLLM's "ngram" method,
llama.cpp's lookup decoding): no second model, no extra weights, a search over the
request's prompt and output.

The guess never changes the answer: the engine samples each verified position from the
model's own distribution, exactly as without drafts, and keeps the drafts only as far as
they match (engine.py). The drafter decides only how much work is risked per step.

`DraftLength` adapts that risk to what the request has accepted so far: the draft grows
while whole drafts are accepted and shrinks to what was accepted otherwise, so a request
whose text copies nothing stops paying for rejected guesses after one or two steps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from zerolayer.protocol.sampling_params import SamplingParams

MAX_DRAFT = 8     # tokens guessed per step at most: past ~8 a CPU step's cost grows with k
MAX_PAUSE = 32    # plain steps after a run of wholly rejected drafts, at most
MIN_NGRAM = 2     # a 1-token match is mostly chance in free text (", the", "\n")
MAX_NGRAM = 4


def speculates(params: SamplingParams) -> bool:
    """Whether a request drafts. Penalties, a grammar mask and logprobs are functions of
    the tokens before each position, which a checked draft would have to replay per row;
    those requests decode one token a step (the same answer, without the speed-up)."""
    return (params.speculative and not params.penalized and params.constraint is None
            and not params.logprobs)


def lookup(context: npt.NDArray[np.int32], k: int, min_n: int = MIN_NGRAM,
           max_n: int = MAX_NGRAM) -> npt.NDArray[np.int32]:
    """Up to k tokens that followed the most recent earlier occurrence of the context's last
    n tokens (the longest n in max_n..min_n that occurs); empty when none does."""
    L = len(context)
    if k <= 0:
        return context[:0]
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        tail = context[L - n:]
        # windows starting at 0..L-n-1 (not the tail itself), compared column by column
        hits = np.ones(L - n, bool)
        for j in range(n):
            hits &= context[j:L - n + j] == tail[j]
        starts = np.flatnonzero(hits)
        if starts.size:
            s = int(starts[-1]) + n  # the most recent occurrence: its continuation
            return context[s:s + k]
    return context[:0]


@dataclass
class DraftLength:
    """A request's draft length: doubled after a fully accepted draft, else what was
    accepted plus one. A draft with nothing accepted also pauses drafting for a few steps,
    twice as many each time in a row (at most MAX_PAUSE), so text that copies nothing
    costs next to nothing."""
    k: int = 4
    drafted: int = 0
    accepted: int = 0
    _misses: int = 0
    _pause: int = 0

    def want(self) -> int:
        """Tokens to draft this step (0: decode plainly)."""
        if self._pause:
            self._pause -= 1
            return 0
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        if not drafted:
            return
        self.drafted += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.k, self._misses = min(MAX_DRAFT, 2 * self.k), 0
        else:
            self.k = max(1, accepted + 1)
            if accepted == 0:
                self._misses += 1
                self._pause = min(MAX_PAUSE, 1 << self._misses)
            else:
                self._misses = 0
