"""Logprobs next to the sampler, on the CPU: the sampled token's and the top N of a row.

Which distribution: the log-softmax of the logits the sampler was given, penalties applied,
before temperature, top-k and top-p. That is what vLLM returns by default ("raw" logprobs)
and what OpenAI's field means to its users: how likely the model found each token, not how
the request's truncation happened to reshape it. A token the truncation could never have
picked still gets its true logprob, and a greedy request gets real numbers, not 0 and -inf.

Computed in float64 over the float32 row (one exp per vocabulary entry, only for the rows
that asked), so the values are those of a float64 softmax of the same logits to within the
float32 of the wire. The top N are ordered by logit descending, lower id first on ties, the
sampler's own order; a tie at the N-th place keeps the lowest ids.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt


class RowLogprobs(NamedTuple):
    """One logit row's answer: the sampled token's logprob and the top N, best first."""
    logprob: float
    top_ids: npt.NDArray[np.int32]           # [N]
    top_logprobs: npt.NDArray[np.float64]    # [N]


def top_ids(z: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.int32]:
    """The n largest entries' ids in (value descending, id ascending) order, exactly: all
    above the n-th value, then as many of the ties at it as fit, lowest id first."""
    if n <= 0:
        return np.zeros(0, np.int32)
    n = min(n, z.shape[0])
    kth = np.partition(z, z.shape[0] - n)[z.shape[0] - n]
    above = np.flatnonzero(z > kth)
    ties = np.flatnonzero(z == kth)[:n - len(above)]
    cand = np.concatenate([above, ties])
    return cand[np.lexsort((cand, -z[cand]))].astype(np.int32)


def row_logprobs(logits: npt.ArrayLike, token: int, n: int) -> RowLogprobs:
    """logits: one row as the sampler saw it (penalised); token: the id it drew."""
    z = np.asarray(logits, np.float64)
    m = z.max()
    lse = m + np.log(np.exp(z - m).sum())
    ids = top_ids(z, n)
    return RowLogprobs(float(z[token] - lse), ids, z[ids] - lse)
