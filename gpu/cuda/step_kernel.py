"""A whole forward step (embedding, every layer, the LM head and the greedy argmax) as ONE
persistent kernel: the device half of gpu/model.py's ``forward`` with no launch per op.

Why: at SmolLM2-135M's size a decode step moves ~115 MB of weights, ~25 us of HBM time on an
H200, while the per-op path (forward.py) is ~395 kernel nodes whose launch gaps and
latency-bound small grids cost milliseconds. Here one launch runs a fixed sequence of
*stages*; between two stages every block waits at a grid barrier (grid_sync.py), which is
what a kernel boundary provided before:

    stage 0            x = embed(tokens); argmax slots cleared
    per layer, 5:      A  rmsnorm + [Q|K|V] matmul + bias + RoPE; K, V into the KV arena; Q kept
                       B  attention per (token, KV head, split); the last split merges
                       C  O-proj + residual:             x += att @ Wo^T
                       D  rmsnorm + [gate|up] + SwiGLU:  h = silu(xn Wg^T) * (xn Wu^T)
                       E  down + residual:               x += h @ Wd^T
    last stage         logits = rmsnorm(x[rows]) @ Wout^T, and each row's argmax

A stage is a list of work items taken grid-stride by the blocks: a *row group* (64 output
rows, gpu/quant.py's LANES) times a tile of TT tokens for the matmul stages, a (token, KV
head, split) for attention. The fusions need no extra pass:
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

Thread layout of a matmul item (256 threads): thread (j = tid // 16, quad = tid % 16) owns
rows 4*quad .. 4*quad + 3 of the group and byte position j (and j + 16 for 32-byte blocks)
of every K block: the group's weights are read as 32-bit words, one per thread per block,
``qs32[layer, g, b, j, quad]`` (the quant layout's bytes, 4 rows per word), so a warp reads
128 contiguous bytes per block. Partial sums meet by one shuffle (the two K positions of a
warp) and shared memory (the 8 warps). TT (tokens per item) is a compile-time constant: 1
for a step of one token, 4 otherwise.

Under the simulator the same kernel runs one stage per launch (grid_sync.py); the launch
count (``_cuda_shim.LAUNCHES``) still counts one launch per step, the launch the device makes.

References: float64 and CPU twins of every stage are the per-op kernels' (gpu/ops/*), and
tests/test_cuda_sim.py checks this kernel against the CPU model step by step.
"""
from __future__ import annotations

import math

import numpy as np
from numba import float32, int32, int64, uint32

from ..ops.attention import BLOCK_TOKENS
from ..quant import FMT_F32, FMT_Q4, LANES
from ._cuda_shim import cuda, device, float_bits, kernel, shfl_xor, warp_max, warp_sum
from .grid_sync import grid_sync
from .step_geometry import KERNEL

if KERNEL.rows_per_item != LANES or KERNEL.k_splits != 1:
    raise ImportError("step_kernel reads whole quant row groups: rows_per_item LANES, no K split")

# The cut of the work (step_geometry.KERNEL, which step_plan.py predicts from): one source.
THREADS = KERNEL.threads
ROWS = KERNEL.rows_per_item  # rows per matmul work item: one quant row group (LANES)
QUADS = ROWS // 4     # 16 row quads; THREADS // QUADS = 16 K positions
WARPS = THREADS // 32
STAGES_PER_LAYER = KERNEL.stages_per_layer
HEAD = STAGES_PER_LAYER  # the LM head's stage kind
MAX_G = 8             # query heads per KV head
MAX_HD = 128          # head_dim
BT = BLOCK_TOKENS     # 64 positions per KV block: one score per thread quarter
NEG = np.float32(-1e30)
NO_KEY = np.int64(-(2 ** 63))  # below every argmax key
TOKEN_TILES = (1, 4)


def stage_count(n_layer: int) -> int:
    return 2 + STAGES_PER_LAYER * n_layer


def supports(cfg, fmts) -> str | None:
    """Why this kernel can't run a model, or None when it can."""
    if cfg.n_ff % ROWS:
        return f"n_ff {cfg.n_ff} is not a multiple of {ROWS}"
    if cfg.head_dim > MAX_HD or cfg.head_dim % 2:
        return f"head_dim {cfg.head_dim} (at most {MAX_HD}, even)"
    if cfg.n_head % cfg.n_kv or cfg.n_head // cfg.n_kv > MAX_G:
        return f"GQA group {cfg.n_head}/{cfg.n_kv} (at most {MAX_G})"
    return None


