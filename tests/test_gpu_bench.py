"""The GPU check's host side, without a GPU: the float64 reference it compares the CUDA
forward with (tests/gpu_ref64.py), and its report (bench/gpu_bench.py: the table with the
GPU targets, the peers' ratios from the same run, the sections' compile/run times) on
results files shaped as a real run writes them. The check itself runs under the simulator
with `bench/gpu_bench.py --sim` (minutes, so not here) and on a GPU through
scripts/gpu-check.sh."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpu_ref64 import Reference64
from tiny_gguf import TINY, write_tiny_llama

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind", ["llama", "qwen2_bias"])
def test_reference64_equals_the_gguf_reference(tmp_path, kind):
    """Weights in the kernels' layout (repacked, rows reordered for qwen2's RoPE), undone by
    gpu_ref64, give the logits that gpu/reference.py computes from the file itself (gguf's
    own dequantization, the file's row order), for a prompt and decode steps of two
    interleaved sequences: the same float64 forward, so this checks the undoing."""
    from zerolayer.gpu import gguf_loader
    from zerolayer.gpu.reference import ReferenceLlama
    path = str(tmp_path / "m.gguf")
    write_tiny_llama(path, tied=True, qkv_bias=(kind == "qwen2_bias"))
    reader = gguf_loader.open_gguf(path)
    cfg = gguf_loader.read_config(reader)
    w = gguf_loader.load_weights(reader, cfg)
    ours = Reference64(cfg, w)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, TINY["vocab"], 9), rng.integers(0, TINY["vocab"], 4)]
    refs = [ReferenceLlama(reader, cfg) for _ in prompts]
    seqs = [ours.new_sequence() for _ in prompts]
    got = ours.step(list(zip(seqs, prompts)))
    want = np.stack([[r.step(int(t)) for t in p][-1] for r, p in zip(refs, prompts)])
    errs = [float(np.abs(got - want).max() / np.abs(want).max())]
    for _ in range(3):
        toks = rng.integers(0, TINY["vocab"], 2)
        got = ours.step([(s, toks[i:i + 1]) for i, s in enumerate(seqs)])
        want = np.stack([r.step(int(t)) for r, t in zip(refs, toks)])
        errs.append(float(np.abs(got - want).max() / np.abs(want).max()))
    assert max(errs) < 1e-9, errs


def _decode(batch: int, wall: float, dev: float | None) -> dict:
    """A decode section as gpu_bench.decode records it (split() does the arithmetic)."""
    gb = _load("gpu_bench")

    class _Gate:
        ok, why = dev is not None, "simulator: no device timing"
    out = gb.split([wall] * 3, [] if dev is None else [dev] * 3, [] if dev is None else [20.0] * 3,
                   batch, _Gate())
    return {"ok": True, "batch": batch, "s": 1.0, "compile_s": 0.2, **out}


def _results(ttft: bool = True) -> dict:
    s = {"env": {"ok": True, "gpu": "NVIDIA H200", "cc": [9, 0], "sms": 132, "s": 0.1},
         "compile": {"ok": True, "workers": 14, "jobs": 34, "done": 34, "failed": [], "wall_s": 30.0,
                     "job_s_sum": 200.0, "s": 29.0, "compile_s": 0.0},
         "decode_b1": _decode(1, 500.0, 400.0), "decode_b16": _decode(16, 800.0, 700.0),
         "decode_b64": _decode(64, 1600.0, None), "decode_b1_topk": _decode(1, 520.0, 410.0),
         "prefill": {**_decode(512, 4096.0, 4000.0), "tokens": 512},
         "sampler": {"ok": True, "b1": {"topk_device_us": 25.0, "greedy_device_us": 12.0,
                                        "topk_wall_us": 60.0, "greedy_wall_us": 40.0}, "s": 1.0},
         "ops": {"ok": True, "nodes_per_step": 62, "nodes_source": "nodes of the captured graph",
                 "s": 1.0},
         "stages": {"ok": True, "b1": {"plan_bytes": 100_000_000}, "s": 1.0},
         "forward": {"ok": True, "err": 2e-5, "tol": 1e-3, "per_step_err": [2e-5, 1e-5], "s": 1.0},
         "kernels": {"ok": False, "error": "Traceback ...", "s": 3.0},
         "ttft": ({"ok": True, "ttft_ms_p50": 1.5, "ttft_ms_p90": 2.5, "prompt_tokens": 32, "s": 9.0}
                  if ttft else {"skipped": "time budget spent"})}
    return {"sections": s}


PEER = {"device": "NVIDIA H200", "torch": "2.11.0", "sections": {
    "torch_graph": {"ok": True, "b1": {"us_per_token": 3000.0, "tok_s": 333.3},
                    "b16": {"tok_s": 4000.0}, "b64": {"tok_s": 10000.0},
                    "prefill": {"tokens": 512, "tok_s": 50000.0}, "s": 5.0},
    "hf_eager": {"ok": True, "b1": {"tok_s": 28.0}, "b16": {"tok_s": 420.0}, "s": 10.0}}}


def test_report_rows_targets_and_peer_ratios():
    gb = _load("gpu_bench")
    rows = {r["metric"]: r for r in gb.report(_results(), PEER, total_s=230.0)}
    b1 = rows["decode b1 (us/token)"]
    assert b1["ours"] == 500.0 and b1["peer"] == 3000.0 and b1["x_peer"] == pytest.approx(6.0)
    assert b1["met"] == "NO"  # 500 us > 250 us, and 6x < 12x
    assert "device 400" in b1["ours_txt"] and "host 100" in b1["ours_txt"]
    b16 = rows["decode b16 (tok/s)"]
    assert b16["ours"] == pytest.approx(16 / 800e-6) and b16["x_peer"] == pytest.approx(20000 / 4000)
    assert b16["met"] == "NO"  # 20,000 tok/s < 40,000
    b64 = rows["decode b64 (tok/s)"]
    assert b64["met"] == "-" and b64["x_peer"] == pytest.approx(40000 / 10000)
    assert "device -" in b64["ours_txt"]  # no device time: said, not invented
    assert rows["prefill 512 (tok/s)"]["met"] == "yes"  # 125,000 >= 100,000
    assert rows["kernel nodes per decode step"]["met"] == "yes"
    assert rows["device sampler top-k/top-p, b1 (us)"]["met"] == "yes"
    assert rows["device sampler greedy, b1 (us)"]["met"] == "NO"  # 12 us > 10 us
    assert rows["vs HF eager generate, b1 (tok/s)"]["x_peer"] == pytest.approx(2000 / 28)
    assert rows["TTFT packet->first frame (ms)"]["met"] == "yes"
    assert rows["one-shot check (s)"]["met"] == "yes"
    # the plan's bytes over the measured device time of a step: 100 MB / 400 us
    assert rows["decode b1 bytes moved / device time (GB/s)"]["ours"] == pytest.approx(250.0)


def test_report_without_peer_or_skipped_sections():
    gb = _load("gpu_bench")
    rows = {r["metric"]: r for r in gb.report(_results(ttft=False), None)}
    assert rows["decode b1 (us/token)"]["peer"] is None and rows["decode b1 (us/token)"]["x_peer"] is None
    assert rows["decode b1 (us/token)"]["met"] == "NO"  # the absolute target alone
    assert rows["TTFT packet->first frame (ms)"]["ours_txt"] == "skipped (time budget spent)"
    assert rows["one-shot check (s)"]["met"] == "-"
    text = gb.table(_results(ttft=False), None)
    assert "kernels vs CPU twins  ERROR" in text and "peer: not run" in text


def test_table_mode_reads_a_runs_files(tmp_path):
    (tmp_path / "gpu_check.json").write_text(json.dumps(_results()))
    (tmp_path / "gpu_peer.json").write_text(json.dumps(PEER))
    out = subprocess.run([sys.executable, str(BENCH / "gpu_bench.py"), "--table", str(tmp_path),
                          "--total-s", "231"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "speed x peer" in out.stdout and "6.00x" in out.stdout and "231 s" in out.stdout
    rep = json.loads((tmp_path / "gpu_check_report.json").read_text())
    assert rep["total_s"] == 231 and any(r["metric"].startswith("decode b1") for r in rep["rows"])


def test_sections_record_compile_and_run_time_and_respect_the_budget(tmp_path):
    gb = _load("gpu_bench")
    run = gb.Run(budget_s=60)
    run.path = tmp_path / "gpu_check.json"

    class Clock:
        total = 0.0
    run.clock = Clock()

    def compiles():
        run.clock.total += 0.5  # as the compiler-lock listener would count it
        return {"x": 1}
    run.section("a", compiles)
    run.section("b", lambda: 1 / 0)
    saved = json.loads(run.path.read_text())["sections"]  # written after every section
    assert saved["a"]["ok"] and saved["a"]["x"] == 1 and saved["a"]["compile_s"] == 0.5
    assert saved["a"]["run_s"] == pytest.approx(saved["a"]["s"] - 0.5, abs=0.02)
    assert saved["b"]["ok"] is False and "ZeroDivisionError" in saved["b"]["error"]
    run.budget_s = 0
    assert run.section("c", compiles) is None
    assert run.results["sections"]["c"] == {"skipped": "time budget spent"}


def test_nodes_per_step_prefers_what_the_model_says():
    gb = _load("gpu_bench")

    class Fwd:
        def nodes_per_step(self, T):
            return 40 + T

    class A:
        fwd, _graphs = Fwd(), {}

    class B:
        plan, _graphs = list(range(17)), {}

    class C:
        pass
    assert gb.nodes_per_step(A(), 1, 30) == (41, "CudaForward.nodes_per_step")
    assert gb.nodes_per_step(B(), 1, 30) == (17, "CudaModel.plan")
    assert gb.nodes_per_step(C(), 1, 30) == (None, "unknown")


def test_compile_pool_takes_every_job_once(tmp_path):
    """The compile pool (gpu_warm.py) in its no-GPU mode: sm_90 PTX of two small kernels and
    one CPU-twin job by two workers, each job claimed by one worker and reported."""
    env_code = ("import sys, json; sys.path.insert(0, %r); import gpu_warm; "
                "p = gpu_warm.Pool.start(2, 'ptx', ['bench.empty', 'rmsnorm._rmsnorm', 'cpu:elementwise']); "
                "print(json.dumps(p.wait(240)))" % str(BENCH))
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("ZEROLAYER_GPU_BACKEND", "NUMBA_ENABLE_CUDASIM")}
    env["ZEROLAYER_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-c", env_code], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads(out.stdout.strip().splitlines()[-1])
    assert (rep["jobs"], rep["done"], rep["failed"], rep["not_done"]) == (3, 3, [], []), rep
    assert rep["workers"] == 2 and not rep["worker_logs"]
    assert {r["job"] for r in rep["slowest"]} == {"bench.empty", "rmsnorm._rmsnorm", "cpu:elementwise"}


def _torch_python() -> str | None:
    """A Python with torch and transformers: ZEROLAYER_PEER_PYTHON, or this one."""
    import os
    for py in (os.environ.get("ZEROLAYER_PEER_PYTHON"), sys.executable):
        if py and subprocess.run([py, "-c", "import torch, transformers"],
                                 capture_output=True).returncode == 0:
            return py
    return None


def test_peer_logic_on_the_cpu(tmp_path):
    """gpu_peer.py at tiny shapes on the CPU: the plain model equals HF's Llama with the same
    weights, decode through the static cache equals prefill, and every section reports."""
    py = _torch_python()
    if py is None:
        pytest.skip("no torch + transformers here (ZEROLAYER_PEER_PYTHON names one elsewhere)")
    out = subprocess.run([py, str(BENCH / "gpu_peer.py"), "--device", "cpu", "--tiny", "--out",
                          str(tmp_path), "--budget-s", "600"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_peer.json").read_text())
    s = res["sections"]
    assert s["agree"]["plain_vs_hf"] <= s["agree"]["tol"] and s["agree"]["same_argmax_hf"]
    assert {"b1", "b4", "prefill"} <= set(s["torch_graph"]) and s["torch_graph"]["graphs"] is False
    assert {"b1", "b4"} <= set(s["hf_eager"])


def test_workers_compile_under_the_key_a_launch_looks_up():
    """numba-cuda's cache index is keyed on the signature exactly as compile() got it; a launch
    passes a tuple of argument types, so the workers must too (a string never matches)."""
    code = ("import sys, numpy as np; sys.path.insert(0, %r); import gpu_warm; "
            "k, sigs = gpu_warm.registry()['rmsnorm._rmsnorm']; x = np.zeros((2, 4), np.float32); "
            "args = (x, np.zeros(4, np.float32), np.float32(1e-5), x); "
            "print(gpu_warm.launch_key(sigs[0]) == tuple(k.typeof_pyval(a) for a in args))" % str(BENCH))
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("ZEROLAYER_GPU_BACKEND", "NUMBA_ENABLE_CUDASIM")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stderr[-2000:]


def test_ttft_section_fails_as_soon_as_the_daemon_exits(monkeypatch):
    """A daemon that cannot load its engine (here: the cuda backend without a GPU) ends the
    TTFT section with its exit status and log tail, instead of waiting out the bound."""
    from zerolayer.gpu import backend
    if backend.probe_cuda()[0]:
        pytest.skip("this machine has a GPU: the cuda backend would load")
    gb = _load("gpu_bench")
    monkeypatch.setenv("ZEROLAYER_GPU_BACKEND", "cuda")
    with pytest.raises(RuntimeError) as e:
        gb.daemon_ttft(TINY, False, 600.0)
    msg = str(e.value)
    assert "zerolayerd exited with status 2 before it was ready" in msg, msg
    assert "no CUDA" in msg  # the daemon's own words, from its log


def test_a_section_killed_by_the_time_limit_is_recorded(tmp_path):
    gb = _load("gpu_bench")
    run = gb.Run(budget_s=60)
    run.path = tmp_path / "gpu_check.json"

    def killed():
        raise SystemExit(143)  # what gpu_bench's SIGTERM handler raises
    with pytest.raises(SystemExit):
        run.section("ttft", killed)
    saved = json.loads(run.path.read_text())["sections"]
    assert saved["ttft"]["ok"] is False and "killed" in saved["ttft"]["error"]


def test_each_section_names_the_kernel_path_it_timed(tmp_path):
    """A barrier failure mid-run turns the fused kernel off: the section it happened in says
    the path changed, the later ones name the per-op path, and the table lists them."""
    gb = _load("gpu_bench")
    run = gb.Run(budget_s=60)
    run.path = tmp_path / "gpu_check.json"
    path = ["fused step kernel"]
    run.kernel_path = lambda: path[0]
    run.section("decode_b1", lambda: {"us_per_token": 900.0})

    def fails_over():
        path[0] = "per-op launches (the fused kernel's grid barrier failed)"
        return {}
    run.section("decode_b16", fails_over)
    run.section("prefill", dict)
    secs = run.results["sections"]
    assert secs["decode_b1"]["kernel_path"] == "fused step kernel"
    assert secs["decode_b16"]["kernel_path"] == (
        "changed during the section: fused step kernel -> per-op launches (the fused "
        "kernel's grid barrier failed)")
    assert secs["prefill"]["kernel_path"].startswith("per-op launches")
    summary = dict(gb.checks_summary(run.results))
    assert "decode_b16: changed during the section" in summary["kernel path"]
    assert "prefill: per-op launches" in summary["kernel path"]
    assert "decode_b1:" not in summary["kernel path"]


def test_table_shows_the_cuts_the_barrier_selftest_and_predicted_beside_measured():
    gb = _load("gpu_bench")
    res = _results()
    s = res["sections"]
    cut = {"launches": 1, "kernel_path": "fused step kernel", "us_per_token": 300.0}
    s["step_cuts"] = {"ok": True, "step": cut, "layer": dict(cut, launches=32, us_per_token=400.0),
                      "stage": dict(cut, launches=152, us_per_token=900.0,
                                    kernel_path="per-op launches (x)")}
    s["grid_barrier"] = {"ok": True, "blocks": 132, "max_cooperative_blocks": 132, "runs": []}
    s["stages"]["b1"]["kinds"] = {"A qkv+rope+kv": {"us": 40.0, "predicted_us": 139.5},
                                  "lm head+argmax": {"us": 20.0, "predicted_us": None}}
    summary = dict(gb.checks_summary(res))
    assert summary["step cuts, b1"] == ("step (1 launches): 300 us/token; layer (32 launches): "
                                        "400 us/token; stage (152 launches): 900 us/token "
                                        "[per-op launches (x)]")
    assert summary["grid barrier test"].startswith("OK over 132 blocks")
    assert summary["stages b1 vs model"] == "A qkv+rope+kv 40 (140), lm head+argmax 20 (-)"
    assert "step cuts, b1" in gb.table(res, PEER)


def test_table_shows_both_prefill_paths_their_agreement_and_the_prediction():
    """The prefill sections: the default path (cuBLAS) with its target, the token tiles
    beside it, the model's prediction labelled as one, and the two paths' logits compared;
    each names the path it timed."""
    gb = _load("gpu_bench")
    res = _results()
    s = res["sections"]
    s["prefill"]["kernel_path"] = "cuBLAS float16 GEMMs on tensor cores for steps of >= 64 tokens"
    s["prefill_tiles"] = {**_decode(512, 25600.0, 25000.0), "tokens": 512,
                          "kernel_path": "fused step kernel"}
    s["prefill_predicted"] = {"ok": True, "device": "H200", "tokens": 512, "predicted_tok_s": 47059.0,
                              "predicted_device_us": 560.0, "predicted_host_us": 10880.0, "s": 0.1}
    s["prefill_paths"] = {"ok": True, "tokens": 512, "rel_err": 3e-3, "tol": 2e-2, "same_token": True,
                          "failed": False, "s": 1.0}
    rows = {r["metric"]: r for r in gb.report(res, PEER)}
    assert rows["prefill 512 on token tiles (tok/s)"]["ours"] == pytest.approx(512 / 25600e-6)
    pred = rows["prefill 512 cuBLAS, a model's prediction (tok/s)"]
    assert pred["ours"] == 47059.0 and "predicted on H200" in pred["ours_txt"]
    summary = dict(gb.checks_summary(res))
    assert summary["prefill cuBLAS/tiles"] == "512 tokens: rel err 3.0e-03 (tol 0.02), same token True"
    assert "prefill: cuBLAS float16 GEMMs" in summary["kernel path"]
    assert "prefill_tiles" not in summary["kernel path"]  # it ran on the fused kernel
    res2 = _results()
    res2["sections"]["prefill_paths"] = {"ok": True, "failed": True, "tokens": 512, "rel_err": 0.5,
                                         "tol": 2e-2, "same_token": False}
    assert "rel err 5.0e-01" in dict(gb.checks_summary(res2))["prefill cuBLAS/tiles"]
    s["forward_cublas"] = {"ok": True, "err": 4e-3, "tol": 2e-2, "per_step_err": [4e-3, 1e-3], "s": 1.0}
    summary = dict(gb.checks_summary(res))
    assert summary["forward cuBLAS/fp64"] == "max rel err 4.0e-03 (tol 0.02), per step 4.0e-03, 1.0e-03"
    assert summary["forward vs float64"].startswith("max rel err 2.0e-05 (tol 0.001)")
