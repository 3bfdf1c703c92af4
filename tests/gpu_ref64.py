"""A float64 numpy Llama forward over weights in the kernels' layout: the reference that the
GPU check compares the CUDA forward pass with.

Why not the CPU model: it is JIT-compiled (on the GPU machine that cost 86 s of a 240 s
budget) and runs integer kernels, so its own rounding shows up in the comparison. Why not
gpu/reference.py: that one reads a GGUF; the GPU check's weights are synthetic arrays in the
kernels' row-interleaved layout, built without a file. This one undoes that layout (exactly:
quant.dequantize in float64) and computes everything else in float64: RMSNorm, RoPE on
adjacent pairs of each head (the layout the runtime uses for Llama), causal GQA attention
over every earlier position of the sequence, SwiGLU, the tied or separate LM head.

    ref = Reference64(cfg, weights)
    s = ref.new_sequence()
    logits = ref.step([(s, tokens)])   # one row per (sequence, tokens): its last token's logits
"""
from __future__ import annotations

import numpy as np


def dense(wt, rows: int, layer: int = 0) -> np.ndarray:
    """One layer of a quant.Weight -> float64 [rows, cols], in natural row order."""
    from zerolayer.gpu import quant
    fmt, qs, d, m, w = wt.layer(layer)
    if fmt == quant.FMT_F32:
        return np.asarray(w[:rows], np.float64)
    G, nb, inner, lanes = qs.shape
    nat = {"qs": qs.transpose(0, 3, 1, 2).reshape(G * lanes, nb * inner)[:rows],
           "d": d.transpose(0, 2, 1).reshape(G * lanes, nb)[:rows],
           "m": m.transpose(0, 2, 1).reshape(G * lanes, nb)[:rows]}
    return quant.dequantize(fmt, nat, np.float64)


class Sequence64:
    def __init__(self, n_layer: int):
        self.k: list[np.ndarray | None] = [None] * n_layer   # [S, n_kv, hd] per layer
        self.v: list[np.ndarray | None] = [None] * n_layer
        self.length = 0


class Reference64:
    def __init__(self, cfg, w):
        self.cfg = c = cfg
        hd, nh, nkv = c.head_dim, c.n_head, c.n_kv
        qkv_rows = (nh + 2 * nkv) * hd
        self.emb = dense(w.emb, c.vocab)
        self.out = self.emb if w.output is w.emb else dense(w.output, c.vocab)
        self.out_norm = np.asarray(w.out_norm, np.float64)
        self.layers = []
        bias = getattr(w, "qkv_bias", None)
        for i in range(c.n_layer):
            gu = dense(w.wgu, 2 * c.n_ff, i)
            self.layers.append({
                "attn_norm": np.asarray(w.attn_norm[i], np.float64),
                "ffn_norm": np.asarray(w.ffn_norm[i], np.float64),
                "qkv": dense(w.wqkv, qkv_rows, i), "o": dense(w.wo, c.d_model, i),
                "gate": gu[:c.n_ff], "up": gu[c.n_ff:], "down": dense(w.wdown, c.d_model, i),
                "bias": (np.asarray(bias[i], np.float64)
                         if bias is not None and np.size(bias) and bias.shape[1] else None)})
        inv = c.rope_base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        rf = getattr(w, "rope_freqs", None)
        if rf is not None and np.size(rf):
            inv = inv / np.asarray(rf, np.float64)
        self.inv_freq = inv * getattr(c, "rope_freq_scale", 1.0)
        self.attn_factor = getattr(c, "rope_attn_factor", 1.0)

    def new_sequence(self) -> Sequence64:
        return Sequence64(self.cfg.n_layer)

    def _norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.cfg.eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x [T, heads, hd], adjacent pairs (2i, 2i+1) rotated by pos * inv_freq[i]."""
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]     # [T, hd/2]
        co, si = (self.attn_factor * np.cos(ang))[:, None], (self.attn_factor * np.sin(ang))[:, None]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * co - b * si
        out[..., 1::2] = a * si + b * co
        return out

    def _chunk(self, s: Sequence64, tokens: np.ndarray) -> np.ndarray:
        """Append tokens to s; return the last one's logits."""
        c = self.cfg
        hd, nh, nkv = c.head_dim, c.n_head, c.n_kv
        T = len(tokens)
        pos = np.arange(s.length, s.length + T)
        x = self.emb[np.asarray(tokens, np.int64)]
        rep = nh // nkv
        for i, L in enumerate(self.layers):
            h = self._norm(x, L["attn_norm"])
            qkv = h @ L["qkv"].T
            if L["bias"] is not None:
                qkv = qkv + L["bias"]
            q = self._rope(qkv[:, :nh * hd].reshape(T, nh, hd), pos)
            k = self._rope(qkv[:, nh * hd:(nh + nkv) * hd].reshape(T, nkv, hd), pos)
            v = qkv[:, (nh + nkv) * hd:].reshape(T, nkv, hd)
            s.k[i] = k if s.k[i] is None else np.concatenate([s.k[i], k])
            s.v[i] = v if s.v[i] is None else np.concatenate([s.v[i], v])
            K, V = s.k[i], s.v[i]                                   # [S, nkv, hd]
            S = K.shape[0]
            kh = np.repeat(K, rep, axis=1).transpose(1, 0, 2)       # [nh, S, hd]
            vh = np.repeat(V, rep, axis=1).transpose(1, 0, 2)
            sc = np.einsum("thd,hsd->hts", q, kh) / np.sqrt(hd)     # [nh, T, S]
            causal = np.arange(S)[None, :] > pos[:, None]           # key after the query
            sc = np.where(causal[None], -np.inf, sc)
            p = np.exp(sc - sc.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            att = np.einsum("hts,hsd->thd", p, vh).reshape(T, nh * hd)
            x = x + att @ L["o"].T
            h = self._norm(x, L["ffn_norm"])
            g = h @ L["gate"].T
            x = x + (g / (1 + np.exp(-g)) * (h @ L["up"].T)) @ L["down"].T
        s.length += T
        return self._norm(x[-1], self.out_norm) @ self.out.T

    def step(self, inputs) -> np.ndarray:
        """inputs: [(Sequence64, tokens)] -> float64 logits [len(inputs), vocab]."""
        return np.stack([self._chunk(s, np.asarray(t)) for s, t in inputs])
