"""The GPU check's host side, without a GPU: the float64 reference it compares the CUDA
forward with (bench/gpu_ref64.py), and its report (bench/gpu_bench.py: the table with the
issue's targets, the peers' ratios from the same run, the sections' compile/run times) on
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
    """Weights in the kernels' layout, undone by gpu_ref64, give the logits that
    gpu/reference.py computes from the file itself (gguf's own dequantization), for a
    prompt and decode steps of two interleaved sequences."""
    from zerolayer.gpu import gguf_loader
    from zerolayer.gpu.reference import ReferenceLlama
    ref64 = _load("gpu_ref64")
    path = str(tmp_path / "m.gguf")
    write_tiny_llama(path, tied=True, qkv_bias=(kind == "qwen2_bias"))
    reader = gguf_loader.open_gguf(path)
    cfg = gguf_loader.read_config(reader)
    w = gguf_loader.load_weights(reader, cfg)
    ours = ref64.Reference64(cfg, w)
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
