"""The GPU correctness checks: the CUDA forward pass against a float64 reference
(gpu_ref64.py, same weights, same steps), cuBLAS prefill against the token tiles, CUDA graph
replays against the launch path, every kernel against its CPU twin, the device sampler and
logprobs, the mapped UMEM, the cooperative grid barrier, and where the device memory came
from. Each takes the model as bench/gpu_bench.py builds it ((cfg, weights, CudaModel)) or the
shapes dict, raises AssertionError (or returns "failed") on a mismatch and returns its
record. bench/gpu_bench.py runs them after its timings on a GPU machine
(scripts/gpu-check.sh), and under the simulator with --sim; tests/test_gpu_checks.py runs
the self-contained ones on tiny shapes wherever a CUDA device is usable.
"""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from gpu_warm import rand_weight  # noqa: E402

FORWARD_TOL = 1e-3   # max |gpu - ref| / max |ref| per step, float32 kernels vs float64
# cuBLAS prefill vs the token tiles: float16 weights and activations (11-bit significands)
# through 30 layers against float32 kernels; max |a - b| / max |b| over the logits
PREFILL_PATHS_TOL = 2e-2


def rel(gpu, ref) -> float:
    gpu, ref = np.asarray(gpu, np.float64), np.asarray(ref, np.float64)
    if gpu.shape != ref.shape or not np.isfinite(gpu).all():
        return float("inf")
    return float(np.abs(gpu - ref).max() / max(np.abs(ref).max(), 1e-30))


@contextlib.contextmanager
def prefill_path(gpu, path: str, n: int):
    """The model's prefill path for steps of n tokens, for a section: "default" (what the
    model chooses: cuBLAS on tensor cores for n >= its threshold, gpu/cuda/tensor_gemm.py),
    "cublas" (that path for n tokens whatever the threshold: the simulator's prompts are
    short), "tiles" (the fused kernel's token tiles, or per op: the cuBLAS path off)."""
    fwd = gpu.fwd
    g = getattr(fwd, "prefill_gemm", None)
    if path == "cublas" and g is None:
        raise RuntimeError(f"no cuBLAS prefill path: {getattr(fwd, 'prefill_path', '?')}")
    first = None if g is None else g.min_tokens
    try:
        if path == "tiles" and g is not None:
            fwd.prefill_gemm = None
        elif path == "cublas":
            g.min_tokens = min(first, n)
        yield
    finally:
        if g is not None:
            fwd.prefill_gemm, g.min_tokens = g, first


def forward_steps(c: dict, sim: bool) -> list:
    """The forward check's steps: a prefill of two prompts, then three decode steps of both."""
    rng = np.random.default_rng(2)
    steps = [[rng.integers(0, c["vocab"], 24 if sim else 100), rng.integers(0, c["vocab"], 7)]]
    steps += [[rng.integers(0, c["vocab"], 1), rng.integers(0, c["vocab"], 1)] for _ in range(3)]
    return steps


def reference_logits(model, c: dict, sim: bool) -> dict:
    """float64 logits of forward_steps (gpu_ref64.py), computed while the kernels compile."""
    from gpu_ref64 import Reference64
    cfg, w, _ = model
    ref = Reference64(cfg, w)
    seqs = [ref.new_sequence(), ref.new_sequence()]
    return [ref.step(list(zip(seqs, toks))) for toks in forward_steps(c, sim)]


