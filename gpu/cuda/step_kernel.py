"""A whole forward step (embedding, every layer, the LM head and the greedy argmax) as ONE
persistent kernel: the device half of gpu/model.py's ``forward`` with no launch per op.

Why: at SmolLM2-135M's size a decode step moves ~115 MB of weights, ~25 us of HBM time on an
H200, while the per-op path (forward.py) is ~395 kernel nodes whose launch gaps and
latency-bound small grids cost milliseconds. Here one launch runs a fixed sequence of
*stages*. Where a stage reads what the whole stage before it wrote, every block waits at a
grid barrier (grid_sync.py), which is what a kernel boundary provided before; where it reads
a part, it waits on ready counters for that part only (step_geometry.barrier_after):

    stage 0            x = embed(tokens); argmax slots and ready counters cleared
    per layer, 5:      A  rmsnorm + [Q|K|V] matmul + bias + RoPE; K, V into the KV arena; Q kept
                       B  attention per (token, KV head, split); the last split merges
                       C  O-proj + residual:             x += att @ Wo^T
                       D  rmsnorm + [gate|up] + SwiGLU:  h = silu(xn Wg^T) * (xn Wu^T)
                       E  down + residual:               x += h @ Wd^T
    last stage         logits = rmsnorm(x[rows]) @ Wout^T, and each row's argmax

Barriers come after C and E (their readers normalise whole rows of x) and after B (the O
projection reads every head). After A, an attention item waits for the count of its KV
head's Q|K|V row groups of its token tile; after D, a down-projection item waits for the
gate|up groups of its K slice of h, and the one that adds into x waits first for every
gate|up item of the tile, since those read x. The counters are per (layer, token tile), so
no stage's counter is reused within a step. Before each grid barrier every thread warms L2
with what it loads first in its block's first item of the matmul stage after it
(``prefetch_first_item``): weights do not depend on activations, so their DRAM round trip
overlaps the wait.

A stage is a list of work items taken grid-stride by the blocks: for the matmul stages a
*row group* (16 output rows, four row quads of one gpu/quant.py LANES group) times a slice of
K times a tile of TT tokens; for attention a (token, KV head, split). K is split just enough
for step_geometry.matmul_items_per_sm items per block (``k_splits_for``, at most k_splits):
at batch 1 a 576-row projection is 36 row groups, a 6th of an H100's 132 multiprocessors,
and 8 slices of K make it 288 items. Each slice's sums go to scratch and the item of the row
group that arrives last (an atomic count) adds them in slice order and finishes the rows
(norm, bias, RoPE, SwiGLU, residual), so the result does not depend on block order. The
fusions need no extra pass:
  * RMSNorm is folded into the dot products: rmsnorm(x) W^T = inv * ((x * w_norm) W^T), and
    the sum of squares that gives inv is accumulated from the same x loads (every element of
    a row passes exactly one K-thread of each row quad);
  * RoPE pairs are adjacent rows of one row group, so a group rotates its own results;
  * the SwiGLU item computes its gate group and the matching up group (n_ff % 64 == 0);
  * residual adds write only the item's own rows;
  * flash-decoding splits merge in the block that finishes a (token, head) last (an atomic
    count per pair), in split order, so the result does not depend on which block that is;
  * the greedy argmax is one 64-bit atomic max per (row group, logit row) of an
    order-preserving key with the negated index in the low bits (the first index on ties,
    as numpy); the sampler reads it for greedy rows instead of scanning the vocabulary.

Thread layout of a matmul item (256 threads): thread (kp = tid // 4, quad = tid % 4) owns
rows 4*quad .. 4*quad + 3 of the item and bytes j4 .. j4 + 3 of every (KPOS / JQ)-th block
of its K slice (JQ = bytes a block / 4; j4 = 4 * (kp % JQ), the first block kp // JQ): the
weights are read as 32-bit words, 4 rows' bytes each, laid out ``qs32[layer, g64, b, lq, j]``
(weight_layout.py; lq the row quad within the 64-row group), so a thread's four
words are one 16-byte load and a warp's 512 bytes are whole runs: its item's 4 quads of a
block lie side by side (the rest of the block is the 3 sibling items', read in the same
stage). Each (block, row)'s scale and offset (d, m) are read as float16 where every one of
the model's is a float16 value (the file's own, for Q4_0, Q4_1, Q8_0:
step_geometry.scale_type), so a Q4_1 weight costs the kernel the file's 20 bytes a block,
not 24; as float32 otherwise (the K-quants). Partial sums meet in shared memory, in a fixed order.
TT (tokens per item) is a compile-time constant: 1 for a step of one token, 4 otherwise.

Under the simulator the same kernel runs one stage per launch (grid_sync.py); the launch
count (``_cuda_shim.LAUNCHES``) still counts one launch per step, the launch the device makes.

References: float64 and CPU twins of every stage are the per-op kernels' (gpu/ops/*), and
tests/test_cuda_sim.py checks this kernel against the CPU model step by step.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numba import float32, int32, int64, uint32, uint64

from ..ops.attention import BLOCK_TOKENS
from ..quant import FMT_F32, FMT_Q4, LANES
from ._cuda_shim import (
    cuda,
    device,
    float_bits,
    kernel,
    load16,
    prefetch_l2,
    shfl_xor,
    thread_index,
    warp_max,
    warp_sum,
)
from .grid_sync import count_ready, grid_sync, wait_at_least
from .step_geometry import KERNEL, k_splits_for

if TYPE_CHECKING:
    from ..gguf_loader import ModelConfig

if (LANES % KERNEL.rows_per_item or KERNEL.rows_per_item % 4 or KERNEL.rows_per_item > 32
        or KERNEL.threads % KERNEL.rows_per_item):
    raise ImportError("step_kernel's items are whole row quads of one quant row group")

# The cut of the work (step_geometry.KERNEL, which step_plan.py predicts from): one source.
THREADS = KERNEL.threads
ROWS = KERNEL.rows_per_item  # rows per matmul work item: row quads of one quant row group
QUADS = ROWS // 4     # row quads of an item, one 32-bit word (4 rows' bytes) each
KPOS = THREADS // QUADS  # K positions an item's threads take at a time
SUBS = LANES // ROWS  # items per quant row group
QW = LANES // 4       # 32-bit words of one (block, byte) of a quant row group
RED8 = 8              # first-round partial sums of an item's reduction (KPOS // RED8 terms each)
K_SPLITS = KERNEL.k_splits
BARRIER_AFTER = KERNEL.barrier_after  # a grid barrier after which stages of a layer
# the argmax keys meet over the ROWS lanes of one token (a warp holds 32 // ROWS tokens)
KEY_SHUFFLES = tuple(o for o in (16, 8, 4, 2, 1) if o < ROWS)
STAGES_PER_LAYER = KERNEL.stages_per_layer
HEAD = STAGES_PER_LAYER  # the LM head's stage kind
MAX_G = 8             # query heads per KV head
MAX_HD = 128          # head_dim
BT = BLOCK_TOKENS     # 64 positions per KV block: one score per thread quarter
NEG = np.float32(-1e30)
NO_KEY = np.int64(-(2 ** 63))  # below every argmax key
TOKEN_TILES = (1, 4)
# The matmul and attention loops' indices, never negative, are cast to this before indexing: Numba wraps
# a negative signed index as Python does, which keeps every indexed array's shape in
# registers through the loop and adds a compare and select to each load's address.
U = uint64


def stage_count(n_layer: int) -> int:
    return 2 + STAGES_PER_LAYER * n_layer


def supports(cfg: ModelConfig, fmts: Sequence[int] | None) -> str | None:
    """Why this kernel can't run a model, or None when it can."""
    if cfg.n_ff % LANES:  # the up rows start a quant row group
        return f"n_ff {cfg.n_ff} is not a multiple of {LANES}"
    if cfg.head_dim > MAX_HD or cfg.head_dim % ROWS:  # a row group within one head
        return f"head_dim {cfg.head_dim} (at most {MAX_HD}, a multiple of {ROWS})"
    if cfg.n_head % cfg.n_kv or cfg.n_head // cfg.n_kv > MAX_G:
        return f"GQA group {cfg.n_head}/{cfg.n_kv} (at most {MAX_G})"
    return None


