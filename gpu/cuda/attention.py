"""Causal GQA attention over the paged KV arena on the GPU, and the KV write before it;
twins of gpu/ops/attention.py, over the same layout (gpu/kv_cache.py):

    k_pool[block, layer, kv_head, dim, pos]   keys transposed
    v_pool[block, layer, kv_head, pos, dim]   BLOCK_TOKENS positions per block

One thread block per (token, kv_head, split), BLOCK_TOKENS threads. For each KV block of
its split: thread s scores position s against the G query heads of the GQA group (for a
fixed dim, the threads read consecutive keys: coalesced); the online-softmax state of each
head (running max, sum) is updated in shared memory; then thread i accumulates output dim i
over the block's positions (consecutive values: coalesced). Splits (flash-decoding) give a
batch-1 decode step enough thread blocks; a second kernel merges their partial softmaxes.
"""
from __future__ import annotations

import math

import numpy as np
from numba import float32

from ..ops.attention import BLOCK_TOKENS
from ._cuda_shim import DeviceArray, StreamArg, cuda, grid_1d, kernel

MAX_G = 8        # query heads per KV head (GQA group) a thread block holds
MAX_HD = 256     # head_dim
NEG = np.float32(-1e30)  # a finite "minus infinity", as in the CPU twin
BT = BLOCK_TOKENS

_I32 = "int32[::1]"
_POOLS = "float32[:, :, :, :, ::1], float32[:, :, :, :, ::1]"


