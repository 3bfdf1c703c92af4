"""The Llama forward pass, in one file.

``forward`` is one compiled function for every kind of step: a prefill of one prompt, a
decode step of N sequences at different positions, or a mix (continuous batching). The
tokens of all sequences are laid out flat; each token carries its sequence and position,
and each sequence its KV block table. One call per step keeps Python out of the ~200 kernel
invocations a step makes; the kernels themselves are parallel (numba prange, OpenMP).

    x = embed(tokens)
    for each layer:
        qkv = rmsnorm(x) @ [Wq|Wk|Wv]^T (+ [bq|bk|bv]) ; rope(q), rope(k) ; write k, v to the KV arena
        x  += attention(q, K, V) @ Wo^T
        x  += swiglu(rmsnorm(x) @ [Wgate|Wup]^T) @ Wdown^T
    logits = rmsnorm(x[last token of each sequence]) @ Wout^T
"""
from __future__ import annotations

import dataclasses
import os

import numba
import numpy as np
import numpy.typing as npt
from numba import njit

from . import gguf_loader, model_cache
from .gguf_loader import ModelConfig, ModelWeights
from .kv_cache import KVArena, Sequence
from .model_api import Draw, ReadyTokens, StepInput, step_arrays  # noqa: F401 (StepInput: API)
from .ops import cpu_features, int8_matmul  # the int8 CPU kernels
from .ops import penalties as _penalties
from .ops import token_mask as _token_mask
from .ops.attention import BLOCK_TOKENS, attention, kv_write
from .ops.cycle_counter import clock_start, lap
from .ops.embedding import embed
from .ops.logprobs import row_logprobs
from .ops.matmul import layer_matmul
from .ops.penalties import Penalty
from .ops.rmsnorm import rmsnorm
from .ops.rope import rope, rope_tables
from .ops.sampling import sample
from .ops.swiglu import swiglu
from .tokenizer import Tokenizer, TokenizerMeta


@njit(fastmath=True, cache=True, nogil=True)
def _add(x, y):
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += y[t, i]


@njit(fastmath=True, cache=True, nogil=True)
def _add_row(x, b):
    """x[t] += b for every row t (a bias)."""
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += b[i]


# The kernel classes of a forward, in the order of forward_timed's tick counts.
KERNEL_CLASSES = ("embed", "rmsnorm", "qkv matmul", "rope", "kv_write", "attention", "o matmul",
                  "residual adds", "gate|up matmul", "swiglu", "down matmul", "LM head")
(EMBED, NORM, QKV, ROPE, KVW, ATTN, WO, ADD, GU, SWIGLU, DOWN, HEAD) = range(len(KERNEL_CLASSES))


@njit(fastmath=True, cache=True, nogil=True)
def forward_timed(tokens, tok_seq, tok_pos, logit_rows, block_tables, k_pool, v_pool,
                  emb, wqkv, wo, wgu, wdown, attn_norm, ffn_norm, out_norm, outw, qkv_bias,
                  cos, sin, n_head, n_kv, hd, n_ff, eps, splits, logits, ticks):
    """forward, and ticks[c] += the time-stamp-counter ticks spent in kernel class c
    (KERNEL_CLASSES), read between the kernels, so every weight comes from DRAM or cache
    exactly as in an untimed step. Returns the ticks of the whole call. ticks None (forward):
    no counter is read, in code compiled apart for it."""
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
    t = t0 = clock_start(ticks)
    embed(emb[0], emb[1][0], emb[2][0], emb[3][0], emb[4][0], tokens, x)
    t = lap(ticks, EMBED, t)
    for layer in range(L):
        rmsnorm(x, attn_norm[layer], eps, xn)
        t = lap(ticks, NORM, t)
        layer_matmul(wqkv, layer, xn, qkv)
        if qkv_bias.shape[1] != 0:  # [L, 0]: no biases (llama)
            _add_row(qkv, qkv_bias[layer])
        t = lap(ticks, QKV, t)
        rope(qkv, 0, tok_pos, cos, sin, n_head + n_kv, hd)  # Q and K heads are adjacent
        t = lap(ticks, ROPE, t)
        kv_write(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd)
        t = lap(ticks, KVW, t)
        attention(qkv, k_pool, v_pool, layer, tok_seq, tok_pos, block_tables, n_head, n_kv, hd,
                  splits, att)
        t = lap(ticks, ATTN, t)
        layer_matmul(wo, layer, att, tmp)
        t = lap(ticks, WO, t)
        _add(x, tmp)
        t = lap(ticks, ADD, t)
        rmsnorm(x, ffn_norm[layer], eps, xn)
        t = lap(ticks, NORM, t)
        layer_matmul(wgu, layer, xn, gu)
        t = lap(ticks, GU, t)
        swiglu(gu, h)
        t = lap(ticks, SWIGLU, t)
        layer_matmul(wdown, layer, h, tmp)
        t = lap(ticks, DOWN, t)
        _add(x, tmp)
        t = lap(ticks, ADD, t)
    n_out = logit_rows.shape[0]
    xl = np.empty((n_out, D), np.float32)
    for i in range(n_out):
        xl[i] = x[logit_rows[i]]
    xln = np.empty((n_out, D), np.float32)
    t = lap(ticks, ADD, t)
    rmsnorm(xl, out_norm, eps, xln)
    t = lap(ticks, NORM, t)
    layer_matmul(outw, 0, xln, logits)
    return lap(ticks, HEAD, t) - t0


