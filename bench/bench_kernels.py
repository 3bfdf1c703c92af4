#!/usr/bin/env python
"""Where one decode token's time goes: per kernel class, against the bytes it reads and the
machine's measured read bandwidth; and llama.cpp's decode on the same files. See bench/README.md
("bench_kernels.py and synth_gguf.py").
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    LLAMA_BENCH,
    MATMUL_WARGS,
    SYNTH_DIR,
    CpuWatch,
    LlamaBenchCrash,
    activation_wargs,
    bench_lock,
    command_line,
    git_head,
    gpu_source_hash,
    log,
    machine_info,
    results_path,
    run_llama_bench,
    timed_decode,
)

SYNTH = ("tinyllama-1.1b-synth.Q4_1.gguf", "tinyllama-1.1b-synth.Q4_K_M.gguf")
THREADS = 2
# matmul class -> its weights; and its tensors in the GGUF (LM head: output, or token_embd)
MATMULS = {"qkv matmul": "wqkv", "o matmul": "wo", "gate|up matmul": "wgu",
           "down matmul": "wdown", "LM head": "output"}
FILE_TENSORS = {"qkv matmul": ("attn_q", "attn_k", "attn_v"), "o matmul": ("attn_output",),
                "gate|up matmul": ("ffn_gate", "ffn_up"), "down matmul": ("ffn_down",)}


# ---------------------------------------------------------------- read bandwidth

LANES = 8  # 64-bit words XORed side by side: one 512-bit vector, or two 256-bit ones


@njit(parallel=True, cache=True, nogil=True)
def stream_xor(a, parts, lanes):
    """XOR of a's 64-bit words in len(parts) contiguous chunks (a run of them per thread).
    Integer XOR, not a float sum: a float32 sum's adds capped it at 20-23 GB/s on the Xeon
    (this reads 30). LANES accumulators: one running XOR is a serial chain LLVM left scalar
    on Zen 4 (10 GB/s where the decode matmuls streamed 30). lanes is an argument, not the
    constant, which LLVM unrolled into scalars again (8.5 GB/s; 31 given at run time).
    len(a) is a multiple of lanes."""
    rows = a.reshape(-1, lanes)
    n = rows.shape[0]
    k = parts.shape[0]
    for c in prange(k):
        acc = np.zeros(lanes, np.uint64)
        for r in range(c * n // k, (c + 1) * n // k):
            for j in range(lanes):
                acc[j] ^= rows[r, j]
        s = np.uint64(0)
        for j in range(lanes):
            s ^= acc[j]
        parts[c] = s
    return parts[0]


class Streamer:
    """The streaming kernel on one array (written first, so no page is the shared zero page;
    one untimed pass). Also run beside each timed run: the host's memory system is shared with
    other VMs, so its bandwidth moves from minute to minute (17-33 GB/s here), and a fraction
    is only meaningful against a figure from the same minute."""

    def __init__(self, mib: int):
        import numba
        self.a = np.ones(mib * (1 << 20) // 8, np.uint64)
        self.parts = np.empty(16 * numba.get_num_threads(), np.uint64)
        stream_xor(self.a, self.parts, LANES)

    def times(self, passes: int) -> list[float]:
        ts = []
        for _ in range(passes):
            t0 = time.perf_counter()
            stream_xor(self.a, self.parts, LANES)
            ts.append(time.perf_counter() - t0)
        return ts

    def gb_s(self, passes: int = 3) -> float:
        return self.a.nbytes / statistics.median(self.times(passes)) / 1e9


class Noise:
    """Other processes' CPU share (_harness.CpuWatch): wait for quiet before a run,
    measure a run again when others took more than max_foreign of the machine."""

    def __init__(self, max_foreign: float, max_wait: float, retries: int):
        self.watch = CpuWatch(children=True)  # the reaped llama-bench runs are ours
        self.max_foreign, self.max_wait, self.retries = max_foreign, max_wait, retries

    def wait(self) -> None:
        self.watch.wait_quiet(self.max_foreign, self.max_wait)

    def run(self, fn, what: str) -> tuple:
        """fn() after a quiet wait, again (up to retries times) while others took more than
        max_foreign: (fn's result, others' share, attempts)."""
        for attempt in range(self.retries + 1):
            self.wait()
            a = self.watch.snap()
            out = fn()
            share = self.watch.foreign(a, self.watch.snap())
            if share <= self.max_foreign or attempt == self.retries:
                return out, share, attempt + 1
            log(f"  {what} disturbed ({share:.0%} of the machine taken by others); again")


def read_bandwidth(mib: int, runs: int, noise: Noise) -> dict:
    import numba
    s = Streamer(mib)
    ts, share, attempts = noise.run(lambda: s.times(runs), "bandwidth run")
    gbs = [s.a.nbytes / t / 1e9 for t in ts]
    return {"mib": mib, "threads": numba.get_num_threads(), "runs": runs,
            "gb_s": statistics.median(gbs), "min": min(gbs), "max": max(gbs),
            "foreign_share": share, "attempts": attempts}


# ---------------------------------------------------------------- bytes per kernel class


def file_bytes(path: str) -> dict:
    """Per matmul class: bytes in the GGUF, weights, and the tensor types with their counts."""
    from gguf import GGUFReader
    names = {t.name: t for t in GGUFReader(path, "r").tensors}
    groups = {cls: [t for n, t in names.items() if n.startswith("blk.") and n.endswith(".weight")
                    and n.split(".")[2] in parts] for cls, parts in FILE_TENSORS.items()}
    groups["LM head"] = [names.get("output.weight") or names["token_embd.weight"]]
    return {cls: {"bytes": int(sum(int(t.n_bytes) for t in ts)),
                  "weights": int(sum(int(t.n_elements) for t in ts)),
                  "types": dict(Counter(t.tensor_type.name for t in ts))}
            for cls, ts in groups.items()}


def fmt_name(fmt: int) -> str:
    from zerolayer.gpu import quant
    from zerolayer.gpu.ops import int8_matmul as i8
    if fmt >= i8.FMT_I8:
        kind = ("q4 nibbles", "q8 bytes", "q8 bytes (split)", "q5 nibbles+bits",
                "q6 nibbles+bits")[fmt % 8]
        scales = ("f16 d, m", "f16 d", "q4_k scales", "q6_k scales")[i8.scales_of(fmt)]
        return f"int8 path, {kind}, {scales}"
    return {quant.FMT_Q4: "float path, q4 nibbles, f32 scales", quant.FMT_Q8: "float path, bytes",
            quant.FMT_Q8_16: "float path, bytes /16", quant.FMT_F32: "f32"}[fmt]


def formats_read(w) -> str:
    """The format each layer is read in; a mixed stack names each with its layer count."""
    codes = [int(c) for c in w.layers()[:, :, 0].reshape(-1) if c >= 0]  # every segment
    if len(set(codes)) == 1:
        return fmt_name(codes[0])
    return "; ".join(f"{fmt_name(c)} ×{codes.count(c)}" for c in sorted(set(codes)))


# ---------------------------------------------------------------- per-kernel timing

def tick_seconds() -> float:
    """Seconds per time-stamp-counter tick, against perf_counter over 0.3 s."""
    from zerolayer.gpu.ops.cycle_counter import tsc_now
    tsc_now()
    c0, t0 = tsc_now(), time.perf_counter()
    time.sleep(0.3)
    c1, t1 = tsc_now(), time.perf_counter()
    return (t1 - t0) / (c1 - c0)


def forward_args(model, seq, tok: np.ndarray, depth: int) -> tuple[tuple, tuple, int]:
    """The compiled forward's arguments for token `tok` of `seq` at position `depth`: those
    before the weights (model._wargs), those after them, and the attention splits."""
    import numba

    from zerolayer.gpu.model import StepInput
    from zerolayer.gpu.model_api import step_arrays
    from zerolayer.gpu.ops.attention import BLOCK_TOKENS
    cfg, a = model.cfg, model.arena
    arr = step_arrays([StepInput(seq, tok)], cfg.vocab)
    blocks = -(-(depth + 1) // BLOCK_TOKENS)
    splits = max(1, min((4 * numba.get_num_threads()) // cfg.n_kv, blocks))
    head = (arr.tokens, arr.tok_seq, arr.tok_pos, arr.logit_rows, arr.tables, a.k_pool, a.v_pool)
    tail = (model.cos, model.sin, cfg.n_head, cfg.n_kv, cfg.head_dim, cfg.n_ff,
            np.float32(cfg.eps), splits, np.empty((1, cfg.vocab), np.float32))
    return head, tail, splits


def kernel_times(model, path: str, depths: list[int], runs: int, tokens: int, spt: float,
                 noise: Noise, streamer: Streamer) -> dict:
    from zerolayer.gpu.ops.int8_matmul import read_nbytes
    fbytes = file_bytes(path)
    ws = {cls: model._wargs[MATMUL_WARGS[name]] for cls, name in MATMULS.items()}
    rng = np.random.default_rng(0)
    log(f"kernels: {path}")
    res = {"model": path, "config": {k: getattr(model.cfg, k) for k in
                                     ("n_layer", "d_model", "n_ff", "n_head", "n_kv", "head_dim",
                                      "vocab")},
           "weights": {cls: {"bytes": read_nbytes(w), "format": formats_read(w),
                             "file": fbytes[cls]} for cls, w in ws.items()}, "depths": {}}
    for depth in depths:
        d = res["depths"][str(depth)] = depth_times(model, depth, rng, res["weights"], runs,
                                                    tokens, spt, noise, streamer)
        log(f"  depth {depth}: forward {d['forward_s'] * 1e3:.2f} ms, classes sum "
            f"{d['sum_of_medians_s'] * 1e3:.2f} ms")
    return res


def depth_times(model, depth: int, rng, weights: dict, runs: int, tokens: int, spt: float,
                noise: Noise, streamer: Streamer) -> dict:
    """One token at position `depth`, `runs` x `tokens` times (its KV slot rewritten): per
    kernel class, the plain forward and model.step."""
    from zerolayer.gpu.model import KERNEL_CLASSES as CLASSES
    from zerolayer.gpu.model import StepInput, forward, forward_timed
    cfg, wargs = model.cfg, model._wargs
    seq = model.new_sequence()
    for done in range(0, depth, 512):  # real KV to read (an untouched page reads as zeros)
        model.step([StepInput(seq, rng.integers(0, cfg.vocab, min(512, depth - done))
                              .astype(np.int32), logits=False)])
    tok = np.array([int(rng.integers(0, cfg.vocab))], np.int32)
    head, tail, splits = forward_args(model, seq, tok, depth)
    acc = np.zeros(len(CLASSES), np.int64)
    for _ in range(3):  # warm: compiled (or loaded from the JIT cache), caches filled
        forward(*head, *wargs, *tail)
        forward_timed(*head, *wargs, *tail, acc)

    def one_run():
        run = ([], [], [], [])  # the timed forward, per class, the plain forward, model.step
        for _ in range(tokens):
            acc[:] = 0
            run[0].append(forward_timed(*head, *wargs, *tail, acc) * spt)
            run[1].append(acc * spt)
            t0 = time.perf_counter()
            forward(*head, *wargs, *tail)
            run[2].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            model.step([StepInput(seq, tok)])
            run[3].append(time.perf_counter() - t0)
            seq.length = depth  # the same position again
        return run, streamer.gb_s()
    totals, per_token, fwd, step, shares, bws = [], [], [], [], [], []
    for _ in range(runs):
        (run, bw), share, _ = noise.run(one_run, "run")
        shares.append(share)
        bws.append(bw)
        for dst, src in zip((totals, per_token, fwd, step), run):
            dst += src
    seq.release()
    pt = np.array(per_token)
    kv_bytes = 2 * cfg.n_layer * cfg.n_kv * cfg.head_dim * (depth + 1) * model.arena.k_pool.itemsize
    rows = {}
    for i, cls in enumerate(CLASSES):
        rows[cls] = {"s": float(np.median(pt[:, i])), "min": float(pt[:, i].min())}
        if cls in MATMULS:
            rows[cls]["bytes"] = weights[cls]["bytes"]
        elif cls == "attention":
            rows[cls]["bytes"] = kv_bytes
    return {"position": depth, "splits": splits, "samples": len(fwd), "classes": rows,
            "sum_of_medians_s": float(sum(r["s"] for r in rows.values())),
            "timed_forward_s": statistics.median(totals),
            "forward_s": statistics.median(fwd), "forward_min_s": min(fwd),
            "step_s": statistics.median(step), "foreign_share_per_run": shares,
            "bw_gb_s": statistics.median(bws), "bw_gb_s_per_run": bws,
            "bytes": int(sum(r.get("bytes", 0) for r in rows.values()))}


def activation_ab(model, path: str, runs: int, tokens: int, spt: float, noise: Noise,
                  streamer: Streamer) -> dict:
    """The selected activations against int16 (int16: against int8) on the same model,
    interleaved run by run, one token at position 0. Both read the same weight bytes
    (gpu/ops/int8_matmul.py); int8 does half the multiply-adds a byte, so a faster int8 run
    means the matmuls do not only wait on memory."""
    from zerolayer.gpu.model import KERNEL_CLASSES as CLASSES
    from zerolayer.gpu.model import forward_timed
    from zerolayer.gpu.ops import cpu_features, int8_matmul
    log(f"activation modes A/B: {path}")
    if not cpu_features.ISA:
        return {}
    now = cpu_features.ACTIVATIONS
    then = "int8" if now == "int16" else "int16"
    variants = {now: model._wargs, then: activation_wargs(model, then)}
    seq = model.new_sequence()
    head, tail, _ = forward_args(model, seq, np.array([7], np.int32), 0)
    mm = [CLASSES.index(c) for c in MATMULS]
    acc = np.zeros(len(CLASSES), np.int64)
    out: dict = {k: {"forward_s": [], "matmul_s": [], "bytes": sum(
        int8_matmul.read_nbytes(v[MATMUL_WARGS[n]]) for n in MATMULS.values())} for k, v in variants.items()}
    bws, shares = [], []
    for v in variants.values():  # warm
        forward_timed(*head, *v, *tail, acc)
    for r in range(runs):
        noise.wait()
        snap = noise.watch.snap()
        for k in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            for _ in range(tokens):
                acc[:] = 0
                out[k]["forward_s"].append(forward_timed(*head, *variants[k], *tail, acc) * spt)
                out[k]["matmul_s"].append(float(acc[mm].sum()) * spt)
        bws.append(streamer.gb_s())
        shares.append(noise.watch.foreign(snap, noise.watch.snap()))
    seq.release()
    for v in out.values():
        v["forward_s"], v["matmul_s"] = statistics.median(v["forward_s"]), statistics.median(v["matmul_s"])
    return {"variants": out, "bw_gb_s": statistics.median(bws), "foreign_share_per_run": shares}


# ---------------------------------------------------------------- llama-bench vs our decode

def our_decode(model, steps: int, watch) -> dict:
    """Greedy decode after a 1-token prompt; others' share over the prompt and the steps."""
    a = watch.snap()
    r = timed_decode(model, [[1]], steps)
    return {"tok_s": r["value"], "foreign_share": watch.foreign(a, watch.snap())}


