#!/usr/bin/env python
"""What structured output costs decode: tok/s with and without a JSON-schema mask.

    .venv/bin/python bench/bench_structured.py [--rounds 7] [--tokens 48] [--out PATH]

The daemon's engine (daemon/engine.py) on the CPU runtime and the bundled model, as the
daemon runs it (its threads: ZEROLAYER_THREADS or the CPUs allowed), at batch 1 and batch 8:
B requests with the same chat prompt, greedy, max_tokens --tokens, submitted together; the
clock runs from the step after every request has its first token (prefill out of the
window) to the last token, and decode tok/s is the tokens sampled in that window over its
length. The masked runs carry a JSON schema (an array of at least 64 integers: no value can
complete within --tokens, so EOS is never allowed and every masked run decodes exactly
--tokens tokens under the mask, the whole way); the free runs take a prompt that runs on
(counting) and are dropped if EOS ends one early. Everything the mask costs is inside the
window: the matcher's mask per row per step (llguidance), the bit unpacking and -inf
fill before the sampler, and the matcher's advance; the grammar compile is not (once per
schema, cached, at submit).

Interleaved: each round measures free and masked at both batch sizes, alternating which
goes first, so drifting machine noise hits both. The host is shared: each run also counts
the CPU time other processes took while it ran (/proc/stat's busy time less this process's
own, as a share of all CPUs), and a pair (free and masked, back to back) in which either run
saw more than --max-foreign of the machine taken is left out; rounds go on until --rounds
clean pairs per batch size or 4 x --rounds rounds. The table gives medians over the clean
runs, the ratio of those medians and the median of the per-pair ratios. Only one benchmark
at a time: /tmp/zl-bench.lock, flock + lockf (_harness.bench_lock). Results: JSON
(default bench/results/structured-<ts>.json) and a markdown table on stdout.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _harness import bench_lock, git_head  # noqa: E402

from zerolayer.daemon.engine import Engine  # noqa: E402
from zerolayer.daemon.request import Admitted, DoneEvent  # noqa: E402
from zerolayer.gpu.generate import Generator  # noqa: E402
from zerolayer.protocol.constraint import from_response_format  # noqa: E402
from zerolayer.protocol.sampling_params import SamplingParams  # noqa: E402

SCHEMA = {"type": "array", "items": {"type": "integer"}, "minItems": 64}
PROMPT = [{"role": "user", "content": "Count from one to one thousand as a JSON array of "
                                      "integers: [1, 2, 3,"}]


def host() -> dict:
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in cpu.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    keep = [f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c")]
    git = git_head()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "gpu",
                            "daemon", "protocol"], capture_output=True, text=True).stdout
    return {"model": fields.get("Model name", "?").strip(), "cpus": os.cpu_count(),
            "flags": " ".join(keep), "git": git + ("+dirty" if dirty.strip() else ""),
            "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def _busy() -> tuple[float, float]:
    """(all CPUs' busy jiffies, this process's jiffies), from /proc."""
    f = open("/proc/stat").readline().split()[1:]
    v = [int(x) for x in f]
    busy = sum(v) - v[3] - v[4]  # less idle and iowait
    st = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    return float(busy), float(int(st[11]) + int(st[12]))  # utime + stime


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
        r = eng.submit(Admitted(key[0], SamplingParams(max_tokens=tokens,
                                                        constraint=c if masked else None)), ids)
        reqs.append(r)
    while not all(r.tokens or r.done for r in reqs):
        eng.step()
    n0, t0, b0 = sum(len(r.tokens) for r in reqs), time.perf_counter(), _busy()
    while eng.has_work:
        eng.step()
    t1, b1 = time.perf_counter(), _busy()
    n1 = sum(len(r.tokens) for r in reqs)
    if n1 != batch * tokens:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    foreign = ((b1[0] - b0[0]) - (b1[1] - b0[1])) / hz / ((t1 - t0) * (os.cpu_count() or 1))
    return (n1 - n0) / (t1 - t0), max(0.0, foreign)


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
        done: list = []
        eng = Engine(gen.model, gen.tokenizer, emit=lambda ev: done.append(ev)
                     if isinstance(ev, DoneEvent) else None, max_running=8, step_tokens=512)
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
                order = (False, True) if (rnd + b) % 2 else (True, False)
                got = {}
                for masked in order:
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
    h = host()
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    paired = {k: statistics.median(v) for k, v in pairs.items() if v}
    out = {"host": h, "args": vars(a), "threads": int(os.environ.get("ZEROLAYER_THREADS", 0))
           or len(os.sched_getaffinity(0)), "runs": runs, "median": med, "pairs": pairs,
           "paired_median": paired, "loadavg": [load0, load1], "dropped_pairs": dropped}
    path = Path(a.out) if a.out else REPO / "bench" / "results" / (
        f"structured-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"host: {h['model']} ({h['cpus']} CPUs; {h['flags']}), {h['date']}, git {h['git']}; "
          f"load average (1 min) {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; "
          f"{dropped} disturbed pairs left out (> {a.max_foreign:.0%} of the CPUs taken)")
    print("| batch | free tok/s | JSON-schema mask tok/s | mask / free (medians) | "
          "mask / free (paired, median) | clean pairs |")
    print("|---|---|---|---|---|---|")
    for b in (1, 8):
        f, m = med.get(f"free_b{b}"), med.get(f"mask_b{b}")
        ratio = f"{m / f:.3f}" if f and m else "-"
        pr = f"{paired[f'b{b}']:.3f}" if f"b{b}" in paired else "-"
        print(f"| {b} | {f or 0:.1f} | {m or 0:.1f} | {ratio} | {pr} | "
              f"{len(pairs[f'b{b}'])} |")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
