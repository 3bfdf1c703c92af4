"""What one fused step (step_kernel.py) moves, stage by stage, computed from the model's
weights and the step's shape: work items, weight bytes, and the other bytes (activations,
KV). Dividing by a stage's device time gives its achieved bandwidth, which says whether it
is bound by memory (near HBM's ~4.8 TB/s on an H200) or by latency and barriers.

Pure host code (no CUDA): the GPU check prints it beside its timings, and docs/BENCHMARKS.md
quotes it for SmolLM2-135M. Weight bytes are exactly those the kernel reads: every row
group's bytes, scales and offsets, padding rows included, once per token tile (tiles re-read
them: from L2 when they fit there).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..quant import FMT_F32, LANES

TOKEN_TILE = 4  # step_kernel.TOKEN_TILES[-1]: tokens per item when a step has more than one


@dataclass
class Stage:
    name: str
    items: int
    weight_bytes: int
    other_bytes: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.other_bytes


def _layer_bytes(wt) -> int:
    """Bytes of one layer of a quant.Weight as uploaded (qs, d, m; or the float32 rows)."""
    if wt.fmt == FMT_F32:
        return int(wt.w[0].nbytes)
    return int(wt.qs[0].nbytes + wt.d[0].nbytes + wt.m[0].nbytes)


def _groups(wt) -> int:
    return -(-wt.w.shape[1] // LANES) if wt.fmt == FMT_F32 else int(wt.d.shape[1])


def plan(cfg, w, tokens: int, context: int, prefill: bool = False) -> list[Stage]:
    """The stages of a decode step of `tokens` sequences of one token each, each at `context`
    positions; or, prefill=True, of one sequence's prompt of `tokens` tokens after `context`
    earlier positions (its last token alone wants logits)."""
    T = tokens
    tiles = -(-T // (1 if T == 1 else TOKEN_TILE))
    f32 = 4
    D, hd = cfg.d_model, cfg.head_dim
    q_w, kv_w = cfg.n_head * hd, cfg.n_kv * hd
    if prefill:  # token t attends to context + t + 1 positions
        positions = T * context + T * (T + 1) // 2
    else:
        positions = T * (context + 1)
    st = [Stage("embed", 1, 0, T * D * f32)]
    for layer in range(cfg.n_layer):
        # A reads x and writes Q, K, V; B reads Q and the K and V of every attended position
        # and writes att; C reads att and x, writes x; D reads x, writes h; E reads h and x
        st += [Stage(f"L{layer}.A qkv+rope+kv", _groups(w.wqkv) * tiles, _layer_bytes(w.wqkv) * tiles,
                     T * (D + q_w + 2 * kv_w) * f32),
               Stage(f"L{layer}.B attention", T * cfg.n_kv, 0,
                     positions * 2 * kv_w * f32 + 2 * T * q_w * f32),
               Stage(f"L{layer}.C o-proj+residual", _groups(w.wo) * tiles, _layer_bytes(w.wo) * tiles,
                     T * (q_w + 2 * D) * f32),
               Stage(f"L{layer}.D gate|up+swiglu", (_groups(w.wgu) // 2) * tiles,
                     _layer_bytes(w.wgu) * tiles, T * (D + cfg.n_ff) * f32),
               Stage(f"L{layer}.E down+residual", _groups(w.wdown) * tiles, _layer_bytes(w.wdown) * tiles,
                     T * (cfg.n_ff + 2 * D) * f32)]
    rows = 1 if prefill else T
    head_tiles = -(-rows // (1 if rows == 1 else TOKEN_TILE))
    st.append(Stage("lm head+argmax", _groups(w.output) * head_tiles,
                    _layer_bytes(w.output) * head_tiles, rows * (D + cfg.vocab) * f32))
    return st


def summary(stages: list[Stage], n_layer: int) -> list[tuple[str, int, int, int]]:
    """Per kind of stage (layers summed): (name, items per layer or step, weight MB x1e6,
    other bytes); for a table."""
    out: dict[str, list[int]] = {}
    for s in stages:
        key = s.name.split(".", 1)[-1] if s.name.startswith("L") else s.name
        agg = out.setdefault(key, [s.items, 0, 0])
        agg[1] += s.weight_bytes
        agg[2] += s.other_bytes
    return [(k, v[0], v[1], v[2]) for k, v in out.items()]