def wall_us_per_call(fn, n: int, stream) -> float:
    """Mean wall time per call of fn(stream) (queued and waited for) after one warm-up."""
    fn(stream)
    stream.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn(stream)
        stream.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def grid_barrier_check(model, sim: bool) -> dict:
    """grid_sync.selftest on the device, launched as the fused kernel is (cooperatively, one
    256-thread block per multiprocessor; gpu/cuda/residency.py): each block writes its id,
    waits at the grid barrier, then sums every block's id, so every block's sum is
    n(n-1)/2 only if the barrier held. Three launches, each on fresh barrier state. Also
    what the model decided at start: the fused kernel, or per op and why."""
    path = str(getattr(getattr(model[2], "fwd", None), "kernel_path", "?")) if model else "?"
    if sim:
        return {"note": "the simulator runs blocks one after another: no barrier to test",
                "model_kernel_path": path}
    from numba import cuda

    from zerolayer.gpu.cuda import grid_sync, residency
    k = grid_sync.selftest
    ovs = list(k.raw.overloads.values())
    n = cuda.get_current_device().MULTIPROCESSOR_COUNT
    fits = min(int(ov.max_cooperative_grid_blocks(256)) for ov in ovs)
    why = residency.grid_refusal(n, fits)
    for ov in ovs:
        why = why or residency.make_cooperative(ov)
    if why is not None:
        raise AssertionError(f"grid barrier selftest refused: {why}")
    want = n * (n - 1) // 2
    runs = []
    for _ in range(3):
        bar = grid_sync.new_state()
        ids = cuda.to_device(np.zeros(n, np.int32))
        got = cuda.to_device(np.zeros(n, np.int32))
        t = time.perf_counter()
        k[n, 256](bar, ids, got)
        cuda.synchronize()
        wall_us = (time.perf_counter() - t) * 1e6
        h, flag = got.copy_to_host(), int(bar.copy_to_host()[2])
        runs.append({"blocks_ok": int((h == want).sum()), "error_flag": flag,
                     "wall_us": round(wall_us, 1)})
    ok = all(r["blocks_ok"] == n and r["error_flag"] == 0 for r in runs)
    print(f"  grid barrier selftest over {n} blocks (cooperative launch, at most {fits}): "
          f"{'OK' if ok else 'NOT OK'} {runs}; model: {path}", flush=True)
    if not ok:
        raise AssertionError(f"grid barrier did not hold: {runs}")
    return {"blocks": n, "max_cooperative_blocks": fits, "runs": runs, "model_kernel_path": path}


def forward_check(model, ref: list, c: dict, sim: bool, path: str = "tiles",
                  tol: float = FORWARD_TOL) -> dict:
    """The whole forward pass on the GPU against the float64 reference (gpu_ref64.py, same
    weights, same steps): a prefill of two prompts, then decode steps of both sequences (their
    KV written on the GPU by the earlier steps). Tolerance `tol` of the largest logit, per
    step: FORWARD_TOL for the float32 kernels (path "tiles": the prefill on them too), or
    PREFILL_PATHS_TOL with the prefill through cuBLAS in float16 (path "cublas")."""
    from zerolayer.gpu.model import StepInput
    _, _, gpu = model
    steps = forward_steps(c, sim)
    seqs = [gpu.new_sequence(), gpu.new_sequence()]
    errs, same_argmax, paths = [], [], []
    try:
        with prefill_path(gpu, path, sum(len(t) for t in steps[0])):
            for toks, want in zip(steps, ref):
                got = gpu.step([StepInput(s, t) for s, t in zip(seqs, toks)])
                errs.append(rel(got, want))
                same_argmax.append(bool((np.asarray(got).argmax(1) == want.argmax(1)).all()))
                paths.append(str(getattr(gpu.fwd, "last_path", "?")))
    finally:
        for s in seqs:
            s.release()
    err = max(errs)
    print(f"  forward vs float64 (prefill on {path}): per step rel err "
          f"{', '.join(f'{e:.1e}' for e in errs)} (tol {tol:g}); same argmax {same_argmax}",
          flush=True)
    if not err <= tol:
        raise AssertionError(f"forward pass differs from the float64 reference: {errs}")
    return {"err": err, "tol": tol, "per_step_err": errs, "same_argmax": same_argmax,
            "reference": "float64 numpy (tests/gpu_ref64.py)", "prefill_path": paths[0]}


def prefill_paths_check(model, c: dict, p: dict, sim: bool) -> dict:
    """The same `prefill`-token prompt on the cuBLAS path and on the token tiles: their
    logits agree within float16 tolerance (max |cublas - tiles| / max |tiles|) and pick the
    same token."""
    from zerolayer.gpu.model import StepInput
    _, _, gpu = model
    prompt = np.random.default_rng(11).integers(0, c["vocab"], p["prefill"])
    logits, paths = {}, {}
    for path in ("tiles", "cublas"):
        with prefill_path(gpu, path, len(prompt)):
            s = gpu.new_sequence()
            try:
                logits[path] = gpu.step([StepInput(s, prompt)])
            finally:
                s.release()
            paths[path] = str(gpu.fwd.last_path)
    err = rel(logits["cublas"], logits["tiles"])
    same = bool((logits["cublas"].argmax(1) == logits["tiles"].argmax(1)).all())
    out = {"tokens": len(prompt), "rel_err": err, "tol": PREFILL_PATHS_TOL, "same_token": same,
           "paths": paths, "failed": not (err <= PREFILL_PATHS_TOL and same)}
    print(f"  cuBLAS vs tiles, {len(prompt)} tokens: rel err {err:.2e} (tol {PREFILL_PATHS_TOL:g}), "
          f"same token {same}", flush=True)
    return out