@kernel([f"void(float32[:, ::1], {_POOLS}, int64, {_I32}, {_I32}, int32[:, ::1], int64, int64, int64)"])
def _kv_write(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd):
    k0 = n_head * hd
    v0 = k0 + n_kv * hd
    per_tok = n_kv * hd
    n = qkv.shape[0] * per_tok
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        t = e // per_tok
        r = e % per_tok
        kvh = r // hd
        i = r % hd
        p = tok_pos[t]
        blk = block_tables[tok_seq[t], p // BT]
        off = p % BT
        k_pool[blk, layer, kvh, i, off] = qkv[t, k0 + r]
        v_pool[blk, layer, kvh, off, i] = qkv[t, v0 + r]


@kernel([f"void(float32[:, ::1], {_POOLS}, int64, {_I32}, {_I32}, int32[:, ::1], int64, int64, "
         "int64, float32, float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1])"])
def _attn_split(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd,
                scale, part_o, part_m, part_l):
    splits = cuda.gridDim.y
    sp = cuda.blockIdx.y
    t = cuda.blockIdx.x // n_kv
    kvh = cuda.blockIdx.x % n_kv
    tid = cuda.threadIdx.x
    G = n_head // n_kv
    q_s = cuda.shared.array((MAX_G, MAX_HD), float32)
    o_s = cuda.shared.array((MAX_G, MAX_HD), float32)
    p_s = cuda.shared.array((MAX_G, BT), float32)
    m_s = cuda.shared.array(MAX_G, float32)
    l_s = cuda.shared.array(MAX_G, float32)
    c_s = cuda.shared.array(MAX_G, float32)
    sc = cuda.local.array(MAX_G, float32)
    for e in range(tid, G * hd, BT):
        g = e // hd
        i = e % hd
        q_s[g, i] = qkv[t, (kvh * G + g) * hd + i] * scale
        o_s[g, i] = float32(0.0)
    if tid < G:
        m_s[tid] = NEG
        l_s[tid] = float32(0.0)
    n = tok_pos[t] + 1
    nblk = (n + BT - 1) // BT
    b0 = sp * nblk // splits
    b1 = (sp + 1) * nblk // splits
    seq = tok_seq[t]
    cuda.syncthreads()
    for bi in range(b0, b1):
        blk = block_tables[seq, bi]
        ns = min(BT, n - bi * BT)
        # scores: thread tid = position tid of this block, all G heads (positions not yet
        # written, past the end of the last block, are never read)
        for g in range(G):
            sc[g] = NEG
        if tid < ns:
            for g in range(G):
                sc[g] = float32(0.0)
            for i in range(hd):
                kv = k_pool[blk, layer, kvh, i, tid]
                for g in range(G):
                    sc[g] += q_s[g, i] * kv
        for g in range(G):
            p_s[g, tid] = sc[g]
        cuda.syncthreads()
        # new running max per head, and the factor that rescales what was accumulated
        if tid < G:
            bm = NEG
            for s in range(ns):
                bm = max(bm, p_s[tid, s])
            newm = max(m_s[tid], bm)
            c_s[tid] = math.exp(m_s[tid] - newm)
            m_s[tid] = newm
        cuda.syncthreads()
        for g in range(G):
            p_s[g, tid] = math.exp(p_s[g, tid] - m_s[g]) if tid < ns else float32(0.0)
        cuda.syncthreads()
        if tid < G:
            ls = float32(0.0)
            for s in range(ns):
                ls += p_s[tid, s]
            l_s[tid] = l_s[tid] * c_s[tid] + ls
        # output: thread tid owns dims tid, tid + BT, ... of every head
        for i in range(tid, hd, BT):
            for g in range(G):
                sc[g] = o_s[g, i] * c_s[g]
            for s in range(ns):
                vv = v_pool[blk, layer, kvh, s, i]
                for g in range(G):
                    sc[g] += p_s[g, s] * vv
            for g in range(G):
                o_s[g, i] = sc[g]
        cuda.syncthreads()
    for e in range(tid, G * hd, BT):
        g = e // hd
        i = e % hd
        part_o[t, kvh * G + g, sp, i] = o_s[g, i]
    if tid < G:
        part_m[t, kvh * G + tid, sp] = m_s[tid]
        part_l[t, kvh * G + tid, sp] = l_s[tid]


@kernel(["void(float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], float32[:, ::1])"])
def _attn_merge(part_o, part_m, part_l, out):
    t = cuda.blockIdx.x
    h = cuda.blockIdx.y
    splits = part_m.shape[2]
    hd = part_o.shape[3]
    m = NEG
    for sp in range(splits):
        m = max(m, part_m[t, h, sp])
    tot = float32(0.0)
    for sp in range(splits):
        tot += part_l[t, h, sp] * math.exp(part_m[t, h, sp] - m)
    inv = float32(1.0) / tot
    for i in range(cuda.threadIdx.x, hd, cuda.blockDim.x):
        acc = float32(0.0)
        for sp in range(splits):
            acc += part_o[t, h, sp, i] * math.exp(part_m[t, h, sp] - m)
        out[t, h * hd + i] = acc * inv


def kv_write(qkv: DeviceArray, k_pool: DeviceArray, v_pool: DeviceArray, layer: int,
             tok_seq: DeviceArray, tok_pos: DeviceArray, block_tables: DeviceArray, n_head: int,
             n_kv: int, hd: int, threads: int = 256, stream: StreamArg = 0) -> None:
    n = qkv.shape[0] * n_kv * hd
    if n:
        blocks, threads = grid_1d(n, threads)
        _kv_write[blocks, threads, stream](
            qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd)


def attention(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd,
              splits, out, part=None, stream=0):
    """out[t, h*hd:(h+1)*hd] = softmax(q_h k^T / sqrt(hd)) v over positions 0..tok_pos[t].

    part: optional preallocated (part_o [T, n_head, splits, hd], part_m, part_l [T, n_head,
    splits]) device scratch; allocated here when not given.
    """
    T = qkv.shape[0]
    G = n_head // n_kv
    if G > MAX_G or hd > MAX_HD or n_head % n_kv:
        raise ValueError(f"attention kernel supports GQA groups <= {MAX_G}, head_dim <= {MAX_HD}")
    if not T:
        return
    if part is None:
        part = (cuda.device_array((T, n_head, splits, hd), np.float32),
                cuda.device_array((T, n_head, splits), np.float32),
                cuda.device_array((T, n_head, splits), np.float32))
    part_o, part_m, part_l = part
    scale = float32(1.0 / math.sqrt(hd))
    _attn_split[(T * n_kv, splits), BT, stream](
        qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd, scale,
        part_o, part_m, part_l)
    _attn_merge[(T, n_head), min(hd, 128), stream](part_o, part_m, part_l, out)
