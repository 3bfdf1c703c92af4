"""The tensor-core prefill path (gpu/cuda/dequant.py, gpu/cuda/tensor_gemm.py, forward.py's
``takes_gemm``) under Numba's CUDA simulator, where the GEMM runs the same arithmetic with
numpy (float16 inputs, float32 products and sums):

* the dequantization kernels equal gpu/quant.py's CPU dequantization, rounded to float16,
  bit for bit, for every internal format (Q4, bytes in 32- and 16-weight blocks, F32);
* a prefill step of the tiny GGUF (llama, and qwen2 with Q/K/V biases) through the path
  gives the CPU model's logits within float16 tolerance, and says it took the path; greedy
  decoding after it gives the CPU model's tokens;
* steps under the threshold, decode steps, and a model with the switch off keep their path.

As in tests/test_cuda_sim.py, the simulator must be on before numba.cuda is imported, so
the cases run in a child process (this file with --child) and this process compares.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

import pytest

import gpu_children

# Prefill logits: float16 weights and activations (11-bit significands) against the CPU
# model's float32 kernels, max |gpu - cpu| / max |cpu| over the step's rows.
PREFILL_TOL = 1e-2
MIN_TOKENS = 8  # the threshold the child sets, so the tiny prompts take the path
CASES = ["dequant_q4_1", "dequant_q4_0", "dequant_q4_k", "dequant_q8_0", "dequant_q5_1",
         "dequant_q6_k", "dequant_f16", "to_half", "gemm_f16", "prefill_llama",
         "prefill_qwen2_bias", "short_steps_keep_their_path"]
CHILD_TIMEOUT_S = 1200


def _env() -> dict[str, str]:
    env = gpu_children.sim_env(ZEROLAYER_CUDA_PREFILL_GEMM_MIN_TOKENS=str(MIN_TOKENS))
    env.pop("ZEROLAYER_CUDA_PREFILL_GEMM", None)
    return env


early_children, results = gpu_children.one_child(__file__, "gemm", "results", _env,
                                                 CHILD_TIMEOUT_S)


def _ok(results: dict, case: str) -> dict:
    r = results[case]
    assert "error" not in r, r["error"]
    return r


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("dequant_")] + ["to_half"])
def test_float16_conversion_equals_the_cpu_dequantization(results, case):
    r = _ok(results, case)
    assert r["checked"] > 0 and r["mismatches"] == 0, r


def test_gemm_sums_float16_products_in_float32(results):
    r = _ok(results, "gemm_f16")
    assert r["err"] <= 1e-6, r


@pytest.mark.parametrize("case", ["prefill_llama", "prefill_qwen2_bias"])
def test_prefill_through_the_gemm_matches_the_cpu_model(results, case):
    r = _ok(results, case)
    assert r["path"].startswith("cuBLAS"), r
    assert r["err"] <= PREFILL_TOL, r
    assert r["argmax_equal"], r
    # the model of the path (gpu/cuda/prefill_plan.py) prices the launches the step made
    assert r["launches"] == r["plan_launches"], r


def test_greedy_tokens_after_a_gemm_prefill_match_the_cpu_model(results):
    r = _ok(results, "prefill_llama")
    assert not r["decode_path"].startswith("cuBLAS"), r
    assert len(r["cpu"]) == 8 and r["gpu"] == r["cpu"], r


def test_short_and_decode_steps_keep_their_path(results):
    """Below the threshold, and any decode step, the step never takes the GEMM path."""
    r = _ok(results, "short_steps_keep_their_path")
    assert r["short"] == r["decode"] == r["kernel_path"] and not r["short"].startswith("cuBLAS"), r
    assert r["switched_off"].startswith("off (ZEROLAYER_CUDA_PREFILL_GEMM=0)"), r


# ---------------------------------------------------------------- the child (simulator) side

def _child() -> None:
    sys.setswitchinterval(1e-4)
    import functools
    import tempfile

    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as QT

    from tiny_gguf import write_tiny_llama
    from zerolayer.gpu import quant
    from zerolayer.gpu.cuda import _cuda_shim as shim
    from zerolayer.gpu.cuda import dequant as dq
    from zerolayer.gpu.cuda import prefill_plan, step_plan
    from zerolayer.gpu.cuda import tensor_gemm as tg
    from zerolayer.gpu.cuda.forward import CudaModel
    from zerolayer.gpu.cuda.weight_layout import device_layer
    from zerolayer.gpu.model import LlamaModel, StepInput

    assert shim.SIM
    rng = np.random.default_rng(0)
    f16 = np.float16

    def mismatches(got: np.ndarray, want: np.ndarray) -> dict:
        assert got.shape == want.shape and got.dtype == want.dtype == f16, (got.shape, want.shape)
        return {"checked": int(want.size),
                "mismatches": int((got.view(np.uint16) != want.view(np.uint16)).sum())}

    # bytes per 256-weight super-block, and where its f16 scales are (gpu/quant.py)
    K_BLOCK = {QT.Q4_K: (144, (0, 2)), QT.Q6_K: (210, (208,))}

    def case_dequant(qt: QT) -> dict:
        rows = 70  # one full row group and a padded one
        cols = 512 if qt in K_BLOCK else 96
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        if qt in K_BLOCK:  # gguf can't quantize K-quants: random blocks, finite f16 scales
            size, scales = K_BLOCK[qt]
            raw = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
            for at in scales:
                raw[:, :, at:at + 2] = rng.uniform(1e-3, 1e-1, raw.shape[:2] + (1,)).astype(
                    f16).view(np.uint8)
        else:
            raw = (w.astype(f16) if qt == QT.F16 else gguf.quants.quantize(w, qt))
        fmt, natural = quant.repack(raw, rows, cols, qt)
        want = quant.dequantize(fmt, natural).astype(f16)  # float32 d*q+m, then float16
        wt = quant.stack([(fmt, natural)])
        out = np.full((rows, cols), np.nan, f16)
        dq.dequantize(*device_layer(wt.fmt, *(a[0] for a in (wt.qs, wt.d, wt.m, wt.w))), out)
        return {"fmt": int(wt.fmt), **mismatches(out, want)}

    def case_to_half() -> dict:
        x = (rng.standard_normal((9, 40)) * 50).astype(np.float32)
        y = np.full((7, 40), np.nan, f16)  # fewer rows than x: only y's are converted
        dq.to_half(x, y)
        return mismatches(y, x[:7].astype(f16))

    def case_gemm() -> dict:
        x = rng.standard_normal((13, 96)).astype(f16)
        w = rng.standard_normal((70, 96)).astype(f16)  # rows past R: a row group's padding
        y = np.full((13, 64), np.nan, np.float32)
        tg.gemm_f16(x, w, y)
        ref = x.astype(np.float64) @ w[:64].astype(np.float64).T
        return {"err": float(np.abs(y - ref).max() / np.abs(ref).max())}

    def load_pair(**kw_write):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny.gguf")
            write_tiny_llama(path, **kw_write)
            kw = dict(use_cache=False, max_seq_len=128, kv_blocks=12)
            return LlamaModel.load(path, **kw), CudaModel(LlamaModel.load(path, **kw))

    def case_prefill(greedy: int = 0, **kw_write) -> dict:
        """A step of two prompts (6 + 5 tokens: MIN_TOKENS or more together) on both models,
        the rows' logits compared; then `greedy` tokens of the first sequence, each model
        feeding back its own argmax (decode steps: per op or fused, never the GEMM)."""
        cpu, gpu = load_pair(**kw_write)
        prompts = [rng.integers(0, 200, 6), rng.integers(0, 200, 5)]
        seqs = {m: [m.new_sequence() for _ in prompts] for m in (cpu, gpu)}
        out = [cpu.step([StepInput(s, p) for s, p in zip(seqs[cpu], prompts)])]
        shim.LAUNCHES.clear()
        out.append(gpu.step([StepInput(s, p) for s, p in zip(seqs[gpu], prompts)]))
        plan = prefill_plan.predict_prefill(gpu.cfg, gpu.model.w, 11, step_plan.H100_SXM)
        r = {"err": float(np.abs(out[1] - out[0]).max() / np.abs(out[0]).max()),
             "path": gpu.fwd.last_path,
             "argmax_equal": bool((out[0].argmax(1) == out[1].argmax(1)).all()),
             "launches": sum(shim.LAUNCHES.values()),
             "plan_launches": sum(ln.launches for ln in plan.lines)}
        for name, m, logits in (("cpu", cpu, out[0]), ("gpu", gpu, out[1])):
            toks = [int(np.argmax(logits[0]))]
            for _ in range(greedy - 1):
                step = m.step([StepInput(seqs[m][0], np.array(toks[-1:], np.int32))])
                toks.append(int(np.argmax(step[0])))
            r[name] = toks
        r["decode_path"] = gpu.fwd.last_path
        return r

    def case_short_steps() -> dict:
        _, gpu = load_pair(override={"attn_v": QT.Q4_1})
        s = gpu.new_sequence()
        gpu.step([StepInput(s, rng.integers(0, 200, MIN_TOKENS - 1))])
        short = gpu.fwd.last_path
        seqs = [gpu.new_sequence() for _ in range(MIN_TOKENS)]  # a decode step of 8 sequences
        gpu.step([StepInput(q, rng.integers(0, 200, 1)) for q in seqs])
        decode = gpu.fwd.last_path
        os.environ["ZEROLAYER_CUDA_PREFILL_GEMM"] = "0"
        try:
            _, off = load_pair(override={"attn_v": QT.Q4_1})
        finally:
            del os.environ["ZEROLAYER_CUDA_PREFILL_GEMM"]
        return {"short": short, "decode": decode, "kernel_path": gpu.fwd.kernel_path,
                "switched_off": off.fwd.prefill_path}

    runs = {f"dequant_{n}": functools.partial(case_dequant, q) for n, q in (
        ("q4_1", QT.Q4_1), ("q4_0", QT.Q4_0), ("q4_k", QT.Q4_K), ("q8_0", QT.Q8_0),
        ("q5_1", QT.Q5_1), ("q6_k", QT.Q6_K), ("f16", QT.F16))}
    runs.update(to_half=case_to_half, gemm_f16=case_gemm,
                prefill_llama=lambda: case_prefill(greedy=8),
                prefill_qwen2_bias=lambda: case_prefill(qkv_bias=True, tied=True),
                short_steps_keep_their_path=case_short_steps)
    assert sorted(runs) == sorted(CASES)
    out = {}
    only = os.environ.get("ZEROLAYER_SIM_CASES")
    for name in (only.split(",") if only else CASES):
        try:
            out[name] = runs[name]()
        except Exception:
            out[name] = {"error": traceback.format_exc()}
        print(f"{name}: {out[name]}", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    _child()
