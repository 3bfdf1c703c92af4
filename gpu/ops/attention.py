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

Work items are (token, kv_head, split): the heads of one GQA group share each K/V load, and a
sequence's blocks are split across threads (flash-decoding) when there are too few tokens to
keep every thread busy, as in a batch-1 decode step. Each split keeps an online softmax
(running max, sum, unnormalised output); the splits are merged at the end.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .exp_f32 import exp_f32
from .half import as_f32, to_storage

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


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def attention(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd,
              splits, out):
    """out[t, h*hd:(h+1)*hd] = softmax(q_h k^T / sqrt(hd)) v over positions 0..tok_pos[t]."""
    T = qkv.shape[0]
    G = n_head // n_kv
    BT = BLOCK_TOKENS
    scale = np.float32(1.0 / math.sqrt(hd))
    part_o = np.empty((T, n_head, splits, hd), np.float32)
    part_m = np.empty((T, n_head, splits), np.float32)
    part_l = np.empty((T, n_head, splits), np.float32)
    for it in prange(T * n_kv * splits):
        sp = it % splits
        kvh = (it // splits) % n_kv
        t = it // (splits * n_kv)
        n = tok_pos[t] + 1
        nblk = (n + BT - 1) // BT
        b0 = sp * nblk // splits
        b1 = (sp + 1) * nblk // splits
        bt = block_tables[tok_seq[t]]
        q = np.empty((G, hd), np.float32)
        for g in range(G):
            for i in range(hd):
                q[g, i] = qkv[t, (kvh * G + g) * hd + i] * scale
        sc = np.empty(BT, np.float32)
        o = np.zeros((G, hd), np.float32)
        mx = np.full(G, _NEG, np.float32)
        lsum = np.zeros(G, np.float32)
        for bi in range(b0, b1):
            kT = k_pool[bt[bi], layer, kvh]
            v = v_pool[bt[bi], layer, kvh]
            ns = min(BT, n - bi * BT)
            for g in range(G):
                sc[:] = 0
                for i in range(hd):
                    qi = q[g, i]
                    kr = kT[i]
                    for s in range(BT):
                        sc[s] += qi * as_f32(kr[s])
                bm = _NEG
                for s in range(ns):
                    bm = max(bm, sc[s])
                newm = max(mx[g], bm)
                corr = exp_f32(mx[g] - newm)
                og = o[g]
                for i in range(hd):
                    og[i] *= corr
                ls = lsum[g] * corr
                # the exps in a loop of their own, which vectorises (exp_f32), then the
                # weighted sum of the values
                for s in range(ns):
                    p = exp_f32(sc[s] - newm)
                    sc[s] = p
                    ls += p
                for s in range(ns):
                    p = sc[s]
                    vr = v[s]
                    for i in range(hd):
                        og[i] += p * as_f32(vr[i])
                lsum[g] = ls
                mx[g] = newm
        for g in range(G):
            h = kvh * G + g
            part_m[t, h, sp] = mx[g]
            part_l[t, h, sp] = lsum[g]
            for i in range(hd):
                part_o[t, h, sp, i] = o[g, i]
    for th in prange(T * n_head):
        t = th // n_head
        h = th % n_head
        m = _NEG
        for sp in range(splits):
            m = max(m, part_m[t, h, sp])
        tot = np.float32(0.0)
        for i in range(hd):
            out[t, h * hd + i] = 0
        for sp in range(splits):
            w = exp_f32(part_m[t, h, sp] - m)
            tot += part_l[t, h, sp] * w
            for i in range(hd):
                out[t, h * hd + i] += part_o[t, h, sp, i] * w
        inv = np.float32(1.0) / tot
        for i in range(hd):
            out[t, h * hd + i] *= inv


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_head: int, n_kv: int) -> np.ndarray:
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
