"""Causal GQA attention over a paged KV cache, and the KV write that precedes it.

KV layout (see gpu/kv_cache.py), per block of BLOCK_TOKENS positions:
    k_pool[block, layer, kv_head, dim, pos]   keys stored transposed
    v_pool[block, layer, kv_head, pos, dim]
Keys are transposed so that scoring a block is, for each dim, one long multiply-add across
BLOCK_TOKENS positions (vectorised, no horizontal reduction); values are row-major so that
the weighted sum is, for each position, one multiply-add across head_dim.
The pools are float16 (uint16 bits, gpu/ops/half.py) in the CPU model, as llama.cpp's default
cache type: at depth 1000 a decode step reads the whole cache once per layer, and in float32
that was a third of the step's memory traffic. The same code runs on float32 pools (the CUDA
kernels' twin tests): ``as_f32`` / ``to_storage`` compile to nothing there.

Head dims that are a multiple of 64 run each block through gpu/ops/attention_block.py's
register-blocked kernels (scores and the weighted sum of values with their accumulators in
registers; with the scratch hoisting below, depth-1000 decode attention went 6.1 -> 2.4 ms a
token against these loops, whose accumulators round-trip memory at every multiply-add); other
head dims take the plain loops below.

Work items are (token, kv_head, split): the heads of one GQA group share each K/V load, and a
sequence's blocks are split across threads (flash-decoding) when there are too few tokens to
keep every thread busy, as in a batch-1 decode step. Each split keeps an online softmax
(running max, sum, unnormalised output); the splits are merged at the end.

A block's K (or V) for one layer and KV head is 8 KiB (f16, head dim 64), and the next block
of the sequence lies anywhere in the pool, so the hardware prefetchers, which stop at a 4 KiB
page, start over twice a block. Each block prefetches the next one's K and V while it is
scored. Decode attention at depth 1000, bench_kernels' per-kernel table, two interleaved runs
each (Xeon host, 2 threads): bundled 135M 1.80 / 1.76 -> 1.31 / 1.33 ms a token, synthetic
1.1B (8 query heads a KV head: more arithmetic per byte) 2.83 / 2.72 -> 2.40 / 2.45 ms.
"""
from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit, prange

from .attention_block import DIMS, GMAX, block_pv, block_scores
from .exp_f32 import exp_f32
from .half import as_f32, to_storage
from .prefetch import prefetch

BLOCK_TOKENS = 64
_NEG = np.float32(-1e30)  # a finite "minus infinity": fastmath assumes no infs


