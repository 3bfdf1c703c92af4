"""The fused step kernel (gpu/cuda/step_kernel.py) under Numba's CUDA simulator: whole steps
against the CPU model, and the kernel nodes a decode step costs.

As in tests/test_cuda_sim.py, the simulator runs in a child process (this file with
--child) and this process compares what it reports. Under the simulator the kernel runs one
stage per launch (gpu/cuda/grid_sync.py); ``_cuda_shim.LAUNCHES`` counts the one launch a
device makes, which is what the launch-count test holds.

Shapes are tiny but reach the kernel's edges: n_ff a multiple of 64 (the fused SwiGLU's
condition), row counts not a multiple of 64 (padded groups), K split into slices in every
matmul stage (the equality cases), every weight format the kernel
reads (Q4 nibbles, 32- and 16-byte blocks of bytes, float32 rows), Q/K/V biases, prompts of
several tokens (4-token tiles, a partial last tile), flash-decoding splits with empty splits
and the last-block merge, and the greedy argmax keys read back against numpy's argmax.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import pytest

import gpu_children

CASES = ["step_mixed_formats", "step_q4_embedding_f32_head", "launches_per_decode_step",
         "engine_on_fused_steps", "engine_barrier_failure"]
TOL = 1e-4          # logits: float32 over a whole model, two summation orders
MAX_NODES = 64      # kernel launches per decode step on a device
CHILD_TIMEOUT_S = 2700  # the equality cases split K as far as it goes: many items, a busy machine
SHAPES = dict(n_layer=2, d=64, ff=128, n_head=4, n_kv=2, hd=16, vocab=200, ctx=256)


early_children, results = gpu_children.one_child(__file__, "steps", "results",
                                                 gpu_children.sim_env, CHILD_TIMEOUT_S)


def _ok(results, case):
    r = results[case]
    assert "error" not in r, r["error"]
    return r


@pytest.mark.parametrize("case", ["step_mixed_formats", "step_q4_embedding_f32_head"])
def test_fused_step_matches_the_cpu_model(results, case):
    r = _ok(results, case)
    assert r["path"] == "fused step kernel", r
    assert r["scales"] == "float16", r  # these files' scales are f16 values (Q4_0/1, Q8_0, Q5_0)
    assert r["err"] <= TOL, r
    assert r["argmax_differs"] == 0, r


def test_decode_step_launches_at_most_64_kernels(results):
    """A greedy decode step through CudaModel.launch_tokens (the engine's call): the fused
    step and the sampler, whatever the layer count; the per-op path's 4 + 13 per layer for
    contrast (it is what the fused kernel replaced)."""
    r = _ok(results, "launches_per_decode_step")
    for n_layer, counts in r["fused"].items():
        assert sum(counts.values()) <= MAX_NODES, (n_layer, counts)
        steps = {k: v for k, v in counts.items() if k.startswith("step_kernel.")}
        assert list(steps.values()) == [1] and counts["sampling._sample_rows"] == 1, (n_layer, counts)
        assert sum(counts.values()) == 2, (n_layer, counts)
    assert sum(r["per_op"].values()) == 4 + 13 * SHAPES["n_layer"] + 1, r["per_op"]


def test_engine_on_fused_steps_gives_the_cpu_models_tokens(results):
    r = _ok(results, "engine_on_fused_steps")
    assert r["path"] == "fused step kernel", r
    assert r["differs"] == 0, r


def test_no_token_from_a_failed_or_following_step_reaches_a_client(results):
    """A grid barrier failure injected into the third fused step (the error flag set in
    stream order, between the kernel and its flag's copy: what a block that gave up would
    leave), with the engine overlapping steps. That step and the one queued behind it (which
    ran with the flag already set) deliver no token: their requests end INTERNAL; the prefix
    entry the failed step wrote (a request that finished while it was in flight) is gone;
    every token a client got is the CPU engine's; the next request runs per op and gets the
    CPU engine's tokens, with no prefix copied from the failed step."""
    r = _ok(results, "engine_barrier_failure")
    fail = r["fail_step"]
    ok = r["waited_ok"]
    assert [s for s in ok if s < fail] == list(range(1, fail)), r  # every step before it
    assert r["step_failed"] == [fail, fail + 1], r     # no ids from it nor the one queued behind
    assert fail not in ok and fail + 1 not in ok and max(ok) > fail + 1, r  # later steps: per op
    owners = set(r["owners"][str(fail)]) | set(r["owners"][str(fail + 1)])
    assert r["failed"] == sorted(owners - set(r["done_before"])), r
    assert all(c == "INTERNAL" for c in r["codes"].values()), r
    for k, toks in r["gpu"].items():                            # what clients got: CPU tokens
        assert toks == r["cpu"][k][:len(toks)], (k, r)
    assert r["text_tokens"] == {k: len(v) for k, v in r["gpu"].items()}, r
    assert r["entries_before"] == 1 and r["entries_after"] == 0, r
    assert r["late"]["tokens"] == r["cpu"]["late"] and r["late"]["cached"] == 0, r
    assert r["path"].startswith("per-op launches"), r


# ---------------------------------------------------------------- the child (simulator) side

def _child() -> None:
    sys.setswitchinterval(1e-4)
    import tempfile

    import numpy as np
    from gguf import GGMLQuantizationType as QT

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tiny_gguf import write_tiny_llama
    from zerolayer.gpu.cuda import _cuda_shim as shim
    from zerolayer.gpu.cuda.forward import CudaModel
    from zerolayer.gpu.cuda.step_launch import SPLIT_ALL, decode_argmax
    from zerolayer.gpu.model import LlamaModel, StepInput

    rng = np.random.default_rng(3)
    tmp = tempfile.mkdtemp(prefix="zl-fused-")

    def models(name, shapes=SHAPES, kv_blocks=6, **kw):
        path = os.path.join(tmp, name + ".gguf")
        write_tiny_llama(path, config=shapes, **kw)
        load = dict(use_cache=False, max_seq_len=128, kv_blocks=kv_blocks)
        return LlamaModel.load(path, **load), CudaModel(LlamaModel.load(path, **load))

    def rel(a, b) -> float:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape and np.isfinite(a).all()
        return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))

    def against_cpu(cpu, gpu, prompts, decode_steps, splits):
        """Prompts as one step, then decode steps (attention splits forced to `splits`, so
        empty splits and the merge run; K split as far as it goes, so every matmul stage's
        split sums meet in the last item of each row group); max rel err of the logits and
        the number of rows whose argmax key disagrees with numpy's argmax of the CPU logits."""
        gpu.fwd.fused.split_target = SPLIT_ALL
        seqs = {m: [m.new_sequence() for _ in prompts] for m in (cpu, gpu)}
        errs, differs = [], 0
        steps = [list(prompts)] + [[rng.integers(0, 200, 1) for _ in prompts]] * decode_steps
        for i, toks in enumerate(steps):
            if i:
                gpu.fwd.splits_for = lambda T, tok_pos=None: splits
            out = [m.step([StepInput(s, t) for s, t in zip(seqs[m], toks)]) for m in (cpu, gpu)]
            errs.append(rel(out[1], out[0]))
            differs += int((decode_argmax(gpu.fwd.best_keys) != out[0].argmax(1)).sum())
        del gpu.fwd.splits_for
        return {"err": max(errs), "per_step": errs, "argmax_differs": differs,
                "path": gpu.fwd.kernel_path, "scales": np.dtype(gpu.fwd.fused_scales).name}

    def case_step_mixed_formats():
        cpu, gpu = models("mixed", tied=True, qkv_bias=True, override={
            "attn_q": QT.Q8_0, "attn_k": QT.Q8_0, "attn_v": QT.Q8_0, "attn_output": QT.F16,
            "ffn_gate": QT.Q4_1, "ffn_up": QT.Q4_1, "ffn_down": QT.Q5_0})
        return against_cpu(cpu, gpu, [rng.integers(0, 200, 6), rng.integers(0, 200, 3)], 2, 3)

    def case_step_q4_embedding_f32_head():
        cpu, gpu = models("q4emb", override={
            "token_embd": QT.Q4_1, "attn_q": QT.Q4_0, "attn_k": QT.Q4_0,
            "attn_v": QT.Q4_0, "attn_output": QT.Q4_0, "ffn_gate": QT.Q8_0, "ffn_up": QT.Q8_0,
            "ffn_down": QT.Q4_1})
        return against_cpu(cpu, gpu, [rng.integers(0, 200, 2)], 1, 2)

    def case_launches_per_decode_step():
        def count(gpu):
            seqs = [gpu.new_sequence() for _ in range(2)]
            gpu.step([StepInput(s, rng.integers(0, 200, 2)) for s in seqs])
            shim.LAUNCHES.clear()
            gpu.launch_tokens([StepInput(s, rng.integers(0, 200, 1)) for s in seqs],
                              [(0.0, 0, 1.0, 0.0)] * 2).wait()
            return dict(shim.LAUNCHES)
        fused = {}
        for n_layer in (1, 3):
            fused[n_layer] = count(models(f"l{n_layer}", dict(SHAPES, n_layer=n_layer))[1])
        gpu = models("perop")[1]
        gpu.fwd.fused = None
        return {"err": 0.0, "fused": fused, "per_op": count(gpu)}

    def case_engine_on_fused_steps():
        """The daemon's engine on the fused kernel, overlapped (step N+1's tokens taken from
        step N's device ids), against the engine on the CPU model: greedy requests joining
        at different steps, one with a repetition penalty (its argmax from the sampler, not
        the kernel's keys). Tokens must be equal."""
        from zerolayer.daemon.engine import Engine
        from zerolayer.daemon.request import Admitted
        from zerolayer.protocol.sampling_params import SamplingParams

        cpu, gpu = models("engine", kv_blocks=12, tokenizer=True)
        prompts = [rng.integers(3, 200, n).astype(np.int32) for n in (5, 3, 4)]
        params = [SamplingParams(max_tokens=4), SamplingParams(max_tokens=3),
                  SamplingParams(max_tokens=3, repetition_penalty=1.5)]

        def run(model):
            tok = model.tokenizer()
            tok._eos_ids = frozenset({-1})
            eng = Engine(model, tok, emit=lambda ev: None, max_running=3, step_tokens=16)
            runs = [eng.submit(Admitted(0, params[0]), prompts[0])]
            n = 0
            while eng.has_work:
                eng.step()
                n += 1
                if n in (1, 2):
                    runs.append(eng.submit(Admitted(n, params[n]), prompts[n]))
            return [list(r.tokens) for r in runs]

        a, b = run(cpu), run(gpu)
        return {"err": 0.0, "differs": sum(x != y for x, y in zip(a, b)), "cpu": a, "gpu": b,
                "path": gpu.fwd.kernel_path}

    def case_engine_barrier_failure():
        from zerolayer.daemon.engine import Engine
        from zerolayer.daemon.request import Admitted, FailedEvent, TextEvent
        from zerolayer.protocol.sampling_params import SamplingParams

        FAIL = 3
        cpu, gpu = models("barrier", kv_blocks=16, tokenizer=True)
        long_prompt = rng.integers(3, 200, 18).astype(np.int32)  # over the prefix minimum
        specs = {"a": (0, long_prompt, 2), "b": (0, rng.integers(3, 200, 5), 6),
                 "c": (3, rng.integers(3, 200, 4), 4), "late": (6, long_prompt, 3)}
        out: dict = {"fail_step": FAIL, "waited_ok": [], "step_failed": [], "owners": {},
                     "codes": {}, "text_tokens": {}, "done_before": []}

        def run(model, inject):
            tok = model.tokenizer()
            tok._eos_ids = frozenset({-1})
            events: list = []
            eng = Engine(model, tok, emit=events.append, max_running=4, step_tokens=32)
            reqs: dict = {}  # the runs submitted so far
            if inject:
                fused, launch_tokens = gpu.fwd.fused, gpu.launch_tokens
                queue_flag = fused.queue_flag
                n_launch = [0]

                def flag_hook(s):  # the fault, in stream order after the step's kernel
                    n_launch[0] += 1
                    if n_launch[0] == FAIL:
                        fused.inject_barrier_failure(s)
                    return queue_flag(s)

                def launch_hook(inputs, *a, **kw):  # which requests, which step; which waits
                    step = len(out["owners"]) + 1
                    out["owners"][str(step)] = sorted(
                        k for k, r in reqs.items() for i in inputs if r.seq is i.seq)
                    pending = launch_tokens(inputs, *a, **kw)
                    wait = pending.wait

                    def checked_wait():
                        try:
                            ids = wait()
                        except RuntimeError:
                            out["step_failed"].append(step)
                            raise
                        out["waited_ok"].append(step)
                        return ids
                    pending.wait = checked_wait
                    return pending
                fused.queue_flag = flag_hook
                gpu.launch_tokens = launch_hook
            n = 0
            while n == 0 or eng.has_work or any(w >= n for w, _, _ in specs.values()):
                for k, (when, _, _) in specs.items():
                    if when == n:
                        reqs[k] = eng.submit(Admitted(k, SamplingParams(max_tokens=specs[k][2])),
                                             specs[k][1])
                if inject and n == FAIL:  # this call completes the failed step
                    out["done_before"] = sorted(k for k, r in reqs.items() if r.done)
                    out["entries_before"] = len(eng.prefix._entries)
                eng.step()
                if inject and n == FAIL:
                    out["entries_after"] = len(eng.prefix._entries)
                n += 1
            if inject:
                for ev in events:
                    if isinstance(ev, FailedEvent):
                        out["codes"][ev.req.key] = ev.code.name
                    elif isinstance(ev, TextEvent):
                        out["text_tokens"][ev.req.key] = out["text_tokens"].get(ev.req.key, 0) + ev.n_tokens
                for k in reqs:
                    out["text_tokens"].setdefault(k, 0)
                out["late"] = {"tokens": list(reqs["late"].tokens), "cached": reqs["late"].cached}
                out["failed"] = sorted(out["codes"])
            return {k: list(r.tokens) for k, r in reqs.items()}

        out["cpu"] = run(cpu, False)
        out["gpu"] = run(gpu, True)
        out["path"] = gpu.fwd.kernel_path
        out["err"] = 0.0
        return out

    runs = {"step_mixed_formats": case_step_mixed_formats,
            "step_q4_embedding_f32_head": case_step_q4_embedding_f32_head,
            "launches_per_decode_step": case_launches_per_decode_step,
            "engine_on_fused_steps": case_engine_on_fused_steps,
            "engine_barrier_failure": case_engine_barrier_failure}
    assert sorted(runs) == sorted(CASES)
    out = {"_sim": shim.SIM}
    for name in os.environ.get("ZEROLAYER_FUSED_CASES", ",".join(CASES)).split(","):
        t = time.monotonic()
        try:
            out[name] = {**runs[name](), "s": round(time.monotonic() - t, 2)}
        except Exception:
            out[name] = {"error": traceback.format_exc()}
        print(f"{name}: {out[name]}", file=sys.stderr, flush=True)
    print(json.dumps(out, default=str))


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    _child()