def graph_check(model, c: dict, sim: bool) -> dict:
    """Decode steps replayed as CUDA graphs against the launch-per-op path, on two sets of
    sequences with the same prompts and tokens: the logits must agree; per-step wall times."""
    if sim:
        return {"note": "CUDA graphs need a real device; nothing to do under the simulator"}
    from numba import cuda

    from zerolayer.gpu.model import StepInput
    _, _, gpu = model
    if not hasattr(gpu, "use_graphs"):
        return {"note": "this CudaModel has no use_graphs switch"}
    rng = np.random.default_rng(6)
    n_dec = 16
    out = {}
    for batch in (1, 16):
        prompts = [rng.integers(0, c["vocab"], 64) for _ in range(batch)]
        sets = {}
        for mode in (False, True):
            gpu.use_graphs = False
            seqs = [gpu.new_sequence() for _ in range(batch)]
            gpu.step([StepInput(s, q) for s, q in zip(seqs, prompts)])
            sets[mode] = seqs
        toks = [rng.integers(0, c["vocab"], batch) for _ in range(n_dec + 1)]
        times, first = {False: [], True: []}, {}
        try:
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
        finally:
            for seqs in sets.values():
                for s in seqs:
                    s.release()
            gpu.use_graphs = True
        err = rel(first[True], first[False])
        launch, graph = float(np.median(times[False])), float(np.median(times[True]))
        out[f"b{batch}"] = {"launch_step_us": launch * 1e6, "graph_step_us": graph * 1e6,
                            "speedup": launch / graph, "rel_err": err}
        print(f"  b{batch}: launch path {launch * 1e6:.0f} us/step, graph {graph * 1e6:.0f} us/step "
              f"({launch / graph:.2f}x), rel err {err:.1e}", flush=True)
    cuda.synchronize()
    if max(v["rel_err"] for v in out.values()) > 1e-4:
        raise AssertionError(f"graph replay disagrees with the launch path: {out}")
    return out


def memory_info(model, sim: bool) -> dict:
    """Where the model's device memory came from: with the CuPy plugin (gpu/cuda/cupy_memory),
    CuPy's pool must hold at least the weights."""
    from zerolayer.gpu.cuda import _cuda_shim
    _, w, gpu = model
    weight_bytes = sum(int(a.nbytes) for wt in (w.emb, w.wqkv, w.wo, w.wgu, w.wdown)
                       for a in (wt.qs, wt.d, wt.m, wt.w))
    fwd = getattr(gpu, "fwd", None)
    kv_bytes = int(sum(getattr(getattr(fwd, k, None), "nbytes", 0) for k in ("k_pool", "v_pool")))
    out = {"device_memory": _cuda_shim.MEMORY, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes}
    pool = None
    if not sim:  # the plugin module needs the real numba.cuda
        from zerolayer.gpu.cuda import cupy_memory
        pool = cupy_memory.pool_bytes()
    if pool is not None:
        out.update(pool_used_bytes=pool[0], pool_held_bytes=pool[1])
        if _cuda_shim.MEMORY.startswith("cupy") and pool[0] < weight_bytes:
            raise AssertionError(f"CuPy's pool holds {pool[0]} bytes, less than the weights "
                                 f"({weight_bytes})")
    print(f"  device memory: {out['device_memory']}; weights {weight_bytes / 1e6:.1f} MB, "
          f"KV {kv_bytes / 1e6:.1f} MB, pool {out.get('pool_used_bytes', 0) / 1e6:.1f} MB", flush=True)
    return out