@njit(cache=True, nogil=True)
def kv_write(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd):
    """Store the (already rotated) K and V of every token at its position."""
    k0 = n_head * hd
    v0 = k0 + n_kv * hd
    for t in range(qkv.shape[0]):
        p = tok_pos[t]
        blk = block_tables[tok_seq[t], p // BLOCK_TOKENS]
        off = p % BLOCK_TOKENS
        for kvh in range(n_kv):
            for i in range(hd):
                k_pool[blk, layer, kvh, i, off] = to_storage(qkv[t, k0 + kvh * hd + i], k_pool)
                v_pool[blk, layer, kvh, off, i] = to_storage(qkv[t, v0 + kvh * hd + i], v_pool)


@njit(fastmath=True, cache=True, nogil=True)
def _softmax_update(sc, ns, m, lsum, o):
    """The online softmax's step for one head and block: sc[:ns] (scores) becomes
    exp(sc - new max); o (the unnormalised output) is rescaled to the new max. Returns the new
    (max, sum)."""
    bm = _NEG
    for s in range(ns):
        bm = max(bm, sc[s])
    newm = max(m, bm)
    corr = exp_f32(m - newm)
    for i in range(o.shape[0]):
        o[i] *= corr
    ls = lsum * corr
    for s in range(ns):
        p = exp_f32(sc[s] - newm)
        sc[s] = p
        ls += p
    return newm, ls


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def attention(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd,
              splits, out):
    """out[t, h*hd:(h+1)*hd] = softmax(q_h k^T / sqrt(hd)) v over positions 0..tok_pos[t]."""
    T = qkv.shape[0]
    G = n_head // n_kv
    BT = BLOCK_TOKENS
    L = k_pool.shape[1]
    GM = GMAX
    blocked = hd % DIMS == 0
    scale = np.float32(1.0 / math.sqrt(hd))
    n_items = T * n_kv * splits
    # every work item's scratch in one allocation each (per-item np.empty calls were most of
    # a shallow item's time); item it = (t, kvh, sp) owns part_*[it]: its G heads' running
    # max, sum and unnormalised output, heads adjacent for block_pv. np.empty, initialised by
    # each item: in a parallel function np.zeros / np.full are parallel loops of their own,
    # three more thread launches per call (at 50 positions, batch 1: 9.2 -> ~4 us a call)
    part_o = np.empty((n_items, G, hd), np.float32)
    part_m = np.empty((n_items, G), np.float32)
    part_l = np.empty((n_items, G), np.float32)
    q_all = np.empty((n_items, G, hd), np.float32)
    sc_all = np.empty((n_items, G, BT), np.float32)  # one block's scores, then probabilities
    for it in prange(n_items):
        sp = it % splits
        kvh = (it // splits) % n_kv
        t = it // (splits * n_kv)
        n = tok_pos[t] + 1
        nblk = (n + BT - 1) // BT
        b0 = sp * nblk // splits
        b1 = (sp + 1) * nblk // splits
        bt = block_tables[tok_seq[t]]
        q = q_all[it]
        for g in range(G):
            for i in range(hd):
                q[g, i] = qkv[t, (kvh * G + g) * hd + i] * scale
        sc = sc_all[it]
        o = part_o[it]
        mx = part_m[it]
        lsum = part_l[it]
        for g in range(G):
            mx[g] = _NEG
            lsum[g] = 0
            for i in range(hd):
                o[g, i] = 0
        for bi in range(b0, b1):
            ns = min(BT, n - bi * BT)
            if bi + 1 < b1:  # the next block's K and V (see the module doc)
                nbase = ((bt[bi + 1] * L + layer) * n_kv + kvh) * hd * BT
                for off in range(0, hd * BT, 64 // k_pool.itemsize):
                    prefetch(k_pool, nbase + off)
                    prefetch(v_pool, nbase + off)
            base = ((bt[bi] * L + layer) * n_kv + kvh) * hd * BT  # the block's K and V
            if blocked:  # register-blocked (gpu/ops/attention_block.py), GM heads at a time
                for g0 in range(0, G, GM):
                    block_scores(min(GM, G - g0), hd, k_pool, base, q, g0 * hd, sc, g0 * BT)
            else:
                kT = k_pool[bt[bi], layer, kvh]
                for g in range(G):
                    sc[g, :] = 0
                    for i in range(hd):
                        qi = q[g, i]
                        kr = kT[i]
                        for s in range(BT):
                            sc[g, s] += qi * as_f32(kr[s])
            for g in range(G):
                mx[g], lsum[g] = _softmax_update(sc[g], ns, mx[g], lsum[g], o[g])
            if blocked:
                for g0 in range(0, G, GM):
                    for d0 in range(0, hd, DIMS):
                        block_pv(min(GM, G - g0), ns, v_pool, base + d0, hd, sc, g0 * BT,
                                 o, g0 * hd + d0)
            else:
                v = v_pool[bt[bi], layer, kvh]
                for g in range(G):
                    og = o[g]
                    for s in range(ns):
                        p = sc[g, s]
                        vr = v[s]
                        for i in range(hd):
                            og[i] += p * as_f32(vr[i])
        if splits == 1:  # the item holds its heads' whole softmax: normalise it here
            for g in range(G):
                inv = np.float32(1.0) / lsum[g]
                h = kvh * G + g
                for i in range(hd):
                    out[t, h * hd + i] = o[g, i] * inv
    if splits == 1:
        return
    for th in prange(T * n_head):  # merge each head's splits
        t = th // n_head
        h = th % n_head
        kvh = h // G
        g = h % G
        i0 = (t * n_kv + kvh) * splits
        m = _NEG
        for sp in range(splits):
            m = max(m, part_m[i0 + sp, g])
        tot = np.float32(0.0)
        for i in range(hd):
            out[t, h * hd + i] = 0
        for sp in range(splits):
            w = exp_f32(part_m[i0 + sp, g] - m)
            tot += part_l[i0 + sp, g] * w
            for i in range(hd):
                out[t, h * hd + i] += part_o[i0 + sp, g, i] * w
        inv = np.float32(1.0) / tot
        for i in range(hd):
            out[t, h * hd + i] *= inv


_RefArray = npt.NDArray[np.float32] | npt.NDArray[np.float64]  # attention_ref takes either


def attention_ref(q: _RefArray, k: _RefArray, v: _RefArray, n_head: int,
                  n_kv: int) -> npt.NDArray[np.float64]:
    """float64 causal attention for one sequence whose T queries are its last T positions.

    q [T, n_head*hd], k and v [S, n_kv*hd] for all S positions (S >= T).
    """
    T, S = q.shape[0], k.shape[0]
    hd = q.shape[1] // n_head
    q = np.asarray(q, np.float64).reshape(T, n_head, hd)
    k = np.asarray(k, np.float64).reshape(S, n_kv, hd)
    v = np.asarray(v, np.float64).reshape(S, n_kv, hd)
    rep = n_head // n_kv
    k = np.repeat(k, rep, axis=1)
    v = np.repeat(v, rep, axis=1)
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
    qpos = np.arange(S - T, S)[:, None]
    s = np.where(np.arange(S)[None, :] <= qpos, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", s, v).reshape(T, n_head * hd)
