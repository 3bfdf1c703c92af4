"""Decode from the layout cache's file mapping (model.prepared) vs from the resident copy the
forward uses, interleaved on the same model and KV; see bench/README.md ("bench_resident.py").
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from zerolayer.gpu.model import LlamaModel, set_threads
from zerolayer.gpu.model_api import StepInput

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import with_matmuls  # noqa: E402


def smaps() -> dict:
    keys = ("Rss", "AnonHugePages", "FilePmdMapped")
    with open("/proc/self/smaps_rollup") as f:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in f) if k in keys}


def one(path: str, rounds: int, tokens: int) -> None:
    m = LlamaModel.load(path, max_seq_len=256)
    if not isinstance(m.prepared["wgu"].qs, np.memmap):
        raise SystemExit(f"{path}: the layout cache was built by this run; run again")
    mapped = with_matmuls(m, lambda name: m.prepared[name]._replace(lf=m.prepared[name].layers()))
    sides = {"resident": m._wargs, "mapped": mapped}
    seq = m.new_sequence()

    def token_ms(wargs, n: int) -> float:
        m._wargs = wargs
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            m.step([StepInput(seq, np.array([5], np.int32))])
            ts.append(time.perf_counter() - t)
            if seq.length > 200:  # stay shallow: rewrite the same KV positions
                seq.length = 1
        return statistics.median(ts) * 1e3

    for w in sides.values():
        token_ms(w, 3)
    res: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        for k in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            res[k].append(token_ms(sides[k], tokens))
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"{path}: ms a token, median of {rounds} rounds x {tokens}: resident "
          f"{med['resident']:.2f}, mapped {med['mapped']:.2f} (resident/mapped "
          f"{med['resident'] / med['mapped']:.3f}); {smaps()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args()
    set_threads(2)
    for p in a.models:
        one(p, a.rounds, a.tokens)


if __name__ == "__main__":
    main()