def lb_cmd(lb: str, path: str, p: int, n: int, repack: int, reps: int) -> list[str]:
    return [lb, "-m", path, "-t", str(THREADS), "-p", str(p), "-n", str(n), "-fa", "0,1",
            "--repack", str(repack), "-r", str(reps), "-o", "jsonl"]


def serves_prompts(path: str, lb: str, noise: Noise) -> dict[str, bool]:
    """Per --repack mode, whether llama-bench completes a 16-token prompt on this file: a
    mode that can't is no serving peer, however fast it decodes: speed is compared with
    the fastest mode that serves prompts too."""
    out = {}
    for repack in (0, 1):
        noise.wait()
        try:
            run_llama_bench(lb_cmd(lb, path, 16, 0, repack, 1), noise.watch)
            out[f"repack {repack}"] = True
        except LlamaBenchCrash:
            out[f"repack {repack}"] = False
    log(f"  llama-bench serves a 16-token prompt on {Path(path).name}: {out}")
    return out


def peer(models: dict, paths: list[str], rounds: int, reps: int, lb: str, noise: Noise) -> dict:
    """Per file, rounds of one llama-bench tg32 run per --repack mode (both -fa modes in each)
    and `reps` of our 32-step decodes, the side that goes first alternating."""
    out = {}
    for path in paths:
        model = models[path]
        our_decode(model, 4, noise.watch)  # warm
        rec: dict = {"ours": [], "llama_bench": {}, "crashed": [], "commands": [],
                     "serves_prompts": serves_prompts(path, lb, noise)}
        for r in range(rounds):
            for side in (("theirs", "ours") if r % 2 == 0 else ("ours", "theirs")):
                if side == "ours":
                    noise.wait()
                    s = [our_decode(model, 32, noise.watch) for _ in range(reps)]
                    rec["ours"].append({"tok_s": statistics.median(x["tok_s"] for x in s),
                                        "samples": s})
                    continue
                for repack in (0, 1):
                    cmd = lb_cmd(lb, path, 0, 32, repack, reps)
                    if r == 0:
                        rec["commands"].append(shlex.join(cmd))
                    noise.wait()
                    try:
                        rows, _ = run_llama_bench(cmd, noise.watch)
                    except LlamaBenchCrash as e:
                        rec["crashed"].append(f"repack {repack}: {str(e)[:200]}")
                        continue
                    for row in rows:
                        rec["llama_bench"].setdefault(f"fa {row.get('flash_attn')}, repack {repack}",
                                                      []).append(
                            {"tok_s": row["value"], "foreign_share": row["foreign_share"],
                             "build": row.get("build_commit")})
            log(f"  round {r + 1}/{rounds}: ours {rec['ours'][-1]['tok_s']:.1f} tok/s; "
                + ", ".join(f"{k} {v[-1]['tok_s']:.1f}" for k, v in rec["llama_bench"].items()))
        out[path] = rec
    return out


