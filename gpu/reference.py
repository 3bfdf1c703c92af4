"""A float64 numpy Llama forward pass: the golden reference for the compiled runtime.

It shares nothing with the kernels but the file: weights are dequantized by the `gguf`
package itself (not by our repacking), attention is recomputed over every position, and all
arithmetic is float64. Slow, plain, and easy to check by eye.
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from .gguf_loader import ModelConfig


class ReferenceLlama:
    def __init__(self, reader: GGUFReader, cfg: ModelConfig):
        self.cfg = cfg
        t = {x.name: x for x in reader.tensors}

        def dense(name: str) -> np.ndarray:
            x = t[name]
            return dequantize(x.data, x.tensor_type).astype(np.float64).reshape(
                [int(s) for s in reversed(x.shape)])

        self.emb = dense("token_embd.weight")
        self.out = dense("output.weight") if "output.weight" in t else self.emb
        self.out_norm = dense("output_norm.weight")
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            self.layers.append({k: dense(p + k + ".weight") for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
        self.k: list[list[np.ndarray]] = [[] for _ in range(cfg.n_layer)]
        self.v: list[list[np.ndarray]] = [[] for _ in range(cfg.n_layer)]
        self.pos = 0

    def _norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean() + self.cfg.eps) * w

    def _rope(self, x: np.ndarray, n_heads: int, pos: int) -> np.ndarray:
        hd = self.cfg.head_dim
        x = x.reshape(n_heads, hd // 2, 2)
        ang = pos * self.cfg.rope_base ** (-np.arange(0, hd, 2) / hd)
        c, s = np.cos(ang), np.sin(ang)
        return np.stack([x[..., 0] * c - x[..., 1] * s, x[..., 0] * s + x[..., 1] * c], -1).reshape(-1)

    def step(self, token: int) -> np.ndarray:
        """Feed one token at the next position; return its logits (float64)."""
        c = self.cfg
        hd, rep = c.head_dim, c.n_head // c.n_kv
        x = self.emb[token].copy()
        for i, L in enumerate(self.layers):
            h = self._norm(x, L["attn_norm"])
            q = self._rope(L["attn_q"] @ h, c.n_head, self.pos).reshape(c.n_head, hd)
            self.k[i].append(self._rope(L["attn_k"] @ h, c.n_kv, self.pos).reshape(c.n_kv, hd))
            self.v[i].append((L["attn_v"] @ h).reshape(c.n_kv, hd))
            K, V = np.stack(self.k[i]), np.stack(self.v[i])  # [S, n_kv, hd]
            att = np.empty((c.n_head, hd))
            for hh in range(c.n_head):
                s = K[:, hh // rep] @ q[hh] / np.sqrt(hd)
                w = np.exp(s - s.max())
                att[hh] = (w / w.sum()) @ V[:, hh // rep]
            x = x + L["attn_output"] @ att.reshape(-1)
            h = self._norm(x, L["ffn_norm"])
            g = L["ffn_gate"] @ h
            x = x + L["ffn_down"] @ (g / (1 + np.exp(-g)) * (L["ffn_up"] @ h))
        self.pos += 1
        return self.out @ self._norm(x, self.out_norm)
