"""The float64 reference that the GPU check compares the CUDA forward pass with: gpu/reference.py's
ReferenceLlama (the one float64 forward) over weights that never were a file, the check's
synthetic arrays in the kernels' row-interleaved layout, undone here exactly
(quant.dequantize in float64) and named as in a GGUF file.

Why not the CPU model: it is JIT-compiled (on the GPU machine that cost 86 s of a 240 s
budget) and runs integer kernels, so its own rounding shows up in the comparison. RoPE is
on adjacent pairs of each head: the runtime's row order, whatever the architecture.

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


def gguf_tensors(cfg, w) -> dict[str, np.ndarray]:
    """The weights as float64 arrays under their GGUF names (what ReferenceLlama reads)."""
    c = cfg
    hd, nh, nkv = c.head_dim, c.n_head, c.n_kv
    q_rows, kv_rows = nh * hd, nkv * hd
    t = {"token_embd.weight": dense(w.emb, c.vocab),
         "output_norm.weight": np.asarray(w.out_norm, np.float64)}
    if w.output is not w.emb:
        t["output.weight"] = dense(w.output, c.vocab)
    rf = getattr(w, "rope_freqs", None)
    if rf is not None and np.size(rf):
        t["rope_freqs.weight"] = np.asarray(rf, np.float64)
    bias = getattr(w, "qkv_bias", None)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        qkv = dense(w.wqkv, q_rows + 2 * kv_rows, i)
        gu = dense(w.wgu, 2 * c.n_ff, i)
        t.update({p + "attn_norm.weight": np.asarray(w.attn_norm[i], np.float64),
                  p + "ffn_norm.weight": np.asarray(w.ffn_norm[i], np.float64),
                  p + "attn_q.weight": qkv[:q_rows], p + "attn_k.weight": qkv[q_rows:q_rows + kv_rows],
                  p + "attn_v.weight": qkv[q_rows + kv_rows:],
                  p + "attn_output.weight": dense(w.wo, c.d_model, i),
                  p + "ffn_gate.weight": gu[:c.n_ff], p + "ffn_up.weight": gu[c.n_ff:],
                  p + "ffn_down.weight": dense(w.wdown, c.d_model, i)})
        if bias is not None and np.size(bias) and bias.shape[1]:
            b = np.asarray(bias[i], np.float64)
            t.update({p + "attn_q.bias": b[:q_rows], p + "attn_k.bias": b[q_rows:q_rows + kv_rows],
                      p + "attn_v.bias": b[q_rows + kv_rows:]})
    return t


class Reference64:
    """Sequences of ReferenceLlama over one set of weights (shared, not copied)."""

    def __init__(self, cfg, w):
        self.cfg = cfg
        self.tensors = gguf_tensors(cfg, w)

    def new_sequence(self):
        from zerolayer.gpu.reference import ReferenceLlama
        return ReferenceLlama.from_tensors(self.cfg, self.tensors, neox=False)

    def step(self, inputs) -> np.ndarray:
        """inputs: [(sequence, tokens)] -> float64 logits [len(inputs), vocab], each the
        last token's after feeding them all."""
        return np.stack([[s.step(int(t)) for t in np.asarray(toks)][-1] for s, toks in inputs])
