"""Sampling on the device, the twin of gpu/ops/sampling.py: greedy, temperature, top-k,
top-p, one block per logit row, so only a 4-byte token id per row leaves the GPU instead of
a vocabulary-sized row of logits (196 KB for SmolLM2; at batch 16 that copy alone would
cost about as much as a decode step's arithmetic).

No sort. The kept set is the first N candidates in (probability descending, token id
ascending) order, the reference's order; it is found by a radix select on an order-preserving
integer key of z = logit / temperature, four 8-bit digits, each digit one pass over the row
with a 256-bin histogram of (count, probability mass) in shared memory:

    top-k  descend until the running count reaches k             -> threshold key, ties taken
    top-p  descend until the running mass reaches top_p * (mass of the top-k set)

Candidates equal to the threshold are kept lowest id first, as many as the cut needs. The
draw is the inverse CDF in ascending token id over the kept candidates (the CPU twin draws in
the same order), computed with per-thread contiguous chunks and a block scan. Greedy
(temperature <= 0 or top_k == 1) is one argmax pass, first index on ties like numpy.

Per-row parameters come in one float32 array [rows, 4]: temperature, top_k, top_p, u (u
uniform in [0, 1), drawn on the host from the request's seeded generator).

Float32 throughout: kept sets and draws agree with the float64 reference except where a cut
or a draw falls within float32 rounding of a boundary.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from numba import float32, int32, int64

from ..model_api import Draw
from . import token_mask as _tm
from ._cuda_shim import SIM, DeviceArray, StreamArg, block_best, cuda, device, float_bits, kernel

# A power of two (tree reductions). One block per row, so at batch 1 the block's threads are
# all the parallelism a 49,152-wide row gets: 1024 (the most a block has; 48 registers a
# thread, so it fits the register file: tests/test_cuda_ptx.py) reads 48 logits a thread a pass.
THREADS = 32 if SIM else 1024
MAX_THREADS = 1024
NBINS = 256
NO_LIMIT = float32(3.0e38)     # a mass target that is never reached
NONE = 2147483647


@device
def _key(z):
    """z's float32 order as an integer in [0, 2**32): negatives have their magnitude bits
    flipped, then the sign bit is moved to the bottom of the range."""
    b = int64(float_bits(z))
    if b < 0:
        b = b ^ 0x7FFFFFFF
    return b + 2147483648


@device
def _argmax(x, V, fbuf, ibuf, tid, nt):
    """(max, first index of the max) of x[:V], to every thread of the block."""
    best, arg = x[0], int32(0)
    for i in range(tid, V, nt):
        if x[i] > best:
            best, arg = x[i], int32(i)
    return block_best(best, arg, fbuf, ibuf, tid, nt)


@device
def _scan(v, buf, zero, tid, nt):
    """(exclusive prefix, block total) of v over the threads (Hillis-Steele in shared memory)."""
    buf[tid] = v
    cuda.syncthreads()
    off = 1
    while off < nt:
        t = buf[tid - off] if tid >= off else zero
        cuda.syncthreads()
        buf[tid] += t
        cuda.syncthreads()
        off *= 2
    incl, total = buf[tid], buf[nt - 1]
    cuda.syncthreads()
    return incl - v, total


@device
def _select(x, V, t, zmax, kcap, target, hc, hm, ctl, ctf, tid, nt):
    """Radix descent: the threshold key tau of the kept set, and how many candidates equal to
    tau it keeps (j), where the set is the shortest prefix of the (z descending, id ascending)
    order holding kcap candidates or `target` probability mass. Returns (tau, j, kept mass)."""
    prefix = int64(0)
    above_n = int64(0)
    above_m = float32(0.0)
    n_tie = int64(0)
    m_tie = float32(0.0)
    for level in range(4):
        shift = 24 - 8 * level
        for b in range(tid, NBINS, nt):
            hc[b] = 0
            hm[b] = float32(0.0)
        cuda.syncthreads()
        # Runs of one digit are summed in registers and added to the histogram when the digit
        # changes: at the first levels nearly every logit has the same digit (the float's sign
        # and exponent), and an atomic per element would all hit one shared-memory address.
        run_d, run_n, run_m = int64(-1), int32(0), float32(0.0)
        for i in range(tid, V, nt):
            z = x[i] / t
            k = _key(z)
            if (k >> (shift + 8)) == (prefix >> (shift + 8)):
                d = (k >> shift) & 255
                if d != run_d:
                    if run_n > 0:
                        cuda.atomic.add(hc, run_d, run_n)
                        cuda.atomic.add(hm, run_d, run_m)
                    run_d, run_n, run_m = d, int32(0), float32(0.0)
                run_n += 1
                run_m += math.exp(z - zmax)
        if run_n > 0:
            cuda.atomic.add(hc, run_d, run_n)
            cuda.atomic.add(hm, run_d, run_m)
        cuda.syncthreads()
        if tid == 0:
            chosen = -1
            last = -1
            for d in range(NBINS - 1, -1, -1):
                c = hc[d]
                if c == 0:
                    continue
                last = d
                if above_n + c >= kcap or above_m + hm[d] >= target:
                    chosen = d
                    break
                above_n += c
                above_m += hm[d]
            if chosen < 0:  # rounding: all that is left falls short of the target; take it all
                chosen = last
                above_n -= hc[last]
                above_m -= hm[last]
            ctl[0] = prefix | (int64(chosen) << shift)
            ctl[1] = above_n
            ctl[2] = hc[chosen]
            ctf[0] = above_m
            ctf[1] = hm[chosen]
        cuda.syncthreads()
        prefix, above_n, n_tie = ctl[0], ctl[1], ctl[2]
        above_m, m_tie = ctf[0], ctf[1]
        cuda.syncthreads()
    # every candidate in the last bin has the same z, hence the same mass
    p_tie = m_tie / float32(n_tie)
    j = min(kcap - above_n, n_tie)
    if target < NO_LIMIT and p_tie > float32(0.0):
        need = (target - above_m) / p_tie
        if need < float32(j):
            j = max(int64(1), int64(math.ceil(need)))
    return prefix, j, above_m + float32(j) * p_tie


@kernel(["void(float32[:, ::1], float32[:, ::1], int32[::1], float32[:, ::1], int64[::1])"])
def _sample_rows(logits, params, out, probs, pre):
    """out[r]: a token drawn from row r of logits under params[r] = (temperature, top_k,
    top_p, u). probs, when it has a row per logit row, receives the kept distribution. pre,
    when it has a row per logit row, holds each row's argmax key (step_kernel.argmax_key):
    a greedy row then takes it and never reads its logits."""
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    x = logits[row]
    V = x.shape[0]
    write_probs = probs.shape[0] == logits.shape[0]
    fbuf = cuda.shared.array(MAX_THREADS, float32)
    ibuf = cuda.shared.array(MAX_THREADS, int32)
    hc = cuda.shared.array(NBINS, int32)
    hm = cuda.shared.array(NBINS, float32)
    ctl = cuda.shared.array(4, int64)
    ctf = cuda.shared.array(2, float32)
    pick = cuda.shared.array(2, int32)
    t, top_k, top_p, u = params[row, 0], int64(params[row, 1]), params[row, 2], params[row, 3]
    if (t <= float32(0.0) or top_k == 1) and pre.shape[0] == logits.shape[0] and not write_probs:
        if tid == 0:  # the whole block returns together: no barrier is left waiting
            out[row] = int32(4294967295 - (pre[row] & 4294967295))
        return

    xmax, amax = _argmax(x, V, fbuf, ibuf, tid, nt)
    if t <= float32(0.0) or top_k == 1:
        if tid == 0:
            out[row] = amax
        if write_probs:
            for i in range(tid, V, nt):
                probs[row, i] = float32(1.0) if i == amax else float32(0.0)
        return
    zmax = xmax / t
    kcap = top_k if 0 < top_k < V else int64(V)

    # tau: candidates with a key above it are kept; of those equal to it, the first j
    tau, j = int64(-1), int64(0)
    if kcap < V:
        tau, j, kept = _select(x, V, t, zmax, kcap, NO_LIMIT, hc, hm, ctl, ctf, tid, nt)
    else:
        s = float32(0.0)
        for i in range(tid, V, nt):
            s += math.exp(x[i] / t - zmax)
        kept = _scan(s, fbuf, float32(0.0), tid, nt)[1]
    if top_p < float32(1.0):
        tau, j, kept = _select(x, V, t, zmax, kcap, top_p * kept, hc, hm, ctl, ctf, tid, nt)

    # inverse CDF in ascending token id: thread tid owns ids [lo, hi)
    chunk = (V + nt - 1) // nt
    lo = min(V, tid * chunk)
    hi = min(V, lo + chunk)
    ties = int32(0)
    for i in range(lo, hi):
        if _key(x[i] / t) == tau:
            ties += 1
    rank0 = _scan(ties, ibuf, int32(0), tid, nt)[0]
    rank = rank0
    mass = float32(0.0)
    last = int32(-1)
    for i in range(lo, hi):
        z = x[i] / t
        k = _key(z)
        if k > tau or (k == tau and rank < j):
            mass += math.exp(z - zmax)
            last = int32(i)
        if k == tau:
            rank += 1
    base, total = _scan(mass, fbuf, float32(0.0), tid, nt)
    if tid == 0:
        pick[0] = NONE
        pick[1] = -1
    cuda.syncthreads()
    cuda.atomic.max(pick, 1, last)
    goal = u * total
    if base <= goal < base + mass:
        rank = rank0
        c = base
        for i in range(lo, hi):
            z = x[i] / t
            k = _key(z)
            if k > tau or (k == tau and rank < j):
                c += math.exp(z - zmax)
                if c > goal:
                    cuda.atomic.min(pick, 0, int32(i))
                    break
            if k == tau:
                rank += 1
    cuda.syncthreads()
    if tid == 0:
        out[row] = pick[0] if pick[0] != NONE else pick[1]  # u * total at or past the end: the last
    if write_probs:
        rank = rank0
        for i in range(lo, hi):
            z = x[i] / t
            k = _key(z)
            keep = k > tau or (k == tau and rank < j)
            probs[row, i] = math.exp(z - zmax) / total if keep else float32(0.0)
            if k == tau:
                rank += 1


def sample_rows(logits: DeviceArray, params: DeviceArray, out: DeviceArray,
                probs: DeviceArray | None = None, pre: DeviceArray | None = None,
                stream: StreamArg = 0,
                mask: tuple[DeviceArray, DeviceArray] | None = None) -> None:
    """out[r] = a token id drawn from logits[r] (device arrays) under params[r] =
    (temperature, top_k, top_p, u). probs: optional [rows, vocab] output of the kept
    distribution (tests and checks; the product passes none). pre: optional argmax keys
    [rows] from the fused step kernel, taken by greedy rows (not with a mask: a masked row's
    argmax is the sampler's to find). mask: optional (rows int32 [m], words uint32 [m, W]),
    the constrained rows' allowed tokens (token_mask.py), applied to logits in place first."""
    if logits.shape[0] == 0:  # a launch of 0 blocks is an error
        return
    if mask is not None:
        _tm.mask_rows(logits, mask[0], mask[1], stream=stream)
        pre = None
    if probs is None:
        probs = _no_probs(logits.shape[1])
    if pre is None:
        pre = _kept("no keys", np.zeros(0, np.int64))
    _sample_rows[logits.shape[0], THREADS, stream](logits, params, out, probs, pre)


# Constant device arrays, made once and kept: a temporary freed while its kernel still runs
# could be handed out again at once by CuPy's pool (cupy_memory.py).
_constants: dict[str | tuple[str, int], DeviceArray] = {}


def _kept(key: str | tuple[str, int],
          host: npt.NDArray[np.int64] | npt.NDArray[np.float32]) -> DeviceArray:
    a = _constants.get(key)
    if a is None:
        a = _constants[key] = host if SIM else cuda.to_device(host)
    return a


def _no_probs(V: int) -> DeviceArray:
    return _kept(("no probs", V), np.zeros((0, V), np.float32))


def argmax_rows(logits: DeviceArray, out: DeviceArray, stream: StreamArg = 0) -> None:
    """Greedy on every row: out[r] = argmax(logits[r]) (first index on ties, like numpy)."""
    rows = logits.shape[0]
    sample_rows(logits, _kept(("greedy", rows), np.zeros((rows, 4), np.float32)), out, stream=stream)


def pack_params(draws: Sequence[Draw]) -> npt.NDArray[np.float32]:
    """[(temperature, top_k, top_p, u), ...] -> the kernel's float32 [rows, 4]. u is kept
    below 1 after rounding to float32."""
    p = np.asarray(draws, np.float32).reshape(-1, 4)
    np.minimum(p[:, 3], np.float32(1.0) - np.float32(2.0 ** -24), out=p[:, 3])
    return p
