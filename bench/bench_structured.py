#!/usr/bin/env python
"""What structured output costs decode: the engine's tok/s with and without a JSON-schema mask,
at batch 1 and 8, in clean interleaved pairs; see bench/README.md ("bench_structured.py").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

from zerolayer.daemon.engine import Engine
from zerolayer.daemon.request import Admitted
from zerolayer.gpu.generate import Generator
from zerolayer.protocol.constraint import from_response_format
from zerolayer.protocol.sampling_params import SamplingParams

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

SCHEMA = {"type": "array", "items": {"type": "integer"}, "minItems": 64}
PROMPT = [{"role": "user", "content": "Count from one to one thousand as a JSON array of "
                                      "integers: [1, 2, 3,"}]


def one(gen: Generator, eng: Engine, batch: int, masked: bool, tokens: int,
        key: list[int]) -> tuple[float, float] | None:
    """(decode tok/s, share of the machine other processes took meanwhile) of one batch, or
    None when a free run met EOS early."""
    ids = np.array(gen.tokenizer.encode_chat(PROMPT), np.int32)
    c = from_response_format({"type": "json_schema", "json_schema": {"name": "ints",
                                                                      "schema": SCHEMA}})
    reqs = []
    for _ in range(batch):
        key[0] += 1
        reqs.append(eng.submit(Admitted(key[0], SamplingParams(
            max_tokens=tokens, constraint=c if masked else None)), ids))
    while not all(r.tokens or r.done for r in reqs):
        eng.step()
    watch = H.CpuWatch()
    n0, c0 = sum(len(r.tokens) for r in reqs), watch.snap()
    while eng.has_work:
        eng.step()
    c1 = watch.snap()
    n1 = sum(len(r.tokens) for r in reqs)
    if n1 != batch * tokens:
        return None
    return (n1 - n0) / (c1["t"] - c0["t"]), H.CpuWatch.foreign(c0, c1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--max-foreign", type=float, default=0.1)
    ap.add_argument("--out")
    a = ap.parse_args()
    with H.bench_lock(" ".join(sys.argv)):
        load0 = os.getloadavg()
        gen = Generator.load(None, max_seq_len=2048)
        eng = Engine(gen.model, gen.tokenizer, emit=lambda ev: None, max_running=8,
                     step_tokens=512)
        key = [0]
        for b in (1, 8):  # warm-up: JIT, the grammar compiled and cached, the prefix cached
            one(gen, eng, b, True, 8, key)
            one(gen, eng, b, False, 8, key)
        runs: dict[str, list[float]] = {f"{m}_b{b}": [] for b in (1, 8) for m in ("free", "mask")}
        pairs: dict[str, list[float]] = {"b1": [], "b8": []}
        dropped = 0
        for rnd in range(4 * a.rounds):
            if all(len(v) >= a.rounds for v in pairs.values()):
                break
            for b in (1, 8):
                if len(pairs[f"b{b}"]) >= a.rounds:
                    continue
                got = {}
                for masked in (False, True) if (rnd + b) % 2 else (True, False):
                    v = one(gen, eng, b, masked, a.tokens, key)
                    if v is not None and v[1] <= a.max_foreign:
                        got[masked] = v[0]
                if len(got) < 2:
                    dropped += 1
                    continue
                runs[f"free_b{b}"].append(got[False])
                runs[f"mask_b{b}"].append(got[True])
                pairs[f"b{b}"].append(got[True] / got[False])
            print(f"round {rnd + 1}: clean pairs " + ", ".join(
                f"{k} {len(v)}" for k, v in pairs.items()) + f", dropped {dropped}",
                file=sys.stderr)
        load1 = os.getloadavg()
    m = H.machine_info()
    dirty = H.sh(["git", "-C", str(H.REPO), "status", "--porcelain", "--", "gpu", "daemon", "protocol"])
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    paired = {k: statistics.median(v) for k, v in pairs.items() if v}
    out = {**H.run_meta(dirty=bool(dirty)), "machine": m, "args": vars(a), "threads":
           int(os.environ.get("ZEROLAYER_THREADS", 0)) or len(os.sched_getaffinity(0)),
           "runs": runs, "median": med, "pairs": pairs, "paired_median": paired,
           "loadavg": [load0, load1], "dropped_pairs": dropped}
    path = H.results_path(a.out, "structured")
    path.write_text(json.dumps(out, indent=1))
    print(f"host: {m['cpu_model']} ({m['cpus']} CPUs; {' '.join(m['simd'])}), {out['date']}, "
          f"git {out['git']}{'+dirty' if dirty else ''}; load average (1 min) {load0[0]:.1f} "
          f"at the start, {load1[0]:.1f} at the end; {dropped} disturbed pairs left out "
          f"(> {a.max_foreign:.0%} of the CPUs taken)")
    rows = []
    for b in (1, 8):
        f, mk = med.get(f"free_b{b}"), med.get(f"mask_b{b}")
        rows.append([b, H.fmt(f), H.fmt(mk), H.fmt(mk / f if f and mk else None, ".3f"),
                     H.fmt(paired.get(f"b{b}"), ".3f"), len(pairs[f"b{b}"])])
    print(H.md_table(["batch", "free tok/s", "JSON-schema mask tok/s", "mask / free (medians)",
                    "mask / free (paired, median)", "clean pairs"], rows))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
