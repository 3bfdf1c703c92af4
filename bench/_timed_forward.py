"""gpu/model.forward with a cycle counter read between its kernels (bench_kernels.py).

The body is gpu/model.forward's, kernel for kernel and in the same order, so every weight
comes from DRAM or cache exactly as in a real step (timing one kernel class over all layers
in a loop of its own would leave its weights in the L3 between layers). Timing from Python
around each call would add a dispatch per call (several µs: more than an RMSNorm takes); the
time-stamp counter read here costs tens of cycles. bench_kernels.py checks that the classes
sum to the plain forward's time, which also catches this copy drifting from the original.

The counter is LLVM's readcyclecounter (rdtsc on x86): constant-rate on any CPU that lists
constant_tsc / nonstop_tsc; bench_kernels.py converts ticks to seconds against perf_counter.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from zerolayer.gpu.model import _add, _add_row
from zerolayer.gpu.ops.attention import attention, kv_write
from zerolayer.gpu.ops.embedding import embed
from zerolayer.gpu.ops.matmul import layer_matmul
from zerolayer.gpu.ops.rmsnorm import rmsnorm
from zerolayer.gpu.ops.rope import rope
from zerolayer.gpu.ops.swiglu import swiglu

# the kernel classes, in the order of acc's entries
CLASSES = ("embed", "rmsnorm", "qkv matmul", "rope", "kv_write", "attention", "o matmul",
           "residual adds", "gate|up matmul", "swiglu", "down matmul", "LM head")
EMBED, NORM, QKV, ROPE, KVW, ATTN, WO, ADD, GU, SWIGLU, DOWN, HEAD = range(len(CLASSES))


@intrinsic
def tsc(typingctx):
    """The CPU's time-stamp counter (int64 ticks)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(cache=True, nogil=True)
def tsc_now():
    return tsc()


@njit(fastmath=True, cache=True, nogil=True)
def timed_forward(tokens, tok_seq, tok_pos, logit_rows, block_tables, k_pool, v_pool,
                  emb, wqkv, wo, wgu, wdown, attn_norm, ffn_norm, out_norm, outw, qkv_bias, cos, sin,
                  n_head, n_kv, hd, n_ff, eps, splits, logits, acc):
    """gpu/model.forward; acc[c] += the ticks spent in kernel class c (CLASSES). Returns the
    ticks of the whole call."""
    t_start = tsc()
    T = tokens.shape[0]
    D = attn_norm.shape[1]
    L = attn_norm.shape[0]
    x = np.empty((T, D), np.float32)
    xn = np.empty((T, D), np.float32)
    qkv = np.empty((T, (n_head + 2 * n_kv) * hd), np.float32)
    att = np.empty((T, n_head * hd), np.float32)
    gu = np.empty((T, 2 * n_ff), np.float32)
    h = np.empty((T, n_ff), np.float32)
    tmp = np.empty((T, D), np.float32)
    t = tsc()
    embed(emb[0], emb[1][0], emb[2][0], emb[3][0], emb[4][0], tokens, x)
    t1 = tsc()
    acc[EMBED] += t1 - t
    t = t1
    for layer in range(L):
        rmsnorm(x, attn_norm[layer], eps, xn)
        t1 = tsc()
        acc[NORM] += t1 - t
        t = t1
        layer_matmul(wqkv, layer, xn, qkv)
        if qkv_bias.shape[1] != 0:
            _add_row(qkv, qkv_bias[layer])
        t1 = tsc()
        acc[QKV] += t1 - t
        t = t1
        rope(qkv, 0, tok_pos, cos, sin, n_head + n_kv, hd)
        t1 = tsc()
        acc[ROPE] += t1 - t
        t = t1
        kv_write(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd)
        t1 = tsc()
        acc[KVW] += t1 - t
        t = t1
        attention(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd,
                  splits, att)
        t1 = tsc()
        acc[ATTN] += t1 - t
        t = t1
        layer_matmul(wo, layer, att, tmp)
        t1 = tsc()
        acc[WO] += t1 - t
        t = t1
        _add(x, tmp)
        t1 = tsc()
        acc[ADD] += t1 - t
        t = t1
        rmsnorm(x, ffn_norm[layer], eps, xn)
        t1 = tsc()
        acc[NORM] += t1 - t
        t = t1
        layer_matmul(wgu, layer, xn, gu)
        t1 = tsc()
        acc[GU] += t1 - t
        t = t1
        swiglu(gu, h)
        t1 = tsc()
        acc[SWIGLU] += t1 - t
        t = t1
        layer_matmul(wdown, layer, h, tmp)
        t1 = tsc()
        acc[DOWN] += t1 - t
        t = t1
        _add(x, tmp)
        t1 = tsc()
        acc[ADD] += t1 - t
        t = t1
    n_out = logit_rows.shape[0]
    xl = np.empty((n_out, D), np.float32)
    for i in range(n_out):
        xl[i] = x[logit_rows[i]]
    xln = np.empty((n_out, D), np.float32)
    t1 = tsc()
    acc[ADD] += t1 - t
    t = t1
    rmsnorm(xl, out_norm, eps, xln)
    t1 = tsc()
    acc[NORM] += t1 - t
    t = t1
    layer_matmul(outw, 0, xln, logits)
    t1 = tsc()
    acc[HEAD] += t1 - t
    return t1 - t_start