def _make(TT):
    ACC = 4 * TT  # accumulators per thread: 4 rows x TT tokens (a constant for local arrays)

    @device
    def dot_group(fmt, qs, d, m, w, layer, g, src, rows, use_rows, t0, T, nw, use_norm, tid,
                  red, reds, res, ssr):
        """res[r, tt] = sum_k W[g*64 + r, k] * xw[t0 + tt, k], xw = src * nw if use_norm;
        ssr[tt] = sum_k src[t0 + tt, k]^2. Every thread of the block calls it."""
        j = tid >> 4
        quad = tid & 15
        trow = cuda.local.array(TT, int64)  # src row of each token of the tile
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
            R = w.shape[1]
            K = w.shape[2]
            for k in range(j, K, 16):
                sc = nw[k] if use_norm else float32(1.0)
                for tt in range(TT):
                    v = src[trow[tt], k]
                    ss[tt] += v * v
                    xa[tt] = v * sc
                for q in range(4):
                    wv = w[layer, min(g * ROWS + 4 * quad + q, R - 1), k]
                    for tt in range(TT):
                        acc[q * TT + tt] += wv * xa[tt]
        elif fmt == FMT_Q4:
            # four blocks' words loaded before any is used: loads in flight are what a
            # latency-bound stream needs (the clamped repeats at the end hit L1)
            nb = d.shape[2]
            for b0 in range(0, nb, 4):
                w0 = qs[layer, g, b0, j, quad]
                w1 = qs[layer, g, min(b0 + 1, nb - 1), j, quad]
                w2 = qs[layer, g, min(b0 + 2, nb - 1), j, quad]
                w3 = qs[layer, g, min(b0 + 3, nb - 1), j, quad]
                for u in range(4):
                    b = b0 + u
                    if b < nb:
                        word = w0 if u == 0 else (w1 if u == 1 else (w2 if u == 2 else w3))
                        e = b * 32 + j
                        sa = nw[e] if use_norm else float32(1.0)
                        sb = nw[e + 16] if use_norm else float32(1.0)
                        for tt in range(TT):
                            va = src[trow[tt], e]
                            vb = src[trow[tt], e + 16]
                            ss[tt] += va * va + vb * vb
                            xa[tt] = va * sa
                            xb[tt] = vb * sb
                        for q in range(4):
                            byte = (word >> uint32(8 * q)) & uint32(255)
                            lo = float32(byte & uint32(15))
                            hi = float32(byte >> uint32(4))
                            dq = d[layer, g, b, 4 * quad + q]
                            mq = m[layer, g, b, 4 * quad + q]
                            for tt in range(TT):
                                acc[q * TT + tt] += dq * (lo * xa[tt] + hi * xb[tt]) + mq * (xa[tt] + xb[tt])
        else:  # byte formats: BS bytes (= weights) per block, 32 or 16
            # a thread's words of two blocks (bytes j and j + 16 of each) loaded before use
            nb = d.shape[2]
            BS = qs.shape[3]
            j2 = min(j + 16, BS - 1)  # BS == 16: the second word is never used
            for b0 in range(0, nb, 2):
                b1 = min(b0 + 1, nb - 1)
                w0 = qs[layer, g, b0, j, quad]
                w1 = qs[layer, g, b0, j2, quad]
                w2 = qs[layer, g, b1, j, quad]
                w3 = qs[layer, g, b1, j2, quad]
                for u in range(4):
                    b = b0 + u // 2
                    jj = j + 16 * (u % 2)
                    if b < nb and jj < BS:
                        word = w0 if u == 0 else (w1 if u == 1 else (w2 if u == 2 else w3))
                        e = b * BS + jj
                        sa = nw[e] if use_norm else float32(1.0)
                        for tt in range(TT):
                            va = src[trow[tt], e]
                            ss[tt] += va * va
                            xa[tt] = va * sa
                        for q in range(4):
                            qv = float32((word >> uint32(8 * q)) & uint32(255))
                            dq = d[layer, g, b, 4 * quad + q]
                            mq = m[layer, g, b, 4 * quad + q]
                            for tt in range(TT):
                                acc[q * TT + tt] += (dq * qv + mq) * xa[tt]
        # the two K positions of a warp (lanes l and l ^ 16), then the 8 warps in shared memory
        lane = tid & 31
        wp = tid >> 5
        for i in range(4 * TT):
            v = acc[i]
            acc[i] = v + shfl_xor(v, 16)
        for tt in range(TT):
            v = ss[tt]
            ss[tt] = v + shfl_xor(v, 16)
        if lane < 16:
            for q in range(4):
                for tt in range(TT):
                    red[wp, 4 * lane + q, tt] = acc[q * TT + tt]
            if lane == 0:
                for tt in range(TT):
                    reds[wp, tt] = ss[tt]
        cuda.syncthreads()
        if tid < ROWS * TT:
            r = tid % ROWS
            tt = tid // ROWS
            v = float32(0.0)
            for k in range(WARPS):
                v += red[k, r, tt]
            res[r, tt] = v
        if tid < TT:
            v = float32(0.0)
            for k in range(WARPS):
                v += reds[k, tid]
            ssr[tid] = v
        cuda.syncthreads()

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

    @kernel([_SIG_TEMPLATE.format(TT=TT)], name=f"step_kernel.step_tt{TT}")
    def step(qq, qd, qm, qw, fq, oq, od, om, ow, fo, gq, gd, gm, gw, fg, dq_, dd, dm, dw, fd,
             eq, ed, em, ew, fe, lq, ld, lm, lw, fl,
             attn_norm, ffn_norm, out_norm, qkv_bias, has_bias, cos, sin, k_pool, v_pool,
             tok, tok_seq, tok_pos, logit_rows, tables,
             x, qbuf, att, h, logits, part_o, part_m, part_l, cnt, best, bar,
             n_head, n_kv, hd, n_ff, eps, scale, splits, stage_lo, stage_hi):
        tid = cuda.threadIdx.x
        bid = cuda.blockIdx.x
        nblocks = cuda.gridDim.x
        T = tok.shape[0]
        D = x.shape[1]
        n_out = logit_rows.shape[0]
        L = attn_norm.shape[0]
        G = n_head // n_kv
        q_w = n_head * hd
        kv_w = n_kv * hd
        red = cuda.shared.array((WARPS, ROWS, TT), float32)
        reds = cuda.shared.array((WARPS, TT), float32)
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
        last = stage_count_dev(L)
        for st in range(stage_lo, stage_hi):
            if st == 0:  # ---------------------------------------------------- embedding
                for e in range(bid * THREADS + tid, T * D, nblocks * THREADS):
                    t = e // D
                    k = e % D
                    r = tok[t]
                    if fe == FMT_F32:
                        x[t, k] = ew[0, r, k]
                    else:
                        gg = r // ROWS
                        l = r % ROWS
                        if fe == FMT_Q4:
                            b = k // 32
                            jb = k % 32
                            byte = (eq[0, gg, b, jb % 16, l // 4] >> uint32(8 * (l % 4))) & uint32(255)
                            qv = float32(byte >> uint32(4)) if jb >= 16 else float32(byte & uint32(15))
                        else:
                            bs = eq.shape[3]
                            b = k // bs
                            qv = float32((eq[0, gg, b, k % bs, l // 4] >> uint32(8 * (l % 4))) & uint32(255))
                        x[t, k] = qv * ed[0, gg, b, l] + em[0, gg, b, l]
                for i in range(bid * THREADS + tid, n_out, nblocks * THREADS):
                    best[i] = NO_KEY
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
                        for e in range(tid, G * hd, THREADS):
                            q_s[e // hd, e % hd] = qbuf[t, (kvh * G + e // hd) * hd + e % hd] * scale
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
                            blk = tables[seq, bi]
                            ns = min(BT, n - bi * BT)
                            for g in range(G):
                                sc[g] = float32(0.0)
                            if s < ns:
                                for i in range(part, hd, 4):
                                    kv = k_pool[blk, layer, kvh, i, s]
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
                                    acc += p_s[g, s2] * v_pool[blk, layer, kvh, s2, i]
                                o_s[g, i] = acc
                            cuda.syncthreads()
                        if splits == 1:
                            for e in range(tid, G * hd, THREADS):
                                g = e // hd
                                att[t, (kvh * G + g) * hd + e % hd] = o_s[g, e % hd] / l_s[g]
                        else:
                            for e in range(tid, G * hd, THREADS):
                                g = e // hd
                                part_o[t, kvh * G + g, sp, e % hd] = o_s[g, e % hd]
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
                                        mx = max(mx, part_m[t, hh, k])
                                    den = float32(0.0)
                                    num = float32(0.0)
                                    for k in range(splits):
                                        f = math.exp(part_m[t, hh, k] - mx)
                                        den += part_l[t, hh, k] * f
                                        num += part_o[t, hh, k, i] * f
                                    att[t, hh * hd + i] = num / den
                                if tid == 0:
                                    cnt[t * n_kv + kvh] = 0
                        cuda.syncthreads()
                else:  # ------------------------------------------ the matmul stages
                    # One call site of dot_group for all of them: each inlined copy costs
                    # Numba's front end seconds of compilation.
                    src, nw, use_norm, use_rows, rows, Tn = x, attn_norm[layer], True, False, tok, T
                    wq, wd, wm, ww, fmt = qq, qd, qm, qw, fq
                    R = q_w + 2 * kv_w
                    passes = 1
                    if kind == 2:
                        src, use_norm, R = att, False, D
                        wq, wd, wm, ww, fmt = oq, od, om, ow, fo
                    elif kind == 3:
                        nw, R, passes = ffn_norm[layer], n_ff, 2
                        wq, wd, wm, ww, fmt = gq, gd, gm, gw, fg
                    elif kind == 4:
                        src, use_norm, R = h, False, D
                        wq, wd, wm, ww, fmt = dq_, dd, dm, dw, fd
                    elif kind == HEAD:
                        nw, use_rows, rows, Tn = out_norm, True, logit_rows, n_out
                        wq, wd, wm, ww, fmt = lq, ld, lm, lw, fl
                        R = logits.shape[1]
                    ng = (R + ROWS - 1) // ROWS
                    tiles = (Tn + TT - 1) // TT
                    for it in range(bid, ng * tiles, nblocks):
                        g = it % ng
                        t0 = (it // ng) * TT
                        for ps in range(passes):  # SwiGLU: the gate group, then the up group
                            dot_group(fmt, wq, wd, wm, ww, layer, g + ps * ng, src, rows, use_rows,
                                      t0, Tn, nw, use_norm, tid, red, reds,
                                      res2 if ps + 1 < passes else res, ssr)
                        row = tid % ROWS
                        tt = tid // ROWS
                        r = g * ROWS + row
                        t = t0 + tt
                        live = tt < TT and t < Tn and r < R
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
                            for o in (16, 8, 4, 2, 1):
                                key = max(key, shfl_xor(key, o))
                            if tid % 32 == 0 and tt < TT and t < Tn and key != NO_KEY:
                                cuda.atomic.max(best, t, key)
                        else:  # ------------------------------ C, E: the residual add
                            if live:
                                x[t, r] += res[row, tt]
                        cuda.syncthreads()
            if st + 1 < stage_hi:
                grid_sync(bar, tid)

    return step


@device
def stage_count_dev(n_layer):
    return 2 + STAGES_PER_LAYER * n_layer


_W = "uint32[:, :, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, ::1], int64"
_F2 = "float32[:, ::1]"
_I1 = "int32[::1]"
_SIG_TEMPLATE = (
    "void(" + ", ".join([_W] * 6) + ", " + _F2 + ", " + _F2 + ", float32[::1], " + _F2 + ", boolean, "
    + _F2 + ", " + _F2 + ", float32[:, :, :, :, ::1], float32[:, :, :, :, ::1], "
    + ", ".join([_I1] * 4) + ", int32[:, ::1], "
    + ", ".join([_F2] * 5) + ", float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], "
    + "int32[::1], int64[::1], int32[::1], int64, int64, int64, int64, float32, float32, int64, "
    + "int64, int64)")

STEP = {TT: _make(TT) for TT in TOKEN_TILES}
