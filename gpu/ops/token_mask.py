"""A token mask applied to one logit row before sampling (constrained decoding, gpu/grammar.py).

The mask is one bit per token id in little-endian uint32 words (bit b of word w is token
32w + b). A disallowed token's logit becomes -inf, so every sampler downstream (greedy's
argmax, temperature, top-k, top-p, the inverse-CDF draw) sees the allowed tokens alone and
their renormalised distribution: the constraint changes which tokens can be drawn, never the
relative odds of those it allows. Only a constrained row comes here, so a batch's other
rows cost nothing.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt


def allowed(words: npt.NDArray[np.uint32], vocab: int) -> npt.NDArray[np.bool_]:
    """The mask as one bool per token id [vocab]."""
    bits = np.unpackbits(np.ascontiguousarray(words, np.uint32).view(np.uint8),
                         bitorder="little")
    return bits[:vocab].astype(np.bool_)


def apply(row: npt.NDArray[np.float32], words: npt.NDArray[np.uint32]) -> None:
    """The disallowed tokens of the logit row to -inf, in place (after the penalties, before
    the sampler and the logprobs: the distribution a constrained request draws from is the
    one its logprobs describe, as in vLLM)."""
    row[~allowed(words, row.shape[0])] = -np.inf


def masked(row: npt.NDArray[np.float32], words: npt.NDArray[np.uint32]) -> npt.NDArray[np.float32]:
    """apply() on a copy."""
    out = row.copy()
    apply(out, words)
    return out