@njit(fastmath=True, cache=True, nogil=True)
def forward(tokens, tok_seq, tok_pos, logit_rows, block_tables, k_pool, v_pool,
            emb, wqkv, wo, wgu, wdown, attn_norm, ffn_norm, out_norm, outw, qkv_bias, cos, sin,
            n_head, n_kv, hd, n_ff, eps, splits, logits):
    forward_timed(tokens, tok_seq, tok_pos, logit_rows, block_tables, k_pool, v_pool,
                  emb, wqkv, wo, wgu, wdown, attn_norm, ffn_norm, out_norm, outw, qkv_bias,
                  cos, sin, n_head, n_kv, hd, n_ff, eps, splits, logits, None)


class LlamaModel:
    """A loaded model plus its KV arena. ``step`` runs the forward pass for several sequences.
    Satisfies model_api.Model; ``forward`` runs without the GIL (every kernel is nogil), so
    the daemon's I/O thread keeps answering while a step computes."""

    overlaps = False  # launch_tokens runs the step before it returns
    tokenizer_meta: TokenizerMeta | None  # set by load(); None: the GGUF has no tokenizer
    verifies_drafts = True  # StepInput.every_logit: the forward takes any logit rows

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, *, max_seq_len: int | None = None,
                 kv_blocks: int | None = None, path: str = "",
                 prepared: dict | None = None,
                 kv_dtype: cpu_features.KVType | None = None):
        self.cfg = cfg
        self.w = weights
        self.path = path
        self.max_seq_len = min(max_seq_len or cfg.context_length, cfg.context_length)
        if kv_blocks is None:  # room for 16 full-length sequences; lazily backed by the OS
            kv_blocks = 16 * -(-self.max_seq_len // BLOCK_TOKENS)
        # kv_dtype: np.uint16 (float16 bits) or np.float32; None: ZEROLAYER_CPU_KV's (f16)
        self.arena = KVArena(cfg.n_layer, cfg.n_kv, cfg.head_dim, kv_blocks, self.max_seq_len,
                             kv_dtype)
        # RoPE scaling (linear, Llama 3.1's frequency factors) lives in the tables alone
        self.cos, self.sin = rope_tables(self.max_seq_len, cfg.head_dim, cfg.rope_base,
                                         cfg.rope_freq_scale, weights.rope_freqs,
                                         cfg.rope_attn_factor)
        self.qkv_bias = (weights.qkv_bias if weights.qkv_bias is not None
                         else np.zeros((cfg.n_layer, 0), np.float32))
        # --- int8 CPU kernels (gpu/ops/int8_matmul.py): the matmul weights re-laid
        # out once for the kernel set chosen at import (gpu/ops/cpu_features.py), or given
        # already so (prepared: from the model cache); self.w keeps the original layout (the
        # CUDA forward reads it)
        mw = (dataclasses.replace(weights, **prepared) if prepared is not None
              else int8_matmul.prepare_model(weights))
        self.prepared = {k: getattr(mw, k) for k in int8_matmul.MATMUL_WEIGHTS}
        # the forward reads each layer's format from its weight's table (layer_matmul), and
        # streams the weights from huge pages (int8_matmul.resident)
        mats = {k: int8_matmul.for_forward(w) for k, w in self.prepared.items()}
        self._wargs = (weights.emb, mats["wqkv"], mats["wo"], mats["wgu"], mats["wdown"],
                       weights.attn_norm, weights.ffn_norm, weights.out_norm, mats["output"],
                       self.qkv_bias)
        # --- end int8

    @classmethod
    def load(cls, path: str | None = None, *, use_cache: bool = True,
             max_seq_len: int | None = None, kv_blocks: int | None = None,
             kv_dtype: cpu_features.KVType | None = None) -> LlamaModel:
        """Load a GGUF (default: the bundled model), through the repacked-model cache."""
        path = path or gguf_loader.default_model_path()
        if not os.path.exists(path):
            raise gguf_loader.ModelFormatError(f"model file not found: {path}")
        cached = model_cache.load(path) if use_cache else None
        if cached is None:
            reader = gguf_loader.open_gguf(path)
            cfg = gguf_loader.read_config(reader)
            weights = gguf_loader.load_weights(reader, cfg)
            # a model may come without a tokenizer (token-id payloads still work)
            tok_meta = (Tokenizer.metadata_from_gguf(reader)
                        if "tokenizer.ggml.model" in reader.fields else None)
            if use_cache:
                model_cache.save(path, cfg, weights, tok_meta)
            cached = (cfg, weights, tok_meta)
        key = cpu_features.layout_key()  # None: the float kernels, nothing to prepare
        prepared = model_cache.load_prepared(path, key) if use_cache and key else None
        model = cls(cached[0], cached[1], path=path, prepared=prepared, max_seq_len=max_seq_len,
                    kv_blocks=kv_blocks, kv_dtype=kv_dtype)
        model.tokenizer_meta = cached[2]
        if use_cache and key and prepared is None:
            model_cache.save_prepared(path, key, model.prepared)
        return model

    @property
    def reader(self):
        """The GGUF itself (slow to open: only tests and tools need it)."""
        return gguf_loader.open_gguf(self.path)

    def tokenizer(self) -> Tokenizer:
        if self.tokenizer_meta is None:
            raise gguf_loader.ModelFormatError(f"{self.path}: the GGUF has no tokenizer")
        return Tokenizer(**self.tokenizer_meta)

    def new_sequence(self) -> Sequence:
        return self.arena.new_sequence()

    def step(self, inputs: list[StepInput], every_position: bool = False,
             ticks: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.float32]:
        """Append each input's tokens to its sequence; return logits [N, vocab] (float32)
        of the last new token of each sequence that asked for them (in input order), or with
        every_position, of every new token (the accuracy harness scores them all). Raises
        ContextOverflowError/KVCacheFullError before touching any state if a sequence can't
        grow. ticks (int64 [len(KERNEL_CLASSES)]): the forward's time per kernel class is
        added to it (forward_timed)."""
        arr = step_arrays(inputs, self.cfg.vocab)
        rows = np.arange(len(arr.tokens), dtype=np.int32) if every_position else arr.logit_rows
        if arr.uses_prev:
            raise ValueError("the CPU model does not overlap steps (from_prev)")
        cfg = self.cfg
        T = len(arr.tokens)
        # enough attention work items for every thread (flash-decoding splits), but no more
        # splits than the longest sequence has KV blocks: an empty split is a work item and a
        # merge pass for nothing (at 50 positions, one block, 2 splits cost ~30% more)
        blocks = max(-(-(i.seq.length + len(i.tokens)) // BLOCK_TOKENS) for i in inputs)
        splits = max(1, min((4 * numba.get_num_threads()) // (T * cfg.n_kv), blocks))
        logits = np.empty((len(rows), cfg.vocab), np.float32)
        a = self.arena
        forward_timed(arr.tokens, arr.tok_seq, arr.tok_pos, rows, arr.tables, a.k_pool,
                      a.v_pool, *self._wargs, self.cos, self.sin, cfg.n_head, cfg.n_kv,
                      cfg.head_dim, cfg.n_ff, np.float32(cfg.eps), splits, logits,
                      ticks)
        for i in inputs:
            i.seq.length += len(i.tokens)
        return logits

    def step_tokens(self, inputs: list[StepInput], draws: list[Draw],
                    penalties: list[Penalty | None] | None = None) -> npt.NDArray[np.int32]:
        """step(), then one token id drawn from each logit row with draws[r]
        (gpu/ops/sampling.sample), after penalties[r] (gpu/ops/penalties.py; None: none).
        int32 [N]."""
        return self.launch_tokens(inputs, draws, penalties).wait()

    def launch_tokens(self, inputs: list[StepInput], draws: list[Draw],
                      penalties: list[Penalty | None] | None = None,
                      logprobs: list[int] | None = None,
                      masks: list[npt.NDArray[np.uint32] | None] | None = None) -> ReadyTokens:
        """step_tokens, already done: the CPU kernels are the CPU's whole work. Logprobs
        (model_api) are computed from the same penalised rows the sampler read, only for
        the rows that ask. A row with a token mask (model_api) has it applied after its
        penalties; the other rows are not touched."""
        logits = self.step(inputs)
        for row, p in zip(logits, penalties or ()):
            if p is not None:
                _penalties.apply(row, p)
        for row, m in zip(logits, masks or ()):
            if m is not None:
                _token_mask.apply(row, m)
        ids = np.array([sample(row, *d) for row, d in zip(logits, draws)], np.int32)
        if logprobs is None:
            return ReadyTokens(ids)
        return ReadyTokens(ids, [row_logprobs(row, int(t), n) if n >= 0 else None
                                 for row, t, n in zip(logits, ids, logprobs)])


def set_threads(n: int | None = None) -> int:
    """Kernel threads: the CPUs this process may run on, unless told otherwise."""
    n = n or int(os.environ.get("ZEROLAYER_THREADS", 0)) or len(os.sched_getaffinity(0))
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    return numba.get_num_threads()