# ---------------------------------------------------------------- output

def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def render(r: dict) -> str:
    m, bw = r["machine"], r["bandwidth"]
    dram = bw["dram"]["gb_s"]
    lines = [f"Host: {m['cpu_model']}, {m['cpus']} CPUs ({m.get('hypervisor') or 'bare metal'}), "
             f"L3 {m['l3_cache']}, flags {', '.join(f for f in m['simd'] if f not in ('fma', 'f16c'))}; "
             f"kernels: {r['cpu_kernels']}; "
             f"{r['date']}, git {r['git']}; load average {r['loadavg_before']} before, "
             f"{r['loadavg_after']} after.", "",
             f"Read bandwidth (streaming XOR, {bw['dram']['threads']} threads): "
             f"{bw['dram']['mib']} MiB array {dram:.1f} GB/s (min–max "
             f"{bw['dram']['min']:.1f}–{bw['dram']['max']:.1f}); {bw['l3']['mib']} MiB array "
             f"{bw['l3']['gb_s']:.1f} GB/s; 1 thread, {bw['dram_1t']['mib']} MiB: "
             f"{bw['dram_1t']['gb_s']:.1f} GB/s; 2 threads again at the end: "
             f"{bw['dram_after']['gb_s']:.1f} GB/s.", ""]
    for km in r["kernels"]:
        c = km["config"]
        ds = list(km["depths"].values())
        shares = [x for d in ds for x in d.get("foreign_share_per_run", [])]
        noise = (f"; other processes took {100 * statistics.median(shares):.0f}% of the machine "
                 f"(median over runs, max {100 * max(shares):.0f}%)") if shares else ""
        # "of BW": against the streaming kernel run right after each timed run (the host's
        # bandwidth moves)
        bws = [d["bw_gb_s"] for d in ds]
        lines += [f"**{Path(km['model']).name}** ({c['n_layer']} layers, d {c['d_model']}, n_ff "
                  f"{c['n_ff']}, {c['n_head']}/{c['n_kv']} heads, vocab {c['vocab']}){noise}; read "
                  "bandwidth beside the runs (\"of BW\"): "
                  + ", ".join(f"pos {d['position']} {b:.1f} GB/s" for d, b in zip(ds, bws)), "",
                  "| kernel class | " + " | ".join(f"pos {d['position']}: ms | GB/s | of BW" for d in ds)
                  + " | MB read | MB in file | format read (file types) |",
                  "|---|" + "---|---|---|" * len(ds) + "---|---|---|"]
        for cls in ds[0]["classes"]:
            cells = []
            for d, bwd in zip(ds, bws):
                row = d["classes"][cls]
                gbs = row["bytes"] / row["s"] / 1e9 if row.get("bytes") else None
                cells.append(f"{row['s'] * 1e3:.3f} | "
                             + (f"{gbs:.1f} | {_pct(gbs / bwd)}" if gbs else "– | –"))
            w = km["weights"].get(cls)
            if w:
                types = ", ".join(f"{k}×{v}" for k, v in w["file"]["types"].items())
                extra = f"{w['bytes'] / 1e6:.1f} | {w['file']['bytes'] / 1e6:.1f} | {w['format']} ({types})"
            elif cls == "attention":
                extra = " / ".join(f"{d['classes'][cls]['bytes'] / 1e6:.2f}" for d in ds) + \
                    " (f16 KV) | – | –"
            else:
                extra = "– | – | –"
            lines.append(f"| {cls} | " + " | ".join(cells) + f" | {extra} |")
        fw = [(d, d["bytes"] / d["forward_s"] / 1e9, bwd) for d, bwd in zip(ds, bws)]
        lines += ["| **whole forward** (plain, compiled) | " + " | ".join(
                      f"**{d['forward_s'] * 1e3:.2f}** | {g:.1f} | **{_pct(g / b)}**" for d, g, b in fw)
                  + f" | {ds[-1]['bytes'] / 1e6:.1f} (at pos {ds[-1]['position']}) | – | – |"]
        for label, k in (("sum of the classes' medians", "sum_of_medians_s"),
                         ("model.step (Python side included)", "step_s")):
            lines.append(f"| {label} | " + " | ".join(f"{d[k] * 1e3:.2f} | | " for d in ds) + " | | |")
        lines.append("")
    if r.get("activations_ab"):
        lines += ["two activation modes, interleaved run by run (position 0; the same "
                  "weight bytes):", "",
                  "| model | activations | whole forward ms | matmuls ms | matmul GB/s | of BW |",
                  "|---|---|---|---|---|---|"]
        for path, ab in r["activations_ab"].items():
            for k, v in ab["variants"].items():
                gbs = v["bytes"] / v["matmul_s"] / 1e9
                lines.append(f"| {Path(path).name} | {k} | {v['forward_s'] * 1e3:.2f} | "
                             f"{v['matmul_s'] * 1e3:.2f} | {gbs:.1f} | {_pct(gbs / ab['bw_gb_s'])} "
                             f"(of {ab['bw_gb_s']:.1f}) |")
        lines.append("")
    if r.get("peer"):
        lines += render_peer(r)
    return "\n".join(lines)


