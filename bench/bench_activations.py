"""Decode and prefill speed of each CPU activation mode, on the same model and KV, interleaved;
see bench/README.md ("bench_activations.py").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from zerolayer.gpu.model import LlamaModel, set_threads
from zerolayer.gpu.model_api import StepInput

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import activation_wargs, bench_lock, command_line, machine_info, run_meta  # noqa: E402

from zerolayer.gpu.ops import cpu_features

PREFILLS = (100, 500)


def median_ms(n: int, once) -> float:
    """The median of n calls of once(), each returning the seconds it timed, in ms."""
    return statistics.median(once() for _ in range(n)) * 1e3


def one(path: str, modes: list[str], rounds: int, tokens: int) -> dict:
    m = LlamaModel.load(path, max_seq_len=1024)
    sides = {act: activation_wargs(m, act) for act in modes}
    seq = m.new_sequence()
    m.step([StepInput(seq, np.arange(1, 51, dtype=np.int32))])
    rng = np.random.default_rng(0)
    prompts = {n: rng.integers(1, m.cfg.vocab, n).astype(np.int32) for n in PREFILLS}
    reps = {"decode": tokens, **{f"pp{n}": max(1, tokens // (n // 100)) for n in PREFILLS}}

    def decode() -> float:
        seq.length = 50
        t = time.perf_counter()
        m.step([StepInput(seq, np.array([5], np.int32))])
        return time.perf_counter() - t

    def prefill(prompt: np.ndarray) -> float:
        s = m.new_sequence()
        t = time.perf_counter()
        m.step([StepInput(s, prompt)])
        dt = time.perf_counter() - t
        s.release()
        return dt

    def measure(act: str) -> dict[str, float]:
        m._wargs = sides[act]
        return {"decode": median_ms(reps["decode"], decode),
                **{f"pp{n}": median_ms(reps[f"pp{n}"], lambda n=n: prefill(prompts[n]))
                   for n in PREFILLS}}

    for act in modes:  # warm: compile and fault in every variant
        measure(act)
    samples: dict[str, dict[str, list[float]]] = {a: {k: [] for k in reps} for a in modes}
    for r in range(rounds):
        for act in modes[r % len(modes):] + modes[:r % len(modes)]:
            for k, v in measure(act).items():
                samples[act][k].append(v)
    med = {a: {k: statistics.median(v) for k, v in s.items()} for a, s in samples.items()}
    return {"model": path, "modes": modes, "rounds": rounds, "tokens": tokens,
            "kernels": cpu_features.ISA, "samples_ms": samples, "median_ms": med}


def render(res: list[dict]) -> str:
    lines = ["| model | activations | decode ms (tok/s) | pp100 ms | pp500 ms | decode / int16 "
             "| pp100 / int16 | pp500 / int16 |", "|---|---|---|---|---|---|---|---|"]
    for r in res:
        base = r["median_ms"]["int16"]
        for a, v in r["median_ms"].items():
            sp = {k: base[k] / v[k] for k in v}  # speed relative to int16: >1 faster
            lines.append(f"| {r['model'].rsplit('/', 1)[-1]} | {a} | {v['decode']:.2f} "
                         f"({1e3 / v['decode']:.1f}) | {v['pp100']:.1f} | {v['pp500']:.1f} | "
                         f"{sp['decode']:.3f}× | {sp['pp100']:.3f}× | {sp['pp500']:.3f}× |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--modes", default=",".join(cpu_features.ACT_MODES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--out", help="also write the samples as JSON")
    a = ap.parse_args()
    if not cpu_features.ISA:
        print("the float kernels have no activation modes", file=sys.stderr)
        return 1
    modes = a.modes.split(",")
    if "int16" not in modes:
        modes.insert(0, "int16")
    set_threads(2)
    with bench_lock(command_line()):
        res = [one(p, modes, a.rounds, a.tokens) for p in a.models]
    table = render(res)
    print(table)
    if a.out:
        meta = run_meta(machine=machine_info(), results=res, table=table)
        Path(a.out).write_text(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
