"""A float64 numpy Llama forward pass: the golden reference for the compiled runtime.

It shares nothing with the kernels but the file: weights are dequantized by the `gguf`
package itself (not by our repacking), attention is recomputed over every position, and all
arithmetic is float64. Slow, plain, and easy to check by eye.

Architectures as llama.cpp runs them: Q/K/V biases when the file has them; RoPE on adjacent
pairs (`llama`) or on the halves of each head (`qwen2`, ggml's neox mode) of the file's own
Q and K (the runtime reorders rows instead; this does not), with the angle
pos * freq_scale * base^(-2i/hd) / rope_freqs[i] and cos, sin x attn_factor.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from gguf import GGUFReader
from gguf.quants import dequantize

from .gguf_loader import ModelConfig

F64: TypeAlias = npt.NDArray[np.float64]


class ReferenceLlama:
    def __init__(self, reader: GGUFReader, cfg: ModelConfig):
        t = {x.name: x for x in reader.tensors}

        def dense(name: str) -> F64:
            x = t[name]
            return dequantize(x.data, x.tensor_type).astype(np.float64).reshape(
                [int(s) for s in reversed(x.shape)])

        self._load(cfg, dense, t.__contains__, neox=cfg.arch == "qwen2")

    @classmethod
    def from_tensors(cls, cfg: ModelConfig, tensors: Mapping[str, npt.ArrayLike], *,
                     neox: bool) -> ReferenceLlama:
        """The same forward over tensors named as in a GGUF file (`token_embd.weight`,
        `blk.0.attn_q.weight`, ...) that never were one: the GPU check's synthetic weights,
        undone from the kernels' layout (tests/gpu_ref64.py). neox: RoPE on the halves of
        each head (a qwen2 file's own Q and K) rather than on adjacent pairs (llama, and any
        weights already in the runtime's row order). Arrays are shared, not copied."""
        self = cls.__new__(cls)
        self._load(cfg, lambda name: np.asarray(tensors[name], np.float64),
                   tensors.__contains__, neox=neox)
        return self

    def _load(self, cfg: ModelConfig, dense: Callable[[str], F64], has: Callable[[str], bool],
              *, neox: bool) -> None:
        self.cfg = cfg
        self.bias: dict[tuple[int, str], F64] = {}  # (layer, "attn_q") -> bias vector, where the file has one
        for i in range(cfg.n_layer):
            for k in ("attn_q", "attn_k", "attn_v"):
                if has(f"blk.{i}.{k}.bias"):
                    self.bias[(i, k)] = dense(f"blk.{i}.{k}.bias")
        self.rope_freqs = dense("rope_freqs.weight") if has("rope_freqs.weight") else None
        self.neox = neox
        self.emb = dense("token_embd.weight")
        self.out = dense("output.weight") if has("output.weight") else self.emb
        self.out_norm = dense("output_norm.weight")
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            self.layers.append({k: dense(p + k + ".weight") for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
        self.k: list[list[F64]] = [[] for _ in range(cfg.n_layer)]
        self.v: list[list[F64]] = [[] for _ in range(cfg.n_layer)]
        self.pos = 0

    def _norm(self, x: F64, w: F64) -> F64:
        return x / np.sqrt((x * x).mean() + self.cfg.eps) * w

    def _rope(self, x: F64, n_heads: int, pos: int) -> F64:
        c = self.cfg
        hd = c.head_dim
        inv = c.rope_base ** (-np.arange(0, hd, 2) / hd)
        if self.rope_freqs is not None:
            inv = inv / self.rope_freqs
        ang = pos * c.rope_freq_scale * inv
        co, si = c.rope_attn_factor * np.cos(ang), c.rope_attn_factor * np.sin(ang)
        if self.neox:  # pairs (i, i + hd/2)
            x = x.reshape(n_heads, 2, hd // 2)
            a, b = x[:, 0], x[:, 1]
            return np.concatenate([a * co - b * si, a * si + b * co], -1).reshape(-1)
        x = x.reshape(n_heads, hd // 2, 2)
        return np.stack([x[..., 0] * co - x[..., 1] * si, x[..., 0] * si + x[..., 1] * co], -1).reshape(-1)

    def _proj(self, i: int, L: dict[str, F64], k: str, h: F64) -> F64:
        y = L[k] @ h
        b = self.bias.get((i, k))
        return y if b is None else y + b

    def step(self, token: int) -> F64:
        """Feed one token at the next position; return its logits (float64)."""
        c = self.cfg
        hd, rep = c.head_dim, c.n_head // c.n_kv
        x = self.emb[token].copy()
        for i, L in enumerate(self.layers):
            h = self._norm(x, L["attn_norm"])
            q = self._rope(self._proj(i, L, "attn_q", h), c.n_head, self.pos).reshape(c.n_head, hd)
            self.k[i].append(self._rope(self._proj(i, L, "attn_k", h), c.n_kv, self.pos).reshape(c.n_kv, hd))
            self.v[i].append(self._proj(i, L, "attn_v", h).reshape(c.n_kv, hd))
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

    def logits_all(self, tokens: Sequence[int] | npt.NDArray[np.int32],
                   rows: slice[int | None, int | None, int | None] = slice(None)) -> F64:
        """Every position's logits [T, vocab] (float64), or those of `rows`, for `tokens`
        from position 0 of a fresh sequence: the same arithmetic as `step`, but each layer
        as one matrix product over all positions and causal attention over the whole block,
        so thousands of positions take seconds (bench/accuracy.py) instead of minutes."""
        c = self.cfg
        hd, rep = c.head_dim, c.n_head // c.n_kv
        tokens = np.asarray(tokens)
        T = len(tokens)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        x = self.emb[tokens]
        for i, L in enumerate(self.layers):
            h = self._norm_rows(x, L["attn_norm"])
            q = self._rope_rows(self._proj_rows(i, L, "attn_q", h), c.n_head)
            k = self._rope_rows(self._proj_rows(i, L, "attn_k", h), c.n_kv)
            v = self._proj_rows(i, L, "attn_v", h).reshape(T, c.n_kv, hd)
            att = np.empty((T, c.n_head, hd))
            for hh in range(c.n_head):
                s = q[:, hh] @ k[:, hh // rep].T / np.sqrt(hd) + mask
                w = np.exp(s - s.max(axis=1, keepdims=True))
                att[:, hh] = (w / w.sum(axis=1, keepdims=True)) @ v[:, hh // rep]
            x = x + att.reshape(T, -1) @ L["attn_output"].T
            h = self._norm_rows(x, L["ffn_norm"])
            g = h @ L["ffn_gate"].T
            x = x + (g / (1 + np.exp(-g)) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
        return self._norm_rows(x[rows], self.out_norm) @ self.out.T

    def _norm_rows(self, x: F64, w: F64) -> F64:
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.cfg.eps) * w

    def _proj_rows(self, i: int, L: dict[str, F64], k: str, h: F64) -> F64:
        y = h @ L[k].T
        b = self.bias.get((i, k))
        return y if b is None else y + b

    def _rope_rows(self, x: F64, n_heads: int) -> F64:
        """[T, n_heads * hd] -> [T, n_heads, hd], each row rotated at its own position."""
        return np.stack([self._rope(r, n_heads, p) for p, r in enumerate(x)]).reshape(
            len(x), n_heads, self.cfg.head_dim)