def render_peer(r: dict) -> list[str]:
    lines = ["| model file | ours tok/s | llama-bench tg32, best mode that serves prompts "
             "| ratio | best mode that crashes on prompts | ratio | "
             "llama-bench, every mode (tok/s) |", "|---|---|---|---|---|---|---|"]
    lim = r["noise"]["max_foreign"]
    dropped = 0

    def quiet_median(xs: list[dict]) -> tuple[float, bool]:
        """Median over the samples others left alone; over all of them, flagged, if none was."""
        nonlocal dropped
        ok = [x for x in xs if x["foreign_share"] <= lim]
        dropped += len(xs) - len(ok) if ok else 0
        return statistics.median(x["tok_s"] for x in (ok or xs)), not ok
    for path, p in r["peer"].items():
        ours, _ = quiet_median([x for rnd in p["ours"] for x in rnd["samples"]])
        modes, shown = {}, {}
        for k, v in p["llama_bench"].items():
            modes[k], disturbed = quiet_median(v)
            shown[k] = k + (", every sample disturbed" if disturbed else "")
        serving = p["serves_prompts"]
        cells = []
        for serves in (True, False):
            sub = {k: v for k, v in modes.items() if serving.get(k.split(", ")[-1], False) == serves}
            bk = max(sub, key=sub.get) if sub else None
            cells.append(f"{sub[bk]:.1f} ({shown[bk]}) | {ours / sub[bk]:.2f}×" if bk else "– | –")
        allm = "; ".join(f"{shown[k]}: {v:.1f}" for k, v in modes.items())
        lines.append(f"| {Path(path).name} | {ours:.1f} | {' | '.join(cells)} | {allm} |")
        if p["crashed"]:
            lines.append(f"| | crashed: {'; '.join(p['crashed'])} | | | | | |")
    reps = r["peer_reps"]
    return lines + ["", f"Medians over every sample of every round (ours: {reps} decodes a round; "
                    f"llama-bench: one row a round per mode, the median of its -r {reps}), leaving "
                    f"out {dropped} in which other processes took more than {lim:.0%} of the "
                    "machine.", ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="GGUF (repeatable; default: the bundled "
                    "model and the synthetic Q4_1 and Q4_K_M files that exist)")
    ap.add_argument("--depths", default="0,1000", help="positions of the timed token (default 0,1000)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=8, help="tokens per run (default 8)")
    ap.add_argument("--bw-mib", type=int, default=2048)
    ap.add_argument("--bw-runs", type=int, default=9)
    ap.add_argument("--peer", action="store_true", help="also llama-bench tg32 vs our decode")
    ap.add_argument("--activations-ab", action="store_true",
                    help="also the selected activations vs int16 (int16: vs int8), interleaved (position 0)")
    ap.add_argument("--peer-rounds", type=int, default=3)
    ap.add_argument("--peer-reps", type=int, default=3)
    ap.add_argument("--llama-bench", default=str(LLAMA_BENCH))
    ap.add_argument("--max-foreign", type=float, default=0.10,
                    help="share of the machine others may take during a run before it is "
                    "measured again (default 0.10)")
    ap.add_argument("--max-wait", type=float, default=60.0,
                    help="seconds to wait for a quiet machine before each run (default 60)")
    ap.add_argument("--retries", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--render", default=None, help="print the table of an earlier run's JSON")
    args = ap.parse_args()
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return 0
    if args.peer and not os.access(args.llama_bench, os.X_OK):
        log(f"missing {args.llama_bench}: build it with bench/setup_llamacpp.sh")
        return 2
    from zerolayer.gpu.gguf_loader import default_model_path
    from zerolayer.gpu.model import LlamaModel, set_threads
    from zerolayer.gpu.ops import cpu_features
    paths = args.model or [default_model_path()] + [str(SYNTH_DIR / f) for f in SYNTH
                                                    if (SYNTH_DIR / f).exists()]
    depths = [int(d) for d in args.depths.split(",")]
    command = command_line()
    r = {"command": command, "date": f"{_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC",
         "machine": machine_info(), "git": git_head(), "gpu_source": gpu_source_hash(),
         "cpu_kernels": cpu_features.describe(),
         "noise": {"max_foreign": args.max_foreign, "max_wait_s": args.max_wait,
                   "retries": args.retries}}
    noise = Noise(args.max_foreign, args.max_wait, args.retries)
    with bench_lock(command) as waited:
        r["lock_waited_s"] = waited
        r["loadavg_before"] = " ".join(open("/proc/loadavg").read().split()[:3])
        spt = tick_seconds()
        set_threads(THREADS)
        models = {p: LlamaModel.load(p, max_seq_len=max(depths) + 64) for p in paths}
        log("read bandwidth")
        set_threads(1)
        bw1 = read_bandwidth(args.bw_mib, args.bw_runs, noise)
        set_threads(THREADS)
        r["bandwidth"] = {"dram": read_bandwidth(args.bw_mib, args.bw_runs, noise),
                          "l3": read_bandwidth(128, args.bw_runs * 4, noise), "dram_1t": bw1}
        log(f"  {r['bandwidth']['dram']['gb_s']:.1f} GB/s ({args.bw_mib} MiB), "
            f"{r['bandwidth']['l3']['gb_s']:.1f} GB/s (128 MiB), 1 thread {bw1['gb_s']:.1f}")
        streamer = Streamer(args.bw_mib)
        r["kernels"] = [kernel_times(models[p], p, depths, args.runs, args.tokens, spt, noise,
                                     streamer) for p in paths]
        if args.activations_ab:
            r["activations_ab"] = {p: activation_ab(models[p], p, args.runs, args.tokens, spt, noise,
                                                    streamer) for p in paths}
        r["bandwidth"]["dram_after"] = read_bandwidth(args.bw_mib, args.bw_runs, noise)
        if args.peer:
            log("llama-bench tg32 vs our decode")
            r["peer_reps"] = args.peer_reps
            r["peer"] = peer(models, [p for p in paths if "synth" in p] or paths,
                             args.peer_rounds, args.peer_reps, args.llama_bench, noise)
        r["tick_s"] = [spt, tick_seconds()]
        r["loadavg_after"] = " ".join(open("/proc/loadavg").read().split()[:3])
    out = results_path(args.out, "kernels")
    out.write_text(json.dumps(r, indent=1, default=str))
    log(f"wrote {out}")
    print(render(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