def _make(TT):
    ACC = 4 * TT  # accumulators per thread: 4 rows x TT tokens (a constant for local arrays)
    REDC = (ROWS + 1) * TT  # reduction columns: ROWS x TT sums, then TT sums of squares

    @device
    def dot_item(fmt, qs, d, m, w, dims, layer, g, kb0, kb1, src, rows, use_rows, t0, T, norms,
                 nrow, use_norm, red, red8, res, ssr):
        """res[r, tt] = sum_k W[g*ROWS + r, k] * xw[t0 + tt, k] over the K blocks [kb0, kb1)
        (32 elements a block), xw = src * norms[nrow] if use_norm; ssr[tt] = sum_k src[t0 + tt, k]^2
        over the same k. Every thread of the block calls it."""
        tid = thread_index()  # what it derives from tid lives for this call only
        kp = tid >> 2         # K position of the thread (KPOS of them)
        quad = tid & 3        # row quad of the item: rows 4*quad .. 4*quad + 3
        g64 = g // SUBS       # the quant row group holding the item's rows
        lq = (g % SUBS) * QUADS + quad  # the thread's word in that group's (block, byte) row
        nb = dims[1]
        trow = cuda.local.array(TT, int32)  # src row of each token of the tile
        for tt in range(TT):
            t = min(t0 + tt, T - 1)  # past the end: the last token again, never stored
            trow[tt] = rows[t] if use_rows else t
        acc = cuda.local.array(ACC, float32)
        ss = cuda.local.array(TT, float32)
        xa = cuda.local.array(TT, float32)
        xb = cuda.local.array(TT, float32)
        for i in range(4 * TT):
            acc[i] = float32(0.0)
        for tt in range(TT):
            ss[tt] = float32(0.0)
        if fmt == FMT_F32:
            R = dims[3]
            K = dims[4]
            wrow = layer * R
            for k in range(kb0 * 32 + kp, min(kb1 * 32, K), KPOS):
                sc = norms[U(nrow), U(k)] if use_norm else float32(1.0)
                for tt in range(TT):
                    v = src[U(trow[tt]), U(k)]
                    ss[tt] += v * v
                    xa[tt] = v * sc
                for q in range(4):
                    wv = w[U((wrow + min(g * ROWS + 4 * quad + q, R - 1)) * K + k)]
                    for tt in range(TT):
                        acc[q * TT + tt] += wv * xa[tt]
        else:
            # Q4: a (block, byte) position holds elements j and j + 16 of 4 rows; the byte
            # formats: element j alone. A thread takes bytes j4 .. j4 + 3 of its row quad in
            # one 16-byte load (weight_layout.py lays them side by side), so JQ
            # threads cover a block and KPOS // JQ blocks are read at a time.
            BS = dims[2]
            JQ = BS >> 2                # 4-byte groups a block (BS: 16 or 32)
            j4 = (kp % JQ) * 4          # BS divides KPOS * 4: the thread's bytes are fixed
            step = KPOS // JQ           # and it takes every step-th block of the slice
            gb = (layer * dims[0] + g64) * nb  # the group's first block
            b = kb0 + kp // JQ
            while b < kb1:      # not range(): its trip count is a 64-bit division
                words = load16(qs, U(((gb + b) * QW + lq) * BS + j4))
                for u in range(4):
                    word = words[u]
                    j = j4 + u
                    if fmt == FMT_Q4:
                        e = b * 32 + j
                        sa = norms[U(nrow), U(e)] if use_norm else float32(1.0)
                        sb = norms[U(nrow), U(e + 16)] if use_norm else float32(1.0)
                        for tt in range(TT):
                            va = src[U(trow[tt]), U(e)]
                            vb = src[U(trow[tt]), U(e + 16)]
                            ss[tt] += va * va + vb * vb
                            xa[tt] = va * sa
                            xb[tt] = vb * sb
                        for q in range(4):
                            byte = (word >> uint32(8 * q)) & uint32(255)
                            lo = float32(int32(byte & uint32(15)))
                            hi = float32(int32(byte >> uint32(4)))
                            dq = float32(d[U((gb + b) * LANES + 4 * lq + q)])
                            mq = float32(m[U((gb + b) * LANES + 4 * lq + q)])
                            for tt in range(TT):
                                acc[q * TT + tt] += (dq * (lo * xa[tt] + hi * xb[tt])
                                                     + mq * (xa[tt] + xb[tt]))
                    else:
                        e = b * BS + j
                        sa = norms[U(nrow), U(e)] if use_norm else float32(1.0)
                        for tt in range(TT):
                            va = src[U(trow[tt]), U(e)]
                            ss[tt] += va * va
                            xa[tt] = va * sa
                        for q in range(4):
                            qv = float32(int32((word >> uint32(8 * q)) & uint32(255)))
                            dq = float32(d[U((gb + b) * LANES + 4 * lq + q)])
                            mq = float32(m[U((gb + b) * LANES + 4 * lq + q)])
                            for tt in range(TT):
                                acc[q * TT + tt] += (dq * qv + mq) * xa[tt]
                b += step
        # the KPOS positions' partial sums meet in shared memory in a fixed order (the result
        # is the same whichever block runs the item), in two rounds of RED8 terms: column
        # r * TT + tt for row r, ROWS * TT + tt for the sum of squares (each element passed
        # one thread of quad 0)
        for q in range(4):
            for tt in range(TT):
                red[kp, (4 * quad + q) * TT + tt] = acc[q * TT + tt]
        if quad == 0:
            for tt in range(TT):
                red[kp, ROWS * TT + tt] = ss[tt]
        cuda.syncthreads()
        for e in range(tid, RED8 * REDC, THREADS):
            p = e // REDC
            c = e % REDC
            v = float32(0.0)
            for i in range(KPOS // RED8):
                v += red[p * (KPOS // RED8) + i, c]
            red8[p, c] = v
        cuda.syncthreads()
        if tid < REDC:
            v = float32(0.0)
            for p in range(RED8):
                v += red8[p, tid]
            if tid < ROWS * TT:
                res[tid // TT, tid % TT] = v
            else:
                ssr[tid - ROWS * TT] = v
        cuda.syncthreads()

    @device
    def prefetch_first_item(fmt, qs, d, m, dims, layer, R, Tn, bid, split_target):
        """Warm L2 with what this thread loads first in the block's first item of the matmul
        stage over R rows that comes next (its 16 bytes, and its rows' scales and offsets):
        called before a grid barrier, so that the item's loads after it hit L2. Weights do
        not depend on activations."""
        if fmt == FMT_F32:
            return
        ng = (R + ROWS - 1) // ROWS
        nb = dims[1]
        S = k_splits_dev(ng * ((Tn + TT - 1) // TT), nb, split_target, K_SPLITS)
        if bid >= ng * ((Tn + TT - 1) // TT) * S:
            return
        g = bid % ng
        sk = (bid // ng) % S
        kb0 = sk * nb // S
        tid = thread_index()
        kp = tid >> 2
        lq = (g % SUBS) * QUADS + (tid & 3)
        JQ = dims[2] >> 2
        b = kb0 + kp // JQ
        if b < (sk + 1) * nb // S:
            gb = (layer * dims[0] + g // SUBS) * nb
            prefetch_l2(qs, U(((gb + b) * QW + lq) * dims[2] + (kp % JQ) * 4))
            if kp % JQ == 0:
                prefetch_l2(d, U((gb + b) * LANES + 4 * lq))
                prefetch_l2(m, U((gb + b) * LANES + 4 * lq))

    @device
    def inv_rms(ss, D, eps):
        return float32(1.0) / math.sqrt(ss / float32(D) + eps)

    @device
    def argmax_key(v, r):
        """v's float order in the high 32 bits, the negated row in the low: the max of the
        keys (signed) is the largest v, the lowest row first among equals."""
        b = float_bits(v)
        if b < 0:
            b = b ^ 0x7FFFFFFF  # negative floats: larger magnitude, smaller key
        return (int64(b) << 32) | int64(4294967295 - r)

    @kernel([signature(sc) for sc in SCALE_TYPES], name=f"step_kernel.step_tt{TT}")
    def step(qq, qd, qm, qw, fq, oq, od, om, ow, fo, gq, gd, gm, gw, fg, dq_, dd, dm, dw, fd,
             eq, ed, em, ew, fe, lq, ld, lm, lw, fl, wdim,
             norms, qkv_bias, has_bias, cos, sin, k_pool, v_pool,
             tok, tok_seq, tok_pos, logit_rows, tables,
             x, qbuf, att, h, logits, part_o, part_m, part_l, cnt, best, pmm, mcnt, rdy, bar,
             n_head, n_kv, hd, n_ff, eps, scale, splits, split_target, stage_lo, stage_hi):
        tid = thread_index()
        bid = cuda.blockIdx.x
        nblocks = cuda.gridDim.x
        T = tok.shape[0]
        D = x.shape[1]
        n_out = logit_rows.shape[0]
        # Values derived from the arguments are kept in shared memory and read again at the
        # top of every stage: derived once and held in registers, every stage's would stay
        # live through every other stage (a load after a barrier cannot be hoisted).
        # (cst[5:13]: the matmul item a block is on, its layer, rows and split, see there)
        cst = cuda.shared.array(13, int64)
        if tid == 0:
            cst[0] = (norms.shape[0] - 1) // 2  # L: every layer's attention norm, FFN norm, output
            cst[1] = n_head // n_kv  # G
            cst[2] = (T + TT - 1) // TT  # token tiles
            cst[3] = n_ff // ROWS  # gate groups
            cst[4] = n_kv + n_ff // ROWS + 1  # ready counters of a (layer, token tile)
        cuda.syncthreads()
        red = cuda.shared.array((KPOS, REDC), float32)
        red8 = cuda.shared.array((RED8, REDC), float32)
        res = cuda.shared.array((ROWS, TT), float32)
        res2 = cuda.shared.array((ROWS, TT), float32)
        ssr = cuda.shared.array(TT, float32)
        q_s = cuda.shared.array((MAX_G, MAX_HD), float32)
        o_s = cuda.shared.array((MAX_G, MAX_HD), float32)
        ps4 = cuda.shared.array((4, MAX_G, BT), float32)
        p_s = cuda.shared.array((MAX_G, BT), float32)
        m_s = cuda.shared.array(MAX_G, float32)
        l_s = cuda.shared.array(MAX_G, float32)
        c_s = cuda.shared.array(MAX_G, float32)
        flag = cuda.shared.array(1, int32)
        sc = cuda.local.array(MAX_G, float32)
        for st in range(stage_lo, stage_hi):
            tid = thread_index()
            L = cst[0]
            G = cst[1]
            # ready counters of a (layer, token tile): stage A's row groups done per KV head,
            # stage D's per gate group, and D's in all (see the stage loop)
            n_tiles = cst[2]
            ngd = cst[3]
            rdy_per = cst[4]
            q_w = n_head * hd
            kv_w = n_kv * hd
            last = stage_count_dev(L)
            if st == 0:  # ---------------------------------------------------- embedding
                for e in range(bid * THREADS + tid, T * D, nblocks * THREADS):
                    t = e // D
                    k = e % D
                    r = tok[t]
                    if fe == FMT_F32:
                        x[t, k] = ew[r * wdim[4, 4] + k]
                    else:
                        gb = (r // LANES) * wdim[4, 1]
                        l = r % LANES
                        bs = wdim[4, 2]
                        b = k // 32 if fe == FMT_Q4 else k // bs
                        jb = k % 32 if fe == FMT_Q4 else k % bs
                        word = eq[((gb + b) * QW + l // 4) * bs + jb % bs]
                        byte = (word >> uint32(8 * (l % 4))) & uint32(255)
                        if fe == FMT_Q4:
                            nib = byte >> uint32(4) if jb >= 16 else byte & uint32(15)
                            qv = float32(int32(nib))
                        else:
                            qv = float32(int32(byte))
                        x[t, k] = (qv * float32(ed[(gb + b) * LANES + l])
                                   + float32(em[(gb + b) * LANES + l]))
                n_rdy = L * n_tiles * rdy_per
                for i in range(bid * THREADS + tid, max(n_out, n_rdy), nblocks * THREADS):
                    if i < n_out:
                        best[i] = NO_KEY
                    if i < n_rdy:
                        rdy[i] = 0
            else:
                layer = (st - 1) // STAGES_PER_LAYER
                kind = (st - 1) % STAGES_PER_LAYER
                if st == last - 1:
                    layer, kind = 0, HEAD
                if kind == 1:  # ------------------------------------------- B: attention
                    for it in range(bid, T * n_kv * splits, nblocks):
                        sp = it % splits
                        t = (it // splits) // n_kv
                        kvh = (it // splits) % n_kv
                        # its KV head's Q, K and V row groups of stage A written
                        ia = (layer * n_tiles + t // TT) * rdy_per + kvh
                        wait_at_least(rdy, ia, ia + 1, (G + 2) * hd // ROWS, bar, tid)
                        for e in range(tid, G * hd, THREADS):
                            q_s[e // hd, e % hd] = qbuf[U(t), U((kvh * G + e // hd) * hd + e % hd)] * scale
                            o_s[e // hd, e % hd] = float32(0.0)
                        if tid < G:
                            m_s[tid] = NEG
                            l_s[tid] = float32(0.0)
                        n = tok_pos[t] + 1
                        nblk = (n + BT - 1) // BT
                        b0 = sp * nblk // splits
                        b1 = (sp + 1) * nblk // splits
                        seq = tok_seq[t]
                        s = tid % BT
                        part = tid // BT
                        wp = tid >> 5
                        lane = tid & 31
                        gh = min(wp, G - 1)
                        cuda.syncthreads()
                        for bi in range(b0, b1):
                            blk = tables[U(seq), U(bi)]
                            ns = min(BT, n - bi * BT)
                            for g in range(G):
                                sc[g] = float32(0.0)
                            if s < ns:
                                for i in range(part, hd, 4):
                                    kv = k_pool[U(blk), U(layer), U(kvh), U(i), U(s)]
                                    for g in range(G):
                                        sc[g] += q_s[g, i] * kv
                            for g in range(G):
                                ps4[part, g, s] = sc[g]
                            cuda.syncthreads()
                            if tid < BT:
                                for g in range(G):
                                    p_s[g, tid] = (ps4[0, g, tid] + ps4[1, g, tid] + ps4[2, g, tid]
                                                   + ps4[3, g, tid]) if tid < ns else NEG
                            cuda.syncthreads()
                            # warp gh: the running max and sum of head gh (every warp takes
                            # part in the shuffles; warps past G only repeat head G - 1)
                            a = p_s[gh, lane]
                            b = p_s[gh, lane + 32]
                            mold = m_s[gh]
                            newm = max(mold, warp_max(max(a, b)))
                            ea = math.exp(a - newm) if lane < ns else float32(0.0)
                            eb = math.exp(b - newm) if lane + 32 < ns else float32(0.0)
                            tot = warp_sum(ea + eb)
                            cuda.syncthreads()
                            if wp < G:
                                p_s[gh, lane] = ea
                                p_s[gh, lane + 32] = eb
                                if lane == 0:
                                    c = math.exp(mold - newm)
                                    c_s[gh] = c
                                    m_s[gh] = newm
                                    l_s[gh] = l_s[gh] * c + tot
                            cuda.syncthreads()
                            for e in range(tid, G * hd, THREADS):
                                g = e // hd
                                i = e % hd
                                acc = o_s[g, i] * c_s[g]
                                for s2 in range(ns):
                                    acc += p_s[g, s2] * v_pool[U(blk), U(layer), U(kvh), U(s2), U(i)]
                                o_s[g, i] = acc
                            cuda.syncthreads()
                        if splits == 1:
                            for e in range(tid, G * hd, THREADS):
                                g = e // hd
                                att[U(t), U((kvh * G + g) * hd + e % hd)] = o_s[g, e % hd] / l_s[g]
                        else:
                            for e in range(tid, G * hd, THREADS):
                                g = e // hd
                                part_o[U(t), U(kvh * G + g), U(sp), U(e % hd)] = o_s[g, e % hd]
                            if tid < G:
                                part_m[t, kvh * G + tid, sp] = m_s[tid]
                                part_l[t, kvh * G + tid, sp] = l_s[tid]
                            cuda.threadfence()
                            cuda.syncthreads()
                            if tid == 0:
                                done = cuda.atomic.add(cnt, t * n_kv + kvh, 1)
                                flag[0] = 1 if done == splits - 1 else 0
                            cuda.syncthreads()
                            if flag[0] == 1:  # the last split of (t, kvh): merge, in split order
                                cuda.threadfence()
                                for e in range(tid, G * hd, THREADS):
                                    hh = kvh * G + e // hd
                                    i = e % hd
                                    mx = NEG
                                    for k in range(splits):
                                        mx = max(mx, part_m[U(t), U(hh), U(k)])
                                    den = float32(0.0)
                                    num = float32(0.0)
                                    for k in range(splits):
                                        f = math.exp(part_m[U(t), U(hh), U(k)] - mx)
                                        den += part_l[U(t), U(hh), U(k)] * f
                                        num += part_o[U(t), U(hh), U(k), U(i)] * f
                                    att[U(t), U(hh * hd + i)] = num / den
                                if tid == 0:
                                    cnt[t * n_kv + kvh] = 0
                        cuda.syncthreads()
                else:  # ------------------------------------------ the matmul stages
                    # One call site of dot_item for all of them: each inlined copy costs
                    # Numba's front end seconds of compilation.
                    # (no array is chosen per stage but the weights and src: a chosen array
                    # carries its shape in registers through the whole stage)
                    src, nrow, use_norm, use_rows, Tn = x, layer, True, False, T
                    wq, wd, wm, ww, fmt, wi = qq, qd, qm, qw, fq, 0
                    R = q_w + 2 * kv_w
                    passes = 1
                    if kind == 2:
                        src, use_norm, R = att, False, D
                        wq, wd, wm, ww, fmt, wi = oq, od, om, ow, fo, 1
                    elif kind == 3:
                        nrow, R, passes = L + layer, n_ff, 2
                        wq, wd, wm, ww, fmt, wi = gq, gd, gm, gw, fg, 2
                    elif kind == 4:
                        src, use_norm, R = h, False, D
                        wq, wd, wm, ww, fmt, wi = dq_, dd, dm, dw, fd, 3
                    elif kind == HEAD:
                        nrow, use_rows, Tn = 2 * L, True, n_out
                        wq, wd, wm, ww, fmt, wi = lq, ld, lm, lw, fl, 5
                        R = logits.shape[1]
                    ng = (R + ROWS - 1) // ROWS
                    tiles = (Tn + TT - 1) // TT
                    dims = wdim[wi]
                    nb = dims[1]
                    S = k_splits_dev(ng * tiles, nb, split_target, K_SPLITS)
                    # D and E may run at once (no barrier between): their split scratch and
                    # counters are apart, by the stage kind's parity
                    par = (kind & 1) * (mcnt.shape[0] // 2)
                    for it in range(bid, ng * tiles * S, nblocks):
                        if tid == 0:
                            cst[5] = it
                            cst[6] = layer
                            cst[7] = R
                            cst[8] = ng
                            cst[9] = S
                            cst[10] = par
                            cst[11] = Tn
                            cst[12] = passes
                        g = it % ng
                        sk = (it // ng) % S
                        tile = (it // ng) // S
                        tg = par + tile * ng + g   # the (token tile, row group)'s counter
                        t0 = tile * TT
                        kb0 = sk * nb // S
                        kb1 = (sk + 1) * nb // S
                        if kind == 4:  # the gate|up groups that wrote this slice's h columns
                            hb = (layer * n_tiles + tile) * rdy_per + n_kv
                            wait_at_least(rdy, hb + kb0 * 32 // ROWS, hb + min(kb1 * 32 // ROWS, ngd),
                                          1, bar, tid)
                        for ps in range(passes):  # SwiGLU: the gate group, then the up group
                            dot_item(fmt, wq, wd, wm, ww, dims, layer, g + ps * ng, kb0, kb1, src,
                                     logit_rows, use_rows, t0, Tn, norms, nrow, use_norm, red, red8,
                                     res2 if ps + 1 < passes else res, ssr)
                        # the item's indices again, from the copy in shared memory (written
                        # before dot_item's barriers): not held in registers through its loop
                        it = cst[5]
                        ng = cst[8]
                        S = cst[9]
                        par = cst[10]
                        Tn = cst[11]
                        passes = cst[12]
                        q_w = n_head * hd
                        kv_w = n_kv * hd
                        g = it % ng
                        sk = (it // ng) % S
                        tile = (it // ng) // S
                        tg = par + tile * ng + g
                        t0 = tile * TT
                        n_tiles = cst[2]
                        ngd = cst[3]
                        rdy_per = cst[4]
                        G = cst[1]
                        layer = cst[6]
                        R = cst[7]
                        tid = thread_index()
                        if S > 1:
                            # split K: this slice's sums into scratch; the item of the row
                            # group that arrives last adds every slice's, in slice order, so
                            # the sum does not depend on which block that is, and finishes
                            slot = tg * S + sk
                            if tid < ROWS * TT:
                                pmm[slot, tid // TT, tid % TT] = res[tid // TT, tid % TT]
                                if passes == 2:
                                    pmm[slot, ROWS + tid // TT, tid % TT] = res2[tid // TT, tid % TT]
                            if tid < TT:
                                pmm[slot, 2 * ROWS, tid] = ssr[tid]
                            cuda.threadfence()
                            cuda.syncthreads()
                            if tid == 0:
                                done = cuda.atomic.add(mcnt, tg, 1)
                                flag[0] = 1 if done == S - 1 else 0
                            cuda.syncthreads()
                            if flag[0] == 0:
                                continue
                            cuda.threadfence()
                            if tid < ROWS * TT:
                                rr = tid // TT
                                tt = tid % TT
                                v = float32(0.0)
                                v2 = float32(0.0)
                                for k in range(S):
                                    v += pmm[tg * S + k, rr, tt]
                                    if passes == 2:
                                        v2 += pmm[tg * S + k, ROWS + rr, tt]
                                res[rr, tt] = v
                                res2[rr, tt] = v2
                            if tid < TT:
                                v = float32(0.0)
                                for k in range(S):
                                    v += pmm[tg * S + k, 2 * ROWS, tid]
                                ssr[tid] = v
                            if tid == 0:
                                mcnt[tg] = 0
                            cuda.syncthreads()
                        rbase = (layer * n_tiles + tile) * rdy_per
                        row = tid % ROWS
                        tt = tid // ROWS
                        r = g * ROWS + row
                        t = t0 + tt
                        live = tt < TT and t < Tn and r < R
                        if kind == 4:  # every gate|up item of the tile has read x
                            wait_at_least(rdy, rbase + n_kv + ngd, rbase + n_kv + ngd + 1, ngd, bar, tid)
                        if kind == 0:  # ----------------------------- A: bias, RoPE, K/V out
                            if tt < TT:
                                v = res[row, tt] * inv_rms(ssr[tt], D, eps)
                                if has_bias and r < R:
                                    v += qkv_bias[layer, r]
                                res2[row, tt] = v
                            cuda.syncthreads()
                            if live:
                                v = res2[row, tt]
                                if r < q_w + kv_w:  # Q and K heads: rotate the adjacent pair
                                    p = tok_pos[t]
                                    i = (r % hd) // 2
                                    c = cos[p, i]
                                    sn = sin[p, i]
                                    a0 = res2[row - (row & 1), tt]
                                    a1 = res2[row | 1, tt]
                                    v = a0 * sn + a1 * c if row & 1 else a0 * c - a1 * sn
                                if r < q_w:
                                    qbuf[t, r] = v
                                else:
                                    pp = tok_pos[t]
                                    blk = tables[tok_seq[t], pp // BT]
                                    off = pp % BT
                                    rk = r - q_w
                                    if rk < kv_w:
                                        k_pool[blk, layer, rk // hd, rk % hd, off] = v
                                    else:
                                        rv = rk - kv_w
                                        v_pool[blk, layer, rv // hd, off, rv % hd] = v
                        elif kind == 3:  # ------------------------------------ D: SwiGLU
                            if live:
                                inv = inv_rms(ssr[tt], D, eps)
                                gv = res2[row, tt] * inv
                                h[t, r] = gv / (float32(1.0) + math.exp(-gv)) * (res[row, tt] * inv)
                        elif kind == HEAD:  # ------------------ logits and the argmax keys
                            key = NO_KEY
                            if live:
                                v = res[row, tt] * inv_rms(ssr[tt], D, eps)
                                logits[t, r] = v
                                key = argmax_key(v, r)
                            for o in KEY_SHUFFLES:  # the lanes of one token's rows
                                key = max(key, shfl_xor(key, o))
                            if row == 0 and tt < TT and t < Tn and key != NO_KEY:
                                cuda.atomic.max(best, t, key)
                        else:  # ------------------------------ C, E: the residual add
                            if live:
                                x[t, r] += res[row, tt]
                        if kind == 0:  # Q, K or V rows of one KV head (ROWS divides hd)
                            r0 = g * ROWS
                            kh = (r0 // hd) // G if r0 < q_w else ((r0 - q_w) // hd) % n_kv
                            count_ready(rdy, rbase + kh, tid)
                        elif kind == 3:
                            count_ready(rdy, rbase + n_kv + g, tid)
                            count_ready(rdy, rbase + n_kv + ngd, tid)
                        cuda.syncthreads()
            if st + 1 < stage_hi and (st == 0 or BARRIER_AFTER[(st - 1) % STAGES_PER_LAYER]):
                # the next stage's weights on their way to L2 while the grid gathers; what
                # it needs is derived again here (kernel arguments, shared memory), not
                # held through the stage (one call site: each inlined copy costs registers)
                nk = st % STAGES_PER_LAYER       # the next stage's kind
                nl = st // STAGES_PER_LAYER      # and layer
                if st + 1 == stage_count_dev(cst[0]) - 1:
                    nk, nl = HEAD, 0
                pq, pd, pm, pf, pi = qq, qd, qm, fq, 0
                pR, pT = n_head * hd + 2 * n_kv * hd, tok.shape[0]
                if nk == 2:
                    pq, pd, pm, pf, pi, pR = oq, od, om, fo, 1, x.shape[1]
                elif nk == 3:
                    pq, pd, pm, pf, pi, pR = gq, gd, gm, fg, 2, n_ff
                elif nk == HEAD:
                    pq, pd, pm, pf, pi = lq, ld, lm, fl, 5
                    pR, pT = logits.shape[1], logit_rows.shape[0]
                if nk != 1 and nk != 4:   # (B and E follow a ready counter, not a barrier)
                    prefetch_first_item(pf, pq, pd, pm, wdim[pi], nl, pR, pT, bid,
                                        split_target)
                tid = thread_index()
                grid_sync(bar, tid)

    return step


k_splits_dev = device(k_splits_for)


@device
def stage_count_dev(n_layer):
    return 2 + STAGES_PER_LAYER * n_layer


# The scales' type: float16 where every weight's (d, m) are f16 values (the file's own for
# Q4_0, Q4_1, Q8_0: step_launch.py checks), a sixth fewer bytes a Q4_1 weight than float32;
# float32 otherwise (the K-quants' d_sb * sc products need more bits). Kernels are registered
# in this order: "<name>#0" is the float16 kernel.
SCALE_TYPES = ("float16", "float32")
_W = "uint32[::1], {S}[::1], {S}[::1], float32[::1], int64"
_F2 = "float32[:, ::1]"
_I1 = "int32[::1]"
_SIG_TEMPLATE = (
    "void(" + ", ".join([_W] * 6) + ", int32[:, ::1], " + _F2 + ", " + _F2 + ", boolean, "
    + _F2 + ", " + _F2 + ", float32[:, :, :, :, ::1], float32[:, :, :, :, ::1], "
    + ", ".join([_I1] * 4) + ", int32[:, ::1], "
    + ", ".join([_F2] * 5) + ", float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], "
    + "int32[::1], int64[::1], float32[:, :, ::1], int32[::1], int32[::1], int32[::1], "
    + "int64, int64, int64, int64, float32, float32, int64, int64, int64, int64)")



def signature(scales: type | str) -> str:
    """The registered launch signature for scales of this numpy type (SCALE_TYPES)."""
    return _SIG_TEMPLATE.format(S=np.dtype(scales).name)


STEP = {TT: _make(TT) for TT in TOKEN_TILES}
