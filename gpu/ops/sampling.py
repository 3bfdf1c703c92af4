"""Sampling: greedy, temperature, top-k, top-p (nucleus), driven by an explicit uniform draw.

The random number is an argument, not drawn here, so a seeded generator upstream makes a
run reproducible and a test can check the exact inverse-CDF choice against the reference.
Top-p looks at the largest candidates first (argpartition) and only sorts the whole
vocabulary when they don't already hold top_p of the mass: exact, and cheap in the common
case.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

_FIRST_CANDIDATES = 256


def filtered_distribution(logits: npt.ArrayLike, temperature: float, top_k: int, top_p: float,
                          ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """Candidate ids and their renormalised probabilities after temperature, top-k, top-p.

    With top_p < 1 the ids come in descending probability (the nucleus is a prefix);
    otherwise in pool order, which is all the inverse-CDF draw needs.
    """
    z = np.asarray(logits, np.float64) / temperature
    V = z.shape[0]
    pool = np.argpartition(-z, top_k - 1)[:top_k] if 0 < top_k < V else np.arange(V)
    zp = z[pool]
    w = np.exp(zp - zp.max())
    total = w.sum()
    if top_p >= 1.0:
        return pool, w / total
    n = min(len(pool), _FIRST_CANDIDATES)
    while True:
        idx = np.argpartition(-zp, n - 1)[:n] if n < len(pool) else np.arange(len(pool))
        idx = idx[np.argsort(-zp[idx], kind="stable")]
        c = np.cumsum(w[idx]) / total
        if c[-1] >= top_p or n == len(pool):
            cut = min(int(np.searchsorted(c, top_p)) + 1, n)  # smallest prefix with mass >= top_p
            kept = w[idx[:cut]]
            return pool[idx[:cut]], kept / kept.sum()
        n = len(pool)  # the first candidates don't reach top_p: look at all of them


def sample(logits: npt.NDArray[np.float32], temperature: float, top_k: int, top_p: float,
           u: float) -> int:
    """One token id. temperature <= 0 is greedy (u unused); u is uniform in [0, 1).

    The draw is the inverse CDF over the kept candidates in ascending token id, the order the
    device sampler (gpu/cuda/sampling.py) can follow without a sort: the same seed picks the
    same token on either backend, short of float32 rounding at a boundary."""
    if temperature <= 0.0 or top_k == 1:
        return int(np.argmax(logits))
    ids, p = filtered_distribution(logits, temperature, top_k, top_p)
    if len(ids) < len(logits):  # a kept subset comes in pool or probability order
        order = np.argsort(ids)
        ids, p = ids[order], p[order]
    i = int(np.searchsorted(np.cumsum(p), u, side="right"))
    return int(ids[min(i, len(ids) - 1)])


def sample_probs_ref(logits: npt.ArrayLike, temperature: float, top_k: int,
                     top_p: float) -> npt.NDArray[np.float64]:
    """float64 reference: the full distribution the sampler draws from (zeros where filtered)."""
    z = np.asarray(logits, np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    p = np.exp(z[order] - z[order[0]])
    if 0 < top_k < len(p):
        p[top_k:] = 0.0
    p /= p.sum()
    if top_p < 1.0:
        c = np.cumsum(p)
        cut = int(np.searchsorted(c, top_p)) + 1
        p[cut:] = 0.0
        p /= p.sum()
    out = np.zeros_like(p)
    out[order] = p
    return out
