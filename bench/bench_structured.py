#!/usr/bin/env python
"""What structured output costs decode: tok/s with and without a JSON-schema mask.

    .venv/bin/python bench/bench_structured.py [--rounds 7] [--tokens 48] [--out PATH]

The daemon's engine (daemon/engine.py) on the CPU runtime and the bundled model, with the
daemon's threads (ZEROLAYER_THREADS or the CPUs allowed), at batch 1 and 8: B requests with
the same chat prompt, greedy, max_tokens --tokens, submitted together; the clock runs from
the step after every request has its first token (prefill out of the window) to the last
token; decode tok/s = the tokens sampled in that window / its length. The masked runs carry
a JSON schema (an array of at least 64 integers: nothing can complete within --tokens, so
EOS is never allowed and every masked run decodes --tokens tokens under the mask); the free
runs take a prompt that runs on (counting) and are dropped if EOS ends one early. Inside the
window: the matcher's mask per row per step (llguidance), the bit unpacking and -inf fill
before the sampler, the matcher's advance; not the grammar compile (once per schema, at
submit).

Interleaved: each round measures free and masked at both batch sizes, alternating which goes
first. A pair (free and masked, back to back) in which either run saw more than
--max-foreign of the machine taken by other processes (_harness.CpuWatch) is left out; rounds
go on until --rounds clean pairs per batch size or 4 x --rounds rounds. The table: medians
over the clean runs, their ratio and the median of the per-pair ratios. Holds
/tmp/zl-bench.lock; JSON (default bench/results/structured-<ts>.json) and a table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _harness import CpuWatch, bench_lock, git_head, machine_info, results_path, sh  # noqa: E402

from zerolayer.daemon.engine import Engine  # noqa: E402
from zerolayer.daemon.request import Admitted  # noqa: E402
from zerolayer.gpu.generate import Generator  # noqa: E402
from zerolayer.protocol.constraint import from_response_format  # noqa: E402
from zerolayer.protocol.sampling_params import SamplingParams  # noqa: E402

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
    watch = CpuWatch()
    n0, c0 = sum(len(r.tokens) for r in reqs), watch.snap()
    while eng.has_work:
        eng.step()
    c1 = watch.snap()
    n1 = sum(len(r.tokens) for r in reqs)
    if n1 != batch * tokens:
        return None
    return (n1 - n0) / (c1["t"] - c0["t"]), CpuWatch.foreign(c0, c1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--max-foreign", type=float, default=0.1)
    ap.add_argument("--out")
    a = ap.parse_args()
    with bench_lock(" ".join(sys.argv)):
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
    m = machine_info()
    dirty = sh(["git", "-C", str(REPO), "status", "--porcelain", "--", "gpu", "daemon", "protocol"])
    h = {"model": m["cpu_model"], "cpus": m["cpus"], "flags": " ".join(m["simd"]),
         "git": git_head() + ("+dirty" if dirty else ""),
         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    paired = {k: statistics.median(v) for k, v in pairs.items() if v}
    out = {"host": h, "machine": m, "args": vars(a), "threads":
           int(os.environ.get("ZEROLAYER_THREADS", 0)) or len(os.sched_getaffinity(0)),
           "runs": runs, "median": med, "pairs": pairs, "paired_median": paired,
           "loadavg": [load0, load1], "dropped_pairs": dropped}
    path = results_path(a.out, "structured")
    path.write_text(json.dumps(out, indent=1))
    print(f"host: {h['model']} ({h['cpus']} CPUs; {h['flags']}), {h['date']}, git {h['git']}; "
          f"load average (1 min) {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; "
          f"{dropped} disturbed pairs left out (> {a.max_foreign:.0%} of the CPUs taken)")
    print("| batch | free tok/s | JSON-schema mask tok/s | mask / free (medians) | "
          "mask / free (paired, median) | clean pairs |\n|---|---|---|---|---|---|")
    for b in (1, 8):
        f, mk = med.get(f"free_b{b}"), med.get(f"mask_b{b}")
        ratio = f"{mk / f:.3f}" if f and mk else "-"
        pr = f"{paired[f'b{b}']:.3f}" if f"b{b}" in paired else "-"
        print(f"| {b} | {f or 0:.1f} | {mk or 0:.1f} | {ratio} | {pr} | {len(pairs[f'b{b}'])} |")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
