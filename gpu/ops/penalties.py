"""Sampling penalties on a logit row, before the sampler (greedy included), as vLLM applies
them:

* repetition (vLLM's ``repetition_penalty``, llama.cpp's ``repeat_penalty``): every token id
  that occurs in the prompt or in the output so far has its logit divided by the penalty when
  it is positive and multiplied by it when it is negative (1: off);
* presence and frequency (OpenAI's): every token id in the output so far has its logit
  lowered by ``presence``, and by ``frequency`` times the number of times it occurred (0: off).

``PenaltyState`` follows one request (the distinct ids of its prompt, taken once, and the
counts of its output ids, one ``push`` per token); ``spec()`` is what the next step needs.
``apply`` is the CPU op; gpu/cuda/penalties.py is its device twin (the same arithmetic in
float32, tested against this).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple, SupportsInt

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from zerolayer.protocol.sampling_params import SamplingParams


class Penalty(NamedTuple):
    """One logit row's penalties: the factors and the token ids they apply to."""
    repetition: float
    presence: float
    frequency: float
    seen: npt.NDArray[np.int32]          # the distinct ids in the prompt and the output (repetition)
    out_ids: npt.NDArray[np.int32]       # the distinct ids in the output
    out_counts: npt.NDArray[np.float32]  # how often each of out_ids occurred


def apply(row: npt.NDArray[np.float32], p: Penalty) -> None:
    """Penalise one float32 logit row in place."""
    if p.repetition != 1.0 and p.seen.size:
        z = row[p.seen]
        row[p.seen] = np.where(z > 0, z / np.float32(p.repetition), z * np.float32(p.repetition))
    if p.out_ids.size and (p.presence != 0.0 or p.frequency != 0.0):
        row[p.out_ids] -= np.float32(p.presence) + np.float32(p.frequency) * p.out_counts


def apply_ref(row: npt.ArrayLike, prompt_ids: Iterable[SupportsInt],
              output_ids: Iterable[SupportsInt], repetition: float, presence: float,
              frequency: float) -> npt.NDArray[np.float64]:
    """float64 reference from the definitions (tests): a penalised copy of row."""
    z = np.asarray(row, np.float64).copy()
    for t in set(int(i) for i in prompt_ids) | set(int(i) for i in output_ids):
        z[t] = z[t] / repetition if z[t] > 0 else z[t] * repetition
    out = list(int(i) for i in output_ids)
    for t in set(out):
        z[t] -= presence + frequency * out.count(t)
    return z


class PenaltyState:
    """The penalties of one request as its output grows. inactive (spec() is None) when the
    request asks for none."""

    def __init__(self, repetition: float, presence: float, frequency: float,
                 prompt_ids: npt.ArrayLike):
        self.factors = (float(repetition), float(presence), float(frequency))
        self.active = self.factors != (1.0, 0.0, 0.0)
        self.counts: dict[int, int] = {}
        if self.active:
            self.prompt = np.unique(np.asarray(prompt_ids, np.int64)).astype(np.int32)
            self._in_prompt = set(self.prompt.tolist())
            self._new: list[int] = []  # output ids not in the prompt, in order of first use

    @classmethod
    def of(cls, params: SamplingParams, prompt_ids: npt.ArrayLike) -> PenaltyState:
        """From a SamplingParams."""
        return cls(params.repetition_penalty, params.presence_penalty, params.frequency_penalty,
                   prompt_ids)

    def push(self, tok: int) -> None:
        """One more output token."""
        if not self.active:
            return
        n = self.counts.get(tok, 0)
        if n == 0 and tok not in self._in_prompt:
            self._new.append(tok)
        self.counts[tok] = n + 1

    def spec(self) -> Penalty | None:
        if not self.active:
            return None
        rep, pres, freq = self.factors
        seen = (np.concatenate([self.prompt, np.asarray(self._new, np.int32)])
                if rep != 1.0 else np.zeros(0, np.int32))
        out_ids = np.fromiter(self.counts.keys(), np.int32, len(self.counts))
        out_counts = np.fromiter(self.counts.values(), np.float32, len(self.counts))
        return Penalty(rep, pres, freq, seen, out_ids, out_counts)
