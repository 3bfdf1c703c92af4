"""The one-shot GPU check: every CUDA kernel at SmolLM2-135M's real shapes against its CPU twin,
the whole forward pass against the CPU model, and decode/prefill timings. One results file,
a short table printed last. Run it through scripts/gpu-check.sh on a GPU machine.

    python bench/gpu_bench.py [--out DIR] [--budget-s 420]
    ZEROLAYER_GPU_BACKEND=sim python bench/gpu_bench.py --sim   # logic check, tiny shapes

The model is *synthetic*: random weights in SmolLM2-135M's shapes and formats (Q4_1 layers,
a tied Q8_0 embedding / LM head), built directly in the kernels' layout. Speed depends on the
shapes and formats, not the values, and the GPU-vs-CPU comparison needs no real weights; the
real GGUF (98 MB) is larger than what can be carried to the GPU machine. The golden test
against llama.cpp stays with the CPU suite (tests/test_golden_llamacpp.py).

What is timed, each after a warm-up (kernel compilation happens there):
  * device memory: where it came from (CuPy's pool, gpu/cuda/cupy_memory.py), weights and KV;
  * decode: ``CudaModel.step_tokens`` per token at batch 1 and at batch 16 (16 sequences), as
    the engine runs it (graph replay unless graphs turned themselves off, sampling on the
    device, token ids back), greedy and with top-k/top-p at batch 1, median over the steps;
  * prefill: one step of a 512-token prompt, tokens/s;
  * launches: an empty kernel's launch cost, and the launches per decode step;
  * per op at decode shapes: wall time per call (launch included, which is the point);
  * decode steps replayed as CUDA graphs vs the launch-per-op path (same logits required);
  * the device sampler at the real vocabulary: distributions vs the float64 reference, tokens
    vs the CPU twin, cost per step vs copying logits rows to the host and sampling there;
  * the mapped UMEM (an anonymous mmap registered with the driver): token ids read and written
    by kernels in place;
  * TTFT from packet to first response frame through a real zerolayerd on the GPU backend
    (synthetic GGUF in the model's shapes, the SDK over loopback UDP).
Under the simulator the numbers mean nothing; --sim only proves that the script runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

SMOL = dict(n_layer=30, d=576, ff=1536, n_head=9, n_kv=3, hd=64, vocab=49152, ctx=2048)
TINY = dict(n_layer=2, d=64, ff=96, n_head=4, n_kv=2, hd=16, vocab=200, ctx=256)


class Run:
    def __init__(self, budget_s: float):
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.results: dict = {"sections": {}}

    def section(self, name: str, fn, *args):
        """Run one section; an error or an exhausted time budget is recorded, never fatal."""
        left = self.budget_s - (time.monotonic() - self.t0)
        if left <= 0:
            self.results["sections"][name] = {"skipped": "time budget spent"}
            print(f"[{name}] skipped: time budget spent", flush=True)
            return None
        t = time.monotonic()
        print(f"[{name}] ...", flush=True)
        try:
            out = fn(*args)
            extra = out if isinstance(out, dict) else {}
            self.results["sections"][name] = {"ok": True, "s": round(time.monotonic() - t, 1), **extra}
        except Exception:
            out = None
            self.results["sections"][name] = {"ok": False, "error": traceback.format_exc()[-4000:]}
            print(traceback.format_exc(), flush=True)
        print(f"[{name}] done in {time.monotonic() - t:.1f} s", flush=True)
        return out


def us_per_call(fn, n: int) -> float:
    """Mean wall time of fn() in µs over n calls after one warm-up, device work included."""
    from numba import cuda
    fn()
    cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def rel(gpu, cpu) -> float:
    gpu, cpu = np.asarray(gpu, np.float64), np.asarray(cpu, np.float64)
    if gpu.shape != cpu.shape or not np.isfinite(gpu).all():
        return float("inf")
    return float(np.abs(gpu - cpu).max() / max(np.abs(cpu).max(), 1e-30))


def rand_weight(rng, fmt: int, L: int, rows: int, cols: int):
    """A random quant.Weight in the kernels' layout, scaled so x @ W.T keeps unit variance."""
    from zerolayer.gpu import quant
    G, nb = -(-rows // quant.LANES), cols // quant.QK
    if fmt == quant.FMT_F32:
        w = (rng.standard_normal((L, rows, cols)) / math.sqrt(cols)).astype(np.float32)
        return quant.Weight(fmt, np.zeros((L, 0, 0, 0, 0), np.uint8), np.zeros((L, 0, 0, 0), np.float32),
                            np.zeros((L, 0, 0, 0), np.float32), w)
    inner, half, std = (16, 7.5, 4.6) if fmt == quant.FMT_Q4 else (32, 127.5, 74.0)
    qs = rng.integers(0, 256, (L, G, nb, inner, quant.LANES), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, (L, G, nb, quant.LANES)) / (std * math.sqrt(cols))).astype(np.float32)
    m = (-half * d).astype(np.float32)
    return quant.Weight(fmt, qs, d, m, np.zeros((L, 0, 0), np.float32))