def kernel_checks(c: dict, sim: bool) -> dict:
    """Each kernel at the model's shapes against its CPU twin, on device arrays."""
    from numba import cuda

    from zerolayer.gpu import quant
    from zerolayer.gpu.cuda import attention as cu_att
    from zerolayer.gpu.cuda import embedding as cu_emb
    from zerolayer.gpu.cuda import matmul as cu_mm
    from zerolayer.gpu.cuda import rmsnorm as cu_rms
    from zerolayer.gpu.cuda import rope as cu_rope
    from zerolayer.gpu.cuda import swiglu as cu_sw
    from zerolayer.gpu.cuda.weight_layout import device_layer
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
    demb = tuple(dev(a) if i else a for i, a in enumerate(device_layer(*emb)))
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
        dwt = tuple(dev(a) if i else a for i, a in enumerate(device_layer(*wt)))
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


def sampling_check(c: dict, sim: bool) -> dict:
    """The device sampler at the real vocabulary size: kept distributions against the float64
    reference and drawn tokens against the CPU twin for the same u."""
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
    smp.sample_rows(cuda.to_device(logits), cuda.to_device(smp.pack_params(draws)), out_ids, probs)
    ids, pr = out_ids.copy_to_host(), probs.copy_to_host()
    err, same = 0.0, 0
    for r, (t, k, p, u) in enumerate(draws):
        if t > 0:
            err = max(err, float(np.abs(pr[r] - sample_probs_ref(logits[r], t, k, p)).max()))
        same += int(ids[r]) == sample(logits[r], t, k, p, u)
    print(f"  sampling: prob err {err:.1e}, {same}/{len(cfgs)} tokens as the CPU twin", flush=True)
    if err > 1e-5 or same < len(cfgs):
        raise AssertionError(f"device sampler disagrees: prob err {err:.2g}, {same}/{len(cfgs)} tokens")
    lp = logprobs_check(cuda.to_device(logits), out_ids, logits, ids)
    return {"prob_err": err, "same_token_as_cpu": same, "rows": len(cfgs), **lp}


def logprobs_check(d_logits, d_ids, logits: np.ndarray, ids: np.ndarray) -> dict:
    """The logprob kernel (gpu/cuda/logprobs.py) on some of the sampler's rows, at the real
    vocabulary: the sampled token's logprob and the top N (ids in order, values) against a
    float64 log-softmax."""
    from numba import cuda

    from zerolayer.gpu.cuda import logprobs as cu_lp
    rows, tops = np.array([0, 2, 5], np.int32), np.array([20, 5, 0], np.int32)
    o_ids = cuda.device_array((len(rows), cu_lp.WIDTH), np.int32)
    o_lps = cuda.device_array((len(rows), cu_lp.WIDTH), np.float32)
    cu_lp.logprob_rows(d_logits, cuda.to_device(rows), cuda.to_device(tops), d_ids, o_ids, o_lps)
    got_ids, got_lps = o_ids.copy_to_host(), o_lps.copy_to_host()
    err, wrong = 0.0, 0
    for b, (r, n) in enumerate(zip(rows, tops)):
        z = logits[r].astype(np.float64)
        ref = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
        order = np.lexsort((np.arange(len(z)), -ref))[:n]
        wrong += int(got_ids[b, 1:1 + n].tolist() != order.tolist()) + int(got_ids[b, 0] != ids[r])
        err = max(err, abs(float(got_lps[b, 0]) - ref[ids[r]]),
                  float(np.abs(got_lps[b, 1:1 + n] - ref[order]).max(initial=0.0)))
    print(f"  logprobs: err {err:.1e}, {len(rows) - wrong}/{len(rows)} rows' top-N as float64",
          flush=True)
    if err > 1e-4 or wrong:
        raise AssertionError(f"logprob kernel disagrees: err {err:.2g}, {wrong} rows wrong")
    return {"logprob_err": err}


def mapped_ring(c: dict, sim: bool) -> dict:
    """The UMEM path on the real driver: an anonymous mmap (as daemon/xsk_ring.Umem
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
    stream = cuda.stream()
    gather_us = wall_us_per_call(lambda s: mr.gather_token_ids(ring.device, d_offs, got, stream=s),
                                 3 if sim else 500, stream)
    if not (ok_in and ok_out):
        raise AssertionError(f"mapped ring: ids in {ok_in}, ids out {ok_out}")
    print(f"  mapped UMEM ok; gather of 64 ids from host frames {gather_us:.1f} us", flush=True)
    return {"ids_in_ok": ok_in, "ids_out_ok": ok_out, "gather_64_us": gather_us}
