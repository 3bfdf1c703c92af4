"""What one fused step (step_kernel.py) moves, stage by stage, and how long a simple model of
the GPU says each stage takes: work items, weight bytes, other bytes (activations, KV), and a
*predicted* time. The prediction is a model, never a measurement: the GPU check prints it
beside the stage times it measures, and the difference is what the model gets wrong.

Pure host code (no CUDA): CI computes it without a GPU, tests/test_step_plan.py holds the
kernel to it, and docs/BENCHMARKS.md quotes it. Weight bytes are exactly those the kernel
reads: every row group's bytes, scales and offsets (at the kernel's scale type,
step_geometry.scale_type), padding rows included, once per token
tile (tiles re-read them: from L2 when they fit there). Work items follow the kernel's
geometry (step_geometry.py), so a proposed geometry can be priced before it is written.

The model of a stage (``predict``), with the constants of ``Device``:
  * a block keeps ``bytes_in_flight`` weight bytes requested at a time, so by Little's law
    one multiprocessor streams min(bytes_in_flight / DRAM latency, SM_BW_CAP);
  * a stage's items are dealt to the blocks (one per multiprocessor) in waves; each wave
    costs one DRAM latency (nothing of the next item is requested before it starts) plus an
    item's bytes at that rate; a stage never takes less than one latency plus its bytes at
    the device's HBM bandwidth;
  * a stage whose K is split (step_geometry.k_splits_for) pays, after its last wave, two
    L2 round trips more: the counter's atomic, then the other slices' partial sums, read by
    the row group's last item before it finishes the rows (L2_LATENCY_S);
  * a matmul stage after a grid barrier: each thread warmed L2 with its first 16 bytes
    before the barrier (step_geometry's prefetch_bytes), so the first wave costs an L2
    round trip where that was all its bytes, else a wave's time for the rest;
  * grid barriers are a separate line: their count times BARRIER_S;
  * so are the stage boundaries a layer crosses on ready counters instead of a barrier
    (step_geometry.barrier_after): each costs two L2 round trips, the writer's count
    reaching L2 and the reader's poll that sees it; the stages' own work does not overlap
    in the model, though on the device the reader's other items can proceed meanwhile;
  * activations (a few KB an item, read by every item) are taken to come from L2, free.
What it leaves out: instruction issue, shared-memory reductions, L2 hits of token tiles,
clock throttling. Print it:  python -m zerolayer.gpu.cuda.step_plan  (see ``main``).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import numpy as np

from ..quant import FMT_F32, LANES, Weight
from .step_geometry import KERNEL, Geometry, k_splits_for, scale_type

TOKEN_TILE = 4  # step_kernel.TOKEN_TILES[-1]: tokens per item when a step has more than one
BLOCK_TOKENS = 64  # KV positions per block (gpu/ops/attention.BLOCK_TOKENS)

# Assumptions of the model (not datasheet figures): to be replaced by the GPU check's own.
# A global load that misses L2 returns after ~500-700 ns on Hopper in public pointer-chase
# microbenchmarks (e.g. Chips and Cheese, "Nvidia's H100: Funny L2, and Tons of
# Bandwidth", 2023, on an H100 PCIe); 600 ns here.
DRAM_LATENCY_S = 600e-9
# A grid-wide barrier with every block polling one counter: published measurements of
# cooperative-groups grid.sync() put it at a few microseconds (Zhang et al., "A Study of
# Single and Multi-device Synchronization Methods in Nvidia GPUs", IPDPS 2020, on V100);
# 2 us here.
BARRIER_S = 2e-6
# An L2 hit (an atomic, or a load of what another SM just wrote) returns after a few hundred
# core cycles: an %smid-resolved probe of an L40's L2 finds 222-339 cycles (arXiv 2606.22588);
# 300 ns here, about 500 cycles at Hopper's ~1.7 GHz boost, to be on the slow side.
L2_LATENCY_S = 300e-9


@dataclass(frozen=True)
class Device:
    name: str
    sms: int            # multiprocessors: one block of the fused kernel each
    hbm_bytes_s: float  # datasheet HBM bandwidth
    # What one multiprocessor can pull, however many bytes it has in flight: an assumption
    # of about twice its share of HBM (an SM's load path is wider than its share).
    sm_bw_cap: float = field(default=0.0)
    dram_latency_s: float = DRAM_LATENCY_S
    barrier_s: float = BARRIER_S
    l2_latency_s: float = L2_LATENCY_S

    def sm_bytes_s(self, in_flight: int) -> float:
        cap = self.sm_bw_cap or 2 * self.hbm_bytes_s / self.sms
        return min(in_flight / self.dram_latency_s, cap)


# NVIDIA datasheets: H100 SXM5, 132 SMs (H100 whitepaper), HBM3 3.35 TB/s; H200 (SXM),
# 132 SMs (the same GH100 configuration), HBM3e 4.8 TB/s.
H100_SXM = Device("H100 SXM", 132, 3.35e12)
H200 = Device("H200", 132, 4.8e12)
DEVICES = {"h100": H100_SXM, "h200": H200}


@dataclass
class Stage:
    name: str
    items: int
    weight_bytes: int
    other_bytes: int
    kind: str = "matmul"   # "embed", "matmul" or "attention": what streams the bytes
    k_splits: int = 1      # slices of K per row group (matmul stages)
    split_bytes: int = 0   # split-K partial sums, written and read back (from L2)
    after_barrier: bool = False  # a grid barrier before it (its first items' weights warmed)

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.other_bytes + self.split_bytes


def _layer_bytes(wt: Weight, scale_bytes: int) -> int:
    """Bytes of one layer of a quant.Weight as the kernel reads it (qs, and d, m at
    scale_bytes each; or the float32 rows)."""
    if wt.fmt == FMT_F32:
        return int(wt.w[0].nbytes)
    return int(wt.qs[0].nbytes + (wt.d[0].size + wt.m[0].size) * scale_bytes)


def _rows(wt: Weight) -> int:
    """Output rows of a quant.Weight, padding rows of its last group included."""
    return int(wt.w.shape[1]) if wt.fmt == FMT_F32 else int(wt.d.shape[1]) * LANES


def _k_blocks(wt: Weight) -> int:
    """K blocks of 32 elements of a quant.Weight: what split-K slices (float32 rows too)."""
    return -(-int(wt.w.shape[2]) // 32) if wt.fmt == FMT_F32 else int(wt.d.shape[2])


def _matmul(name: str, wt: Weight, rows: int, tiles: int, other: int, g: Geometry,
            sms: int, scale_bytes: int, passes: int = 1) -> Stage:
    """A matmul stage as the kernel cuts it: (token tile, row group) items, K split by
    step_geometry.k_splits_for toward g.matmul_items_per_sm items per SM; the split
    partial sums (rows per pass and the sum of squares, per token) are written and read."""
    row_items = -(-rows // g.rows_per_item) * tiles
    S = k_splits_for(row_items, _k_blocks(wt), g.matmul_items_per_sm * sms, g.k_splits)
    tokens = tiles * (1 if tiles == 1 else TOKEN_TILE)
    partials = 0 if S == 1 else 2 * row_items * S * (passes * g.rows_per_item + 1) * tokens * 4
    return Stage(name, row_items * S, _layer_bytes(wt, scale_bytes) * tiles, other, k_splits=S,
                 split_bytes=partials)


def attention_splits(T: int, n_kv: int, sms: int, context: int, g: Geometry = KERNEL) -> int:
    """The kernel's flash-decoding splits (step_launch.FusedStep.splits): about
    g.attention_items_per_sm items per block, no more than the KV blocks of the context."""
    want = max(1, -(-g.attention_items_per_sm * sms // (T * n_kv)))
    return max(1, min(want, -(-(context + 1) // BLOCK_TOKENS)))


def plan(cfg, w, tokens: int, context: int, prefill: bool = False, sms: int = H100_SXM.sms,
         geometry: Geometry = KERNEL) -> list[Stage]:
    """The stages of a decode step of `tokens` sequences of one token each, each at `context`
    positions; or, prefill=True, of one sequence's prompt of `tokens` tokens after `context`
    earlier positions (its last token alone wants logits). sms sizes the attention splits."""
    T = tokens
    g = geometry
    tiles = -(-T // (1 if T == 1 else TOKEN_TILE))
    f32 = 4
    sb = np.dtype(scale_type([w.wqkv, w.wo, w.wgu, w.wdown, w.emb, w.output])).itemsize
    D, hd = cfg.d_model, cfg.head_dim
    q_w, kv_w = cfg.n_head * hd, cfg.n_kv * hd
    if prefill:  # token t attends to context + t + 1 positions
        positions = T * context + T * (T + 1) // 2
    else:
        positions = T * (context + 1)
    splits = attention_splits(T, cfg.n_kv, sms, context + (T - 1 if prefill else 0), g)
    st = [Stage("embed", max(1, T * D // g.threads), 0, T * D * f32, "embed")]
    for layer in range(cfg.n_layer):
        # A reads x and writes Q, K, V; B reads Q and the K and V of every attended position
        # and writes att; C reads att and x, writes x; D reads x, writes h; E reads h and x
        st += [_matmul(f"L{layer}.A qkv+rope+kv", w.wqkv, _rows(w.wqkv), tiles,
                       T * (D + q_w + 2 * kv_w) * f32, g, sms, sb),
               Stage(f"L{layer}.B attention", T * cfg.n_kv * splits, 0,
                     positions * 2 * kv_w * f32 + 2 * T * q_w * f32, "attention"),
               _matmul(f"L{layer}.C o-proj+residual", w.wo, _rows(w.wo), tiles,
                       T * (q_w + 2 * D) * f32, g, sms, sb),
               _matmul(f"L{layer}.D gate|up+swiglu", w.wgu, _rows(w.wgu) // 2, tiles,
                       T * (D + cfg.n_ff) * f32, g, sms, sb, passes=2),
               _matmul(f"L{layer}.E down+residual", w.wdown, _rows(w.wdown), tiles,
                       T * (cfg.n_ff + 2 * D) * f32, g, sms, sb)]
    # which stages follow a grid barrier: A after the embedding or the last E, the others
    # after the stage before them, the LM head after the last E
    kinds = [s for s in st if s.name.startswith("L")]
    for i, s in enumerate(kinds):
        s.after_barrier = i == 0 or g.barrier_after[(i - 1) % g.stages_per_layer]
    rows = 1 if prefill else T
    head_tiles = -(-rows // (1 if rows == 1 else TOKEN_TILE))
    st.append(_matmul("lm head+argmax", w.output, _rows(w.output), head_tiles,
                      rows * (D + cfg.vocab) * f32, g, sms, sb))
    st[-1].after_barrier = g.barrier_after[-1]
    return st


def predict_stage(s: Stage, dev: Device, g: Geometry = KERNEL) -> float:
    """Seconds the model gives one stage (no barrier): each wave of items pays one DRAM
    latency (a block starts an item's loads only when it takes the item) and its bytes at
    the block's rate; never less than the stage's bytes at HBM bandwidth."""
    if s.kind == "embed":  # a few KB gathered by every block: one round trip
        return dev.dram_latency_s
    streamed = s.weight_bytes if s.kind == "matmul" else s.other_bytes
    in_flight = (g.bytes_in_flight if s.kind == "matmul"
                 else g.threads * 4 * g.attention_loads_in_flight)
    waves = math.ceil(s.items / dev.sms)
    per_item = streamed / max(s.items, 1)
    rate = dev.sm_bytes_s(in_flight)
    t = waves * (dev.dram_latency_s + per_item / rate)
    if s.kind == "matmul" and s.after_barrier and g.prefetch_bytes:
        # the first wave's first bytes were requested before the barrier (which lasts
        # longer than their round trip): from L2 if that was all of them, else the rest
        # streams as any wave's
        rest = per_item - g.threads * g.prefetch_bytes
        t -= (dev.dram_latency_s + per_item / rate
              - (dev.l2_latency_s if rest <= 0 else dev.dram_latency_s + rest / rate))
    t = max(t, dev.dram_latency_s + streamed / dev.hbm_bytes_s)
    return t + (2 * dev.l2_latency_s if s.k_splits > 1 else 0.0)


def counter_waits(n_layer: int, g: Geometry = KERNEL) -> int:
    """Stage boundaries of one step crossed on ready counters rather than a grid barrier."""
    return (g.stages_per_layer - g.grid_syncs_per_layer) * n_layer


def grid_syncs(n_layer: int, g: Geometry = KERNEL) -> int:
    """Grid-wide barriers of one step launched whole: after the embedding, the layers' own,
    none after the LM head (the last layer's last one leads into it)."""
    return 1 + g.grid_syncs_per_layer * n_layer


@dataclass
class Prediction:
    device: Device
    stages: list[tuple[Stage, float]]  # each stage and its predicted seconds
    barriers: int
    barrier_s: float
    waits: int = 0        # stage boundaries crossed on ready counters
    wait_s: float = 0.0   # the model's cost of one

    @property
    def total_s(self) -> float:
        return (sum(t for _, t in self.stages) + self.barriers * self.barrier_s
                + self.waits * self.wait_s)


def predict(cfg, w, tokens: int, context: int, dev: Device, g: Geometry = KERNEL,
            prefill: bool = False) -> Prediction:
    stages = plan(cfg, w, tokens, context, prefill, sms=dev.sms, geometry=g)
    return Prediction(dev, [(s, predict_stage(s, dev, g)) for s in stages],
                      grid_syncs(cfg.n_layer, g), dev.barrier_s,
                      counter_waits(cfg.n_layer, g), 2 * dev.l2_latency_s)


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


def by_kind(p: Prediction) -> list[tuple[str, int, int, float]]:
    """Per kind of stage (layers summed): (name, items per layer or step, bytes, seconds)."""
    out: dict[str, list] = {}
    for s, t in p.stages:
        key = s.name.split(".", 1)[-1] if s.name.startswith("L") else s.name
        agg = out.setdefault(key, [s.items, 0, 0.0])
        agg[1] += s.bytes
        agg[2] += t
    return [(k, v[0], v[1], v[2]) for k, v in out.items()]


def table(p: Prediction, title: str) -> str:
    """A markdown table of a prediction, labelled as the model it is."""
    lines = [f"{title}: predicted by gpu/cuda/step_plan.py on {p.device.name} "
             f"({p.device.sms} SMs, HBM {p.device.hbm_bytes_s / 1e12:.2f} TB/s): a model, not a "
             "measurement", "",
             "| stage | items (per layer) | items per SM | MB (all layers) | predicted µs |",
             "|---|---|---|---|---|"]
    for name, items, nbytes, t in by_kind(p):
        lines.append(f"| {name} | {items} | {items / p.device.sms:.2f} | {nbytes / 1e6:.1f} "
                     f"| {t * 1e6:.1f} |")
    lines.append(f"| grid barriers | {p.barriers} | | | {p.barriers * p.barrier_s * 1e6:.1f} |")
    lines.append(f"| ready-counter waits | {p.waits} | | | {p.waits * p.wait_s * 1e6:.1f} |")
    lines.append(f"| **step** | | | | **{p.total_s * 1e6:.1f}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the model's prediction for a model's shapes, from a GGUF file or from the
    synthetic SmolLM2-135M / Llama-3.2-1B Q4_1 shapes (tests/tiny_gguf.py)."""
    from .step_shapes import GEOMETRIES, SHAPES, synthetic
    ap = argparse.ArgumentParser(prog="python -m zerolayer.gpu.cuda.step_plan",
                                 description=main.__doc__)
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="smollm2-135m")
    ap.add_argument("--device", choices=sorted(DEVICES), default="h100")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--geometry", choices=sorted(GEOMETRIES), default="kernel")
    a = ap.parse_args(argv)
    cfg, w = synthetic(a.shapes)
    p = predict(cfg, w, a.batch, a.context, DEVICES[a.device], GEOMETRIES[a.geometry])
    print(table(p, f"{a.shapes}, decode batch {a.batch} at {a.context} positions, "
                   f"{a.geometry} geometry"))


if __name__ == "__main__":
    main()