def synthetic_model(c: dict, seed: int = 0):
    """ModelConfig + ModelWeights in SmolLM2's formats (Q4_1 layers, tied Q8_0 embedding)."""
    from zerolayer.gpu import quant
    from zerolayer.gpu.gguf_loader import ModelConfig, ModelWeights
    rng = np.random.default_rng(seed)
    L, D, F = c["n_layer"], c["d"], c["ff"]
    qkv = (c["n_head"] + 2 * c["n_kv"]) * c["hd"]
    cfg = ModelConfig(name="synthetic", n_layer=L, d_model=D, n_ff=F, n_head=c["n_head"],
                      n_kv=c["n_kv"], head_dim=c["hd"], rope_base=100000.0, eps=1e-5,
                      vocab=c["vocab"], context_length=c["ctx"])
    emb = rand_weight(rng, quant.FMT_Q8, 1, c["vocab"], D)
    norm = lambda *s: (1 + 0.1 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    w = ModelWeights(emb=emb, wqkv=rand_weight(rng, quant.FMT_Q4, L, qkv, D),
                     wo=rand_weight(rng, quant.FMT_Q4, L, D, c["n_head"] * c["hd"]),
                     wgu=rand_weight(rng, quant.FMT_Q4, L, 2 * F, D),
                     wdown=rand_weight(rng, quant.FMT_Q4, L, D, F),
                     attn_norm=norm(L, D), ffn_norm=norm(L, D), out_norm=norm(D), output=emb)
    return cfg, w


# ------------------------------------------------------------------------------ sections

def env_info(sim: bool) -> dict:
    import numba
    from numba import cuda
    out = {"python": platform.python_version(), "numba": numba.__version__, "numpy": np.__version__,
           "sim": sim, "host": platform.node()}
    try:
        import importlib.metadata as md
        out["numba_cuda"] = md.version("numba-cuda")
    except Exception:
        pass
    from zerolayer.gpu.cuda import _cuda_shim
    out["device_memory"] = _cuda_shim.MEMORY
    if not sim:
        dev = cuda.get_current_device()
        out.update(gpu=dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
                   cc=list(dev.compute_capability), sms=dev.MULTIPROCESSOR_COUNT)
        try:
            out["driver"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
            out["runtime"] = ".".join(map(str, cuda.runtime.get_version()))
        except Exception:
            pass
    return out


def kernel_checks(c: dict, sim: bool) -> dict:
    """Each kernel at the model's shapes against its CPU twin, on device arrays."""
    from numba import cuda

    from zerolayer.gpu import quant
    from zerolayer.gpu.cuda import attention as cu_att, embedding as cu_emb, matmul as cu_mm
    from zerolayer.gpu.cuda import rmsnorm as cu_rms, rope as cu_rope, swiglu as cu_sw
    from zerolayer.gpu.ops import attention as att
    from zerolayer.gpu.ops.embedding import embed
    from zerolayer.gpu.ops.matmul import matmul
    from zerolayer.gpu.ops.rmsnorm import rmsnorm
    from zerolayer.gpu.ops.rope import rope, rope_tables
    from zerolayer.gpu.ops.swiglu import swiglu

    rng = np.random.default_rng(1)
    f32 = np.float32
    D, F, nh, nkv, hd, V = c["d"], c["ff"], c["n_head"], c["n_kv"], c["hd"], c["vocab"]
    Ts = (1, 16) if sim else (1, 16, 128)
    checks = {}

    def record(name, err, tol):
        checks[name] = {"err": err, "tol": tol, "ok": bool(err <= tol)}
        print(f"  {name:34s} err {err:.2e}  {'OK' if err <= tol else 'NOT OK'}", flush=True)

    def dev(a):  # unused arrays of a weight's format (zero-size) stay on the host as None
        return cuda.to_device(np.ascontiguousarray(a)) if a.size else None

    emb = rand_weight(rng, quant.FMT_Q8, 1, V, D).layer(0)
    demb = (emb[0],) + tuple(dev(a) for a in emb[1:])
    for T in Ts:
        x = (rng.standard_normal((T, D)) * 3).astype(f32)
        w = rng.standard_normal(D).astype(f32)
        y0, y1 = np.empty_like(x), dev(np.zeros_like(x))
        rmsnorm(x, w, f32(1e-5), y0)
        cu_rms.rmsnorm(dev(x), dev(w), f32(1e-5), y1)
        record(f"rmsnorm T={T}", rel(y1.copy_to_host(), y0), 1e-5)

        gu = (rng.standard_normal((T, 2 * F)) * 4).astype(f32)
        h0, h1 = np.empty((T, F), f32), dev(np.zeros((T, F), f32))
        swiglu(gu, h0)
        cu_sw.swiglu(dev(gu), h1)
        record(f"swiglu T={T}", rel(h1.copy_to_host(), h0), 1e-5)

        cos, sin = rope_tables(c["ctx"], hd, 100000.0)
        pos = rng.integers(0, c["ctx"], T).astype(np.int32)
        q = rng.standard_normal((T, (nh + 2 * nkv) * hd)).astype(f32)
        q0, q1 = q.copy(), dev(q)
        rope(q0, 0, pos, cos, sin, nh + nkv, hd)
        cu_rope.rope(q1, 0, dev(pos), dev(cos), dev(sin), nh + nkv, hd)
        record(f"rope T={T}", rel(q1.copy_to_host(), q0), 1e-5)

        toks = rng.integers(0, V, T).astype(np.int32)
        e0, e1 = np.empty((T, D), f32), dev(np.zeros((T, D), f32))
        embed(*emb, toks, e0)
        cu_emb.embed(*demb, dev(toks), e1)
        record(f"embed q8 T={T}", rel(e1.copy_to_host(), e0), 1e-6)

    shapes = {"qkv": (quant.FMT_Q4, (nh + 2 * nkv) * hd, D), "gate_up": (quant.FMT_Q4, 2 * F, D),
              "down": (quant.FMT_Q4, D, F), "lm_head": (quant.FMT_Q8, V, D),
              "f32": (quant.FMT_F32, D, nh * hd)}
    for name, (fmt, R, K) in shapes.items():
        wt = rand_weight(rng, fmt, 1, R, K).layer(0)
        dwt = (wt[0],) + tuple(dev(a) for a in wt[1:])
        for T in Ts:
            x = rng.standard_normal((T, K)).astype(f32)
            y0, y1 = np.empty((T, R), f32), dev(np.zeros((T, R), f32))
            matmul(*wt, x, y0)
            cu_mm.matmul(*dwt, dev(x), y1)
            record(f"matmul {name} {R}x{K} T={T}", rel(y1.copy_to_host(), y0), 1e-5)

    # attention: three sequences (long, medium, fresh) decoding together, then a prefill chunk
    BT = att.BLOCK_TOKENS
    lens = (130, 40, 1) if sim else (1000, 300, 1)
    nblk = sum(-(-n // BT) for n in lens) + 4
    k_pool = rng.standard_normal((nblk, 1, nkv, hd, BT)).astype(f32)
    v_pool = rng.standard_normal((nblk, 1, nkv, BT, hd)).astype(f32)
    perm = rng.permutation(nblk).astype(np.int32)
    width = max(-(-n // BT) for n in lens)
    tables = np.zeros((len(lens), width), np.int32)
    i = 0
    for s, n in enumerate(lens):
        for b in range(-(-n // BT)):
            tables[s, b] = perm[i]
            i += 1
    steps = {"decode x3": (np.arange(3, dtype=np.int32), np.array([n - 1 for n in lens], np.int32)),
             "prefill 64": (np.zeros(64, np.int32), np.arange(lens[0] - 64, lens[0], dtype=np.int32))}
    for name, (tok_seq, tok_pos) in steps.items():
        T = len(tok_seq)
        qkv = rng.standard_normal((T, (nh + 2 * nkv) * hd)).astype(f32)
        kp0, vp0 = k_pool.copy(), v_pool.copy()
        att.kv_write(qkv, kp0, vp0, 0, tok_seq, tok_pos, tables, nh, nkv, hd)
        kp1, vp1 = dev(k_pool), dev(v_pool)
        dseq, dpos, dtab, dqkv = dev(tok_seq), dev(tok_pos), dev(tables), dev(qkv)
        cu_att.kv_write(dqkv, kp1, vp1, 0, dseq, dpos, dtab, nh, nkv, hd)
        record(f"kv_write {name}", max(rel(kp1.copy_to_host(), kp0), rel(vp1.copy_to_host(), vp0)), 0.0)
        for splits in (1, 8):
            o0, o1 = np.empty((T, nh * hd), f32), dev(np.zeros((T, nh * hd), f32))
            att.attention(qkv, kp0, vp0, 0, tok_seq, tok_pos, tables, nh, nkv, hd, splits, o0)
            cu_att.attention(dqkv, kp1, vp1, 0, dseq, dpos, dtab, nh, nkv, hd, splits, o1)
            record(f"attention {name} splits={splits}", rel(o1.copy_to_host(), o0), 1e-5)
    n_bad = sum(not v["ok"] for v in checks.values())
    return {"checks": checks, "passed": len(checks) - n_bad, "failed": n_bad}


def build_models(c: dict):
    from zerolayer.gpu.cuda.forward import CudaModel
    from zerolayer.gpu.model import LlamaModel
    cfg, w = synthetic_model(c)
    # the graph section holds two sets of 16 sequences of up to 129 positions (3 blocks each)
    kw = dict(max_seq_len=c["ctx"], kv_blocks=2 * 16 * 3 + 16)
    return LlamaModel(cfg, w, **kw), CudaModel(LlamaModel(cfg, w, **kw))


def memory_info(models, sim: bool) -> dict:
    """Where the model's device memory came from: with the CuPy plugin (gpu/cuda/cupy_memory),
    CuPy's pool must hold at least the weights."""
    from zerolayer.gpu.cuda import _cuda_shim
    cpu, gpu = models
    w = cpu.w
    weight_bytes = sum(int(a.nbytes) for wt in (w.emb, w.wqkv, w.wo, w.wgu, w.wdown)
                       for a in (wt.qs, wt.d, wt.m, wt.w))
    kv_bytes = int(gpu.fwd.k_pool.nbytes + gpu.fwd.v_pool.nbytes)
    out = {"device_memory": _cuda_shim.MEMORY, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes}
    pool = None
    if not sim:  # the plugin module needs the real numba.cuda
        from zerolayer.gpu.cuda import cupy_memory
        pool = cupy_memory.pool_bytes()
    if pool is not None:
        out.update(pool_used_bytes=pool[0], pool_held_bytes=pool[1])
        if _cuda_shim.MEMORY.startswith("cupy") and pool[0] < weight_bytes + kv_bytes:
            raise AssertionError(f"CuPy's pool holds {pool[0]} bytes, less than the weights and KV "
                                 f"pools ({weight_bytes + kv_bytes})")
    print(f"  device memory: {out['device_memory']}; weights {weight_bytes / 1e6:.1f} MB, "
          f"KV {kv_bytes / 1e6:.1f} MB, pool {out.get('pool_used_bytes', 0) / 1e6:.1f} MB", flush=True)
    return out


def forward_check(models, c: dict, sim: bool) -> dict:
    """The whole forward pass, GPU against the CPU model: a prefill of two prompts, then
    decode steps of both sequences (their KV written on the GPU by the earlier steps)."""
    from zerolayer.gpu.model import StepInput
    cpu, gpu = models
    rng = np.random.default_rng(2)
    seqs = {m: [m.new_sequence(), m.new_sequence()] for m in (cpu, gpu)}
    steps = [[rng.integers(0, c["vocab"], 24 if sim else 100), rng.integers(0, c["vocab"], 7)]]
    steps += [[rng.integers(0, c["vocab"], 1), rng.integers(0, c["vocab"], 1)] for _ in range(3)]
    errs, same_argmax = [], True
    for toks in steps:
        out = [m.step([StepInput(s, t) for s, t in zip(seqs[m], toks)]) for m in (cpu, gpu)]
        errs.append(rel(out[1], out[0]))
        same_argmax &= bool((out[1].argmax(1) == out[0].argmax(1)).all())
    for m in (cpu, gpu):
        for s in seqs[m]:
            s.release()
    tol = 1e-3  # float32 over 30 layers, two summation orders
    err = max(errs)
    print(f"  forward: max rel err {err:.2e} (tol {tol:g}), same argmax: {same_argmax}", flush=True)
    return {"err": err, "tol": tol, "ok": bool(err <= tol), "same_argmax": same_argmax,
            "per_step_err": errs}


def timings(models, c: dict, sim: bool) -> dict:
    from numba import cuda

    from zerolayer.gpu.cuda import forward as fwd_mod
    from zerolayer.gpu.model import StepInput
    _, gpu = models
    rng = np.random.default_rng(3)
    n_dec = 2 if sim else 64
    prompt = 16 if sim else 128
    out = {}

    def decode(batch: int, draw=(0.0, 0, 1.0)) -> dict:
        """The engine's decode step: step_tokens (graph replay unless graphs are off, sampling
        on the device, token ids back), each sequence feeding back its own token."""
        seqs = [gpu.new_sequence() for _ in range(batch)]
        draws = [(*draw, 0.5)] * batch
        toks = gpu.step_tokens([StepInput(s, rng.integers(0, c["vocab"], prompt)) for s in seqs], draws)
        toks = gpu.step_tokens([StepInput(s, toks[j:j + 1]) for j, s in enumerate(seqs)], draws)  # warm-up
        cuda.synchronize()
        ts = []
        for _ in range(n_dec):
            draws = [(*draw, float(u)) for u in rng.random(batch)]
            t = time.perf_counter()
            toks = gpu.step_tokens([StepInput(s, toks[j:j + 1]) for j, s in enumerate(seqs)], draws)
            ts.append(time.perf_counter() - t)  # token ids are on the host: synchronous
        for s in seqs:
            s.release()
        med = float(np.median(ts))
        return {"batch": batch, "steps": n_dec, "sampling": list(draw), "step_us_median": med * 1e6,
                "step_us_p90": float(np.percentile(ts, 90)) * 1e6,
                "us_per_token": med * 1e6 / batch, "tok_s": batch / med}

    out["decode_b1"] = decode(1)
    out["decode_b16"] = decode(2 if sim else 16)
    out["b16_over_b1"] = out["decode_b16"]["tok_s"] / out["decode_b1"]["tok_s"]
    out["decode_b1_sampled"] = decode(1, (0.8, 40, 0.9))
    out["graphs"] = gpu.graphs

    n_pre = 32 if sim else 512
    s = gpu.new_sequence()
    gpu.step([StepInput(s, rng.integers(0, c["vocab"], n_pre))])  # warm-up at this size
    s.release()
    s = gpu.new_sequence()
    t = time.perf_counter()
    gpu.step([StepInput(s, rng.integers(0, c["vocab"], n_pre))])
    dt = time.perf_counter() - t
    s.release()
    out["prefill"] = {"tokens": n_pre, "s": dt, "tok_s": n_pre / dt}

    @cuda.jit
    def _empty(x):
        pass

    x = cuda.device_array(1, np.float32)
    _empty[1, 32](x)
    cuda.synchronize()
    n = 10 if sim else 2000
    t = time.perf_counter()
    for _ in range(n):
        _empty[1, 32](x)
    cuda.synchronize()
    out["empty_launch_us"] = (time.perf_counter() - t) / n * 1e6
    out["launches_per_step"] = 4 + 13 * c["n_layer"]
    out["launch_floor_us_per_step"] = out["empty_launch_us"] * out["launches_per_step"]
    out["kernels_per_step_note"] = (f"{out['launches_per_step']} launches per step "
                                    f"({fwd_mod.__name__}) + 1 sampling kernel, one host->device "
                                    "copy of the inputs, token ids back; a graph replay when "
                                    f"graphs are on (now: {gpu.graphs})")
    print(f"  graphs {gpu.graphs}; decode b1 {out['decode_b1']['us_per_token']:.0f} us/token "
          f"(sampled {out['decode_b1_sampled']['us_per_token']:.0f}), "
          f"b16 {out['decode_b16']['tok_s']:.0f} tok/s, prefill {out['prefill']['tok_s']:.0f} tok/s, "
          f"empty launch {out['empty_launch_us']:.1f} us", flush=True)
    return out


def graph_timings(models, c: dict, sim: bool) -> dict:
    """Decode steps as CUDA graph replays (gpu/cuda/graph.py) against the launch-per-op path,
    on two sets of sequences with the same prompts and tokens: the logits must agree, and the
    per-step times say whether graphs pay (issue 5: "choose by measuring")."""
    if sim:
        return {"note": "CUDA graphs need a real device; nothing to do under the simulator"}
    from numba import cuda

    from zerolayer.gpu.model import StepInput
    _, gpu = models
    rng = np.random.default_rng(6)
    n_dec = 64
    out = {}
    for batch in (1, 16):
        prompts = [rng.integers(0, c["vocab"], 64) for _ in range(batch)]
        sets = {}
        for mode in (False, True):
            gpu.use_graphs = False
            seqs = [gpu.new_sequence() for _ in range(batch)]
            gpu.step([StepInput(s, p) for s, p in zip(seqs, prompts)])
            sets[mode] = seqs
        toks = [rng.integers(0, c["vocab"], batch) for _ in range(n_dec + 1)]
        times, first = {False: [], True: []}, {}
        for i, tk in enumerate(toks):
            for mode in (False, True):
                gpu.use_graphs = mode
                t = time.perf_counter()
                lg = gpu.step([StepInput(s, tk[j:j + 1]) for j, s in enumerate(sets[mode])])
                dt = time.perf_counter() - t
                if mode and not gpu.use_graphs:
                    raise AssertionError(f"CUDA graphs turned themselves off: {gpu.graphs}")
                if i == 1:
                    first[mode] = lg  # a replay (step 0 captured and checked the graph)
                if i > 1:
                    times[mode].append(dt)
        for seqs in sets.values():
            for s in seqs:
                s.release()
        err = rel(first[True], first[False])
        launch, graph = float(np.median(times[False])), float(np.median(times[True]))
        out[f"b{batch}"] = {"launch_step_us": launch * 1e6, "graph_step_us": graph * 1e6,
                            "speedup": launch / graph, "rel_err": err}
        print(f"  b{batch}: launch path {launch * 1e6:.0f} us/step, graph {graph * 1e6:.0f} us/step "
              f"({launch / graph:.2f}x), rel err {err:.1e}", flush=True)
    gpu.use_graphs = True  # the default again, for the sections after this one
    cuda.synchronize()
    if max(v["rel_err"] for v in out.values()) > 1e-4:
        raise AssertionError(f"graph replay disagrees with the launch path: {out}")
    return out


def op_timings(c: dict, sim: bool) -> dict:
    """Wall time per call of each op at batch-1 decode shapes (launch included)."""
    from numba import cuda

    from zerolayer.gpu import quant
    from zerolayer.gpu.cuda import matmul as cu_mm, rmsnorm as cu_rms
    rng = np.random.default_rng(4)
    D, F, nh, nkv, hd, V = c["d"], c["ff"], c["n_head"], c["n_kv"], c["hd"], c["vocab"]
    n = 3 if sim else 300
    out = {}

    def timeit(fn) -> float:
        return us_per_call(fn, n)

    for name, (fmt, R, K) in {"qkv": (quant.FMT_Q4, (nh + 2 * nkv) * hd, D),
                              "gate_up": (quant.FMT_Q4, 2 * F, D), "down": (quant.FMT_Q4, D, F),
                              "lm_head": (quant.FMT_Q8, V, D)}.items():
        wt = rand_weight(rng, fmt, 1, R, K).layer(0)
        dwt = (wt[0],) + tuple(cuda.to_device(np.ascontiguousarray(a)) if a.size else None
                               for a in wt[1:])
        x = cuda.to_device(rng.standard_normal((1, K)).astype(np.float32))
        y = cuda.device_array((1, R), np.float32)
        us = timeit(lambda: cu_mm.matmul(*dwt, x, y))
        nbytes = sum(a.nbytes for a in wt[1:4])
        out[f"matmul_{name}"] = {"us": us, "weight_bytes": nbytes, "GB_s": nbytes / us / 1e3}
    x = cuda.to_device(rng.standard_normal((1, D)).astype(np.float32))
    w = cuda.to_device(np.ones(D, np.float32))
    y = cuda.device_array((1, D), np.float32)
    out["rmsnorm"] = {"us": timeit(lambda: cu_rms.rmsnorm(x, w, np.float32(1e-5), y))}
    return out


def mapped_ring(c: dict, sim: bool) -> dict:
    """The UMEM path of issue 5 on the real driver: an anonymous mmap (as daemon/xsk_ring.Umem
    makes) registered as mapped memory; token ids gathered from odd offsets by a kernel and
    written back, and what a gather of 64 ids from host frames costs."""
    import mmap

    from numba import cuda

    from zerolayer.gpu.cuda import mapped_ring as mr
    rng = np.random.default_rng(5)
    if sim:
        host = cuda.mapped_array(1 << 16, dtype=np.uint8)
    else:
        mm = mmap.mmap(-1, 1 << 16, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        host = np.frombuffer(mm, np.uint8)
    ring = mr.MappedHostBuffer(host)
    ids = rng.integers(0, c["vocab"], 64)
    offs = (4096 * 3 + 42 + 4 * np.arange(64)).astype(np.int64)  # a frame's payload: unaligned
    host[offs[0]:offs[0] + 256] = np.frombuffer(ids.astype("<u4").tobytes(), np.uint8)
    got = cuda.device_array(64, np.int32)
    d_offs = cuda.to_device(offs)
    mr.gather_token_ids(ring.device, d_offs, got)
    ok_in = bool((got.copy_to_host() == ids).all())
    back = (4096 * 7 + 43 + 4 * np.arange(64)).astype(np.int64)
    mr.write_token_ids(got, ring.device, cuda.to_device(back))
    cuda.synchronize()
    ok_out = bool((np.frombuffer(bytes(host[back[0]:back[0] + 256]), "<u4") == ids).all())
    gather_us = us_per_call(lambda: mr.gather_token_ids(ring.device, d_offs, got), 3 if sim else 500)
    if not (ok_in and ok_out):
        raise AssertionError(f"mapped ring: ids in {ok_in}, ids out {ok_out}")
    print(f"  mapped UMEM ok; gather of 64 ids from host frames {gather_us:.1f} us", flush=True)
    return {"ids_in_ok": ok_in, "ids_out_ok": ok_out, "gather_64_us": gather_us}


def sampling_check(c: dict, sim: bool) -> dict:
    """The device sampler (gpu/cuda/sampling.py) at the real vocabulary size: kept
    distributions against the float64 reference and drawn tokens against the CPU twin for the
    same u, then per-step cost at batch 1 and 16: the sampling kernel + ids back, vs logits
    rows copied to the host and sampled there (what step() + the CPU sampler would cost)."""
    from numba import cuda

    from zerolayer.gpu.cuda import sampling as smp
    from zerolayer.gpu.ops.sampling import sample, sample_probs_ref
    rng = np.random.default_rng(8)
    V = c["vocab"]
    cfgs = [(0.0, 0, 1.0), (0.8, 40, 1.0), (0.8, 0, 0.9), (1.0, 40, 0.9), (0.7, 0, 1.0), (1.2, 200, 0.5)]
    logits = (rng.standard_normal((len(cfgs), V)) * 2.5).astype(np.float32)
    draws = [(*cf, float(np.float32(rng.random()))) for cf in cfgs]
    out_ids = cuda.device_array(len(cfgs), np.int32)
    probs = cuda.device_array((len(cfgs), V), np.float32)
    d_logits = cuda.to_device(logits)
    smp.sample_rows(d_logits, cuda.to_device(smp.pack_params(draws)), out_ids, probs)
    ids, pr = out_ids.copy_to_host(), probs.copy_to_host()
    err, same = 0.0, 0
    for r, (t, k, p, u) in enumerate(draws):
        if t > 0:
            err = max(err, float(np.abs(pr[r] - sample_probs_ref(logits[r], t, k, p)).max()))
        same += int(ids[r]) == sample(logits[r], t, k, p, u)
    n = 3 if sim else 300
    out = {"prob_err": err, "same_token_as_cpu": same, "rows": len(cfgs)}
    for batch in (1, 16):
        lg = cuda.to_device(np.tile(logits[1], (batch, 1)))
        params = cuda.to_device(smp.pack_params([(0.8, 40, 0.9, 0.5)] * batch))
        o = cuda.device_array(batch, np.int32)
        host_rows = lg.copy_to_host()
        out[f"b{batch}"] = {
            "device_us": us_per_call(lambda: (smp.sample_rows(lg, params, o), o.copy_to_host()), n),
            "device_greedy_us": us_per_call(lambda: (smp.argmax_rows(lg, o), o.copy_to_host()), n),
            "copy_logits_us": us_per_call(lambda: lg.copy_to_host(), n),
            "cpu_sample_us": us_per_call(lambda: [sample(row, 0.8, 40, 0.9, 0.5) for row in host_rows],
                                         max(3, n // 10))}
    print(f"  sampling: prob err {err:.1e}, {same}/{len(cfgs)} tokens as the CPU twin; b1 device "
          f"{out['b1']['device_us']:.1f} us vs logits copy {out['b1']['copy_logits_us']:.1f} + CPU "
          f"{out['b1']['cpu_sample_us']:.1f} us", flush=True)
    if err > 1e-5 or same < len(cfgs):
        raise AssertionError(f"device sampler disagrees: prob err {err:.2g}, {same}/{len(cfgs)} tokens")
    return out


def daemon_ttft(c: dict, sim: bool) -> dict:
    """TTFT from packet to first response frame: a real zerolayerd subprocess on this machine's
    backend (the GPU; the simulator with --sim) serving a synthetic GGUF in the model's shapes
    and formats (Q4_1 layers, tied Q8_0 embedding, a byte-level vocabulary of the same size),
    and the project's SDK over UDP on loopback. A request is 32 random token ids, greedy,
    2 tokens; TTFT = just before the INVOKE is sent -> the first TOKEN frame's text."""
    import secrets
    import subprocess
    import tempfile
    import threading

    from gguf import GGMLQuantizationType as QT
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tiny_gguf import write_tiny_llama

    from zerolayer.client import Client
    tmp = Path(tempfile.mkdtemp(prefix="zl-gpu-ttft-"))
    model = tmp / "synthetic.gguf"
    layers = {k: QT.Q4_1 for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                   "ffn_up", "ffn_down")}
    write_tiny_llama(str(model), config=c, override=layers, tokenizer=True, tied=True)
    secret = secrets.token_bytes(32)
    keys = tmp / "keys"
    keys.write_text(f"1 {secret.hex()}\n")
    keys.chmod(0o600)
    env = dict(os.environ, ZEROLAYER_CACHE_DIR=str(tmp / "cache"), PYTHONUNBUFFERED="1")
    env["ZEROLAYER_GPU_BACKEND"] = "sim" if sim else env.get("ZEROLAYER_GPU_BACKEND", "auto")
    proc = subprocess.Popen([sys.executable, "-m", "zerolayer.daemon.server", "--model-path",
                             str(model), "--security-keys-file", str(keys), "--network-port", "0",
                             "--metrics-port", "0", "--model-max-seq-len", "256",
                             "--engine-kv-blocks", "16", "--cache-lease-s", "120"],
                            env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line)
            if "ready on" in line:
                ready.set()
    threading.Thread(target=read, daemon=True).start()
    try:
        t0 = time.monotonic()
        if not ready.wait(400):
            raise RuntimeError("zerolayerd not ready:\n" + "".join(lines[-20:]))
        start_s = time.monotonic() - t0
        port = int(next(ln for ln in lines if "ready on" in ln).split("ready on ")[1]
                   .split(",")[0].rsplit(":", 1)[1])
        cl = Client(("127.0.0.1", port), 1, secret, timeout=120)
        rng = np.random.default_rng(7)
        n, plen = (1, 4) if sim else (30, 32)  # the simulator runs a 32-token prefill in ~90 s
        ttft, server = [], []
        for i in range(n + 1):
            ids = rng.integers(3, c["vocab"], plen).tolist()
            t = time.perf_counter()
            with cl.stream(token_ids=ids, max_tokens=2) as s:
                first = None
                for chunk in s:
                    if chunk and first is None:
                        first = time.perf_counter() - t
            if i and first is not None:  # the first request warms the paths
                ttft.append(first * 1e3)
                tm = s.result.timings
                server.append((tm.ingress_us, tm.queue_us, tm.prefill_us))
        backend = next((ln.strip() for ln in lines if "loaded" in ln), "?")
        out = {"requests": len(ttft), "prompt_tokens": plen, "ttft_ms_p50": float(np.median(ttft)),
               "ttft_ms_p90": float(np.percentile(ttft, 90)), "daemon_start_s": start_s,
               "server_us_median": dict(zip(("ingress", "queue", "prefill"),
                                            np.median(np.array(server), axis=0).tolist())),
               "daemon_log": backend}
        print(f"  TTFT p50 {out['ttft_ms_p50']:.2f} ms ({backend})", flush=True)
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------------------ report

def table(res: dict) -> str:
    s = res["sections"]
    rows = []
    env = s.get("env", {})
    rows.append(("device", f"{env.get('gpu', 'simulator' if env.get('sim') else '?')} "
                           f"cc={env.get('cc')} sms={env.get('sms')} driver={env.get('driver')}"))
    mem = s.get("memory", {})
    rows.append(("device memory", f"{mem['device_memory']}: weights {mem['weight_bytes'] / 1e6:.0f} MB, "
                                  f"pool {mem.get('pool_used_bytes', 0) / 1e6:.0f} MB"
                 if "weight_bytes" in mem else _state(mem)))
    k = s.get("kernels", {})
    rows.append(("kernel checks", f"{k.get('passed', '-')} passed, {k.get('failed', '-')} failed"
                 if "passed" in k else _state(k)))
    f = s.get("forward", {})
    rows.append(("forward vs CPU", f"rel err {f['err']:.1e} (tol {f['tol']:g}) "
                 f"{'OK' if f['ok'] else 'NOT OK'}, same argmax {f['same_argmax']}"
                 if "err" in f else _state(f)))
    t = s.get("timings", {})
    if "decode_b1" in t:
        rows.append(("decode b1", f"{t['decode_b1']['us_per_token']:.0f} us/token "
                                  f"(p90 step {t['decode_b1']['step_us_p90']:.0f} us; "
                                  f"top-k/top-p {t['decode_b1_sampled']['us_per_token']:.0f}; "
                                  f"graphs {t['graphs']})"))
        b = t["decode_b16"]
        rows.append((f"decode b{b['batch']}", f"{b['tok_s']:.0f} tok/s, "
                                              f"{b['us_per_token']:.0f} us/token "
                                              f"({t['b16_over_b1']:.1f}x b1)"))
        rows.append(("prefill", f"{t['prefill']['tok_s']:.0f} tok/s ({t['prefill']['tokens']} tokens)"))
        rows.append(("launch", f"{t['empty_launch_us']:.1f} us empty kernel x "
                               f"{t['launches_per_step']} per step = {t['launch_floor_us_per_step']:.0f} us"))
    else:
        rows.append(("timings", _state(t)))
    o = s.get("ops", {})
    for name, v in o.items():
        if isinstance(v, dict) and "us" in v:
            extra = f", {v['GB_s']:.0f} GB/s" if "GB_s" in v else ""
            rows.append((f"op {name}", f"{v['us']:.1f} us/call{extra}"))
    g = s.get("graph", {})
    for k in ("b1", "b16"):
        if k in g:
            rows.append((f"graph {k}", f"{g[k]['graph_step_us']:.0f} us/step vs launch path "
                                       f"{g[k]['launch_step_us']:.0f} ({g[k]['speedup']:.2f}x), "
                                       f"rel err {g[k]['rel_err']:.1e}"))
    if not any(k in g for k in ("b1", "b16")):
        rows.append(("graph", g.get("note") or _state(g)))
    sm = s.get("sampling", {})
    rows.append(("device sampling", f"b1 {sm['b1']['device_us']:.1f} us (greedy "
                                    f"{sm['b1']['device_greedy_us']:.1f}) vs copy "
                                    f"{sm['b1']['copy_logits_us']:.1f} + CPU {sm['b1']['cpu_sample_us']:.0f} us;"
                                    f" b16 {sm['b16']['device_us']:.1f} vs {sm['b16']['copy_logits_us']:.1f}"
                                    f" + {sm['b16']['cpu_sample_us']:.0f} us"
                 if "b1" in sm else _state(sm)))
    m = s.get("mapped", {})
    rows.append(("mapped UMEM", f"token ids in/out OK; gather of 64 ids {m['gather_64_us']:.1f} us"
                 if "gather_64_us" in m else _state(m)))
    d = s.get("ttft", {})
    rows.append(("TTFT packet->frame", f"{d['ttft_ms_p50']:.2f} ms p50, {d['ttft_ms_p90']:.2f} p90 "
                                       f"({d['prompt_tokens']}-token prompt; daemon prefill "
                                       f"{d['server_us_median']['prefill']:.0f} us)"
                 if "ttft_ms_p50" in d else _state(d)))
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)


def _state(sec: dict) -> str:
    if sec.get("skipped"):
        return f"skipped ({sec['skipped']})"
    if sec.get("ok") is False:
        return "ERROR (see results file)"
    return "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting new sections after this many seconds")
    ap.add_argument("--sim", action="store_true", help="tiny shapes under the CUDA simulator")
    a = ap.parse_args(argv)
    if a.sim:
        os.environ["ZEROLAYER_GPU_BACKEND"] = "sim"
        sys.setswitchinterval(1e-4)
    c = TINY if a.sim else SMOL
    run = Run(a.budget_s)
    run.results["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    run.results["config"] = c
    import zerolayer.gpu.cuda as zc  # after the backend choice
    if not a.sim and not zc.device_available():
        print("gpu_bench: no usable CUDA device (use --sim for a logic check)", file=sys.stderr)
        return 2
    run.section("env", env_info, a.sim)
    run.section("kernels", kernel_checks, c, a.sim)
    models = run.section("build", build_models, c)
    if models:
        run.section("memory", memory_info, models, a.sim)
        run.section("forward", forward_check, models, c, a.sim)
        run.section("timings", timings, models, c, a.sim)
        run.section("graph", graph_timings, models, c, a.sim)
    run.section("ops", op_timings, c, a.sim)
    run.section("sampling", sampling_check, c, a.sim)
    run.section("mapped", mapped_ring, c, a.sim)
    run.section("ttft", daemon_ttft, c, a.sim)
    run.results["wall_s"] = round(time.monotonic() - run.t0, 1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("gpu_check_sim.json" if a.sim else "gpu_check.json")
    path.write_text(json.dumps(run.results, indent=1, default=str))
    print(f"\nresults: {path} ({run.results['wall_s']} s)\n")
    print(table(run.results))
    secs = run.results["sections"]
    bad = [k for k, v in secs.items() if v.get("ok") is False or v.get("failed")]
    bad += ["forward"] if secs.get("forward", {}).get("ok") is False else []
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
