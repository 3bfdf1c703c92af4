#!/usr/bin/env python
"""zerolayer vs llama.cpp's own `llama-bench` on the same GGUF, 2 threads each.

    .venv/bin/python bench/bench_runtime.py [--runs N] [--reps R] [--quick] [--out PATH]

The reference is the native llama-bench built by bench/setup_llamacpp.sh
(.bench-llamacpp/bin/llama-bench), run as

    llama-bench -m MODEL -t 2 -p 100,500 -n 32 -d 0,1000 -fa 0,1 -o jsonl -r R

(jsonl rather than json: the same fields, one row per line as each test finishes, so every row
gets its own noise accounting). Each llama-bench row is paired with our measurement of the same
thing; per row the baseline is the better of the two flash-attention modes:

| llama-bench row      | zerolayer                                                           |
|----------------------|---------------------------------------------------------------------|
| tg32, depth 0        | 32 greedy decode steps after a 50-token prompt (the issue's ctx 50) |
| tg32, depth 1000     | 32 greedy decode steps after a 1000-token prompt                    |
| pp100 / pp500, d 0   | one batched forward of a 100- / 500-token prompt, fresh sequence    |
| pp100 / pp500, d 1000| the same prompt appended to a sequence holding 1000 tokens          |

A decode step is one forward of one token plus, on our side, an argmax over the vocab
(llama-bench feeds random tokens and samples nothing). llama-bench's prompts are random token
ids, ours the tokenized CORPUS; its batch is one ubatch of <= 512 tokens, like our one step.
On top, ours only: aggregate decode tok/s at batch 8 (8 sequences with different 50-token
prompts, one step() for all 8) against our own batch 1, and the cold start to the first token
with a warm JIT cache (a fresh interpreter imports, loads, tokenizes, prints the first greedy
token; timed from just before the spawn to that stdout line).

How it keeps the comparison fair:

* llama-bench is a separate native process; ours runs in this one. Both get 2 threads.
* Rounds, interleaved: a round is one llama-bench invocation with -r R, and R samples of each
  of our measurements; which side goes first alternates from round to round, so drifting machine
  noise hits both. A round's value for a row is the median of its R samples (llama-bench's
  samples_ts; ours likewise); the table shows the medians over --runs rounds.
* The machine is small and shared. Before each llama-bench run and each of our measurements the
  script waits for the other processes to go quiet, and it counts the CPU time that processes
  other than the two runtimes (and steal time) take: per llama-bench row (between the arrival of
  its jsonl line and the previous one) and per sample of ours. A llama-bench row disturbed by more
  than --max-foreign of the machine is measured again in a llama-bench run of that row alone, a
  sample of ours again, up to --retries times; one still disturbed is left out, and a row left
  without a value for the round gets it in an extra round (at most 2 x --runs rounds).
* Only one benchmark at a time: the measurement part holds an exclusive lock on
  /tmp/zl-bench.lock (flock, plus a POSIX lockf on the same file, so a tool using either style
  excludes us); a run that finds it held waits and says who holds it.

Results: a JSON file (default bench/results/runtime-<timestamp>.json, gitignored) with every
llama-bench row and every sample, and a markdown table on stdout with the ratios ours /
llama-bench and which of the targets are met.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    LLAMA_BENCH,
    LOCK_PATH,
    REPO,
    RESULTS,
    CpuWatch,
    LlamaBenchCrash,
    bench_lock,
    command_line,
    git_head,
    gpu_source_hash,
    llama_bench_help,
    log,
    machine_info,
    run_llama_bench,
    sh,
    top_processes,
)

THREADS = 2
N_CTX = 2048  # room for the 1000-token context plus a 500-token prompt or the decode steps

TARGETS = {  # prefill 1.25x, cold start 1.5 s (the first targets were 1.0x and 3 s)
    "decode_ctx50": ("decode ctx 50 vs llama.cpp", ">=", 1.25),
    "decode_ctx1000": ("decode ctx 1000 vs llama.cpp", ">=", 1.25),
    "prefill_100": ("prefill 100 vs llama.cpp", ">=", 1.25),
    "prefill_500": ("prefill 500 vs llama.cpp", ">=", 1.25),
    # "batch 8 >= 4x batch 1" is retired: batching is judged against llama-server's serving
    # (bench_dataplane.py); the batch-8 row stays as information
    "cold_start": ("cold start to first token (s)", "<=", 1.5),
    "attn_scaling": ("decode ctx 50 / ctx 1000 slowdown", "<=", 1.5),
}

# Natural-ish text for the prompts; tokenized once, repeated to the longest prompt needed.
CORPUS = (
    "The history of computing spans several centuries, from mechanical calculators built by "
    "Pascal and Leibniz to Babbage's Analytical Engine, which Ada Lovelace described in notes "
    "that many consider the first program. In the twentieth century, vacuum tubes gave way to "
    "transistors and then to integrated circuits, and each step made machines smaller, faster "
    "and cheaper. Networks then tied these machines together, first in universities and "
    "laboratories, later in homes, and the web turned them into a shared library. "
    "A river starts as rain on a hillside. Water gathers in small channels, the channels join "
    "into streams, and the streams cut valleys as they run toward the sea. Along the way the "
    "river carries sand and stone, drops them where it slows, and builds new land at its mouth. "
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\nprint([fibonacci(i) for i in range(10)])\n"
    "Bread needs only flour, water, salt and yeast, but time and temperature decide its taste: "
    "a slow, cool rise gives the yeast and bacteria hours to make acids and aromas. "
)
COLD_PROMPT = "The capital of France is"

ZL_COLD = r"""
import time
t0 = time.perf_counter()
import json, os, sys
import numpy as np
from zerolayer.gpu.model import LlamaModel, StepInput, set_threads
from zerolayer.gpu.tokenizer import Tokenizer
t_import = time.perf_counter()
set_threads(int(sys.argv[3]))
m = LlamaModel.load(sys.argv[1], max_seq_len=int(sys.argv[4]))
t_load = time.perf_counter()
tk = m.tokenizer() if callable(getattr(m, "tokenizer", None)) else None
ids = (tk or Tokenizer.from_gguf(m.reader)).encode(sys.argv[2])
t_tok = time.perf_counter()
seq = m.new_sequence()
logits = m.step([StepInput(seq, np.array(ids, np.int32))])
tok = int(logits[0].argmax())
t_first = time.perf_counter()
print(tok, flush=True)
print(json.dumps({"token": tok, "prompt_tokens": len(ids), "import_s": t_import - t0,
                  "load_s": t_load - t_import, "tokenize_s": t_tok - t_load,
                  "first_step_s": t_first - t_tok, "in_process_total_s": t_first - t0,
                  "numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR"),
                  "tokenizer_from": "gguf" if tk is None else "model"}), flush=True)
"""


# ---------------------------------------------------------------- the two runtimes


class ZeroLayer:
    def __init__(self, path: str, threads: int):
        t0 = time.perf_counter()
        from zerolayer.gpu.model import LlamaModel, StepInput, set_threads
        from zerolayer.gpu.tokenizer import Tokenizer

        self.StepInput = StepInput
        self.threads = set_threads(threads)
        self.model = LlamaModel.load(path, max_seq_len=N_CTX)
        if callable(getattr(self.model, "tokenizer", None)):  # from the model's cached metadata
            self.tokenizer = self.model.tokenizer()
        else:  # the first API: build it from the GGUF reader
            self.tokenizer = Tokenizer.from_gguf(self.model.reader)
        self.load_s = time.perf_counter() - t0

    def _prefill(self, seq, prompt) -> np.ndarray:
        return self.model.step([self.StepInput(seq, np.asarray(prompt, np.int32))])

    def decode(self, prompt: list[int], steps: int) -> dict:
        seq = self.model.new_sequence()
        try:
            tok = int(self._prefill(seq, prompt)[0].argmax())
            out = [tok]
            t0 = time.perf_counter()
            for _ in range(steps):
                logits = self.model.step([self.StepInput(seq, np.array([tok], np.int32))])
                tok = int(logits[0].argmax())
                out.append(tok)
            dt = time.perf_counter() - t0
        finally:
            seq.release()
        return {"seconds": dt, "steps": steps, "tokens": out}

    def prefill(self, prompt: list[int], context: list[int] | None = None) -> dict:
        """One step of the whole prompt; with `context`, on a sequence that already holds it
        (appended untimed first: llama-bench's pp at depth)."""
        seq = self.model.new_sequence()
        try:
            if context:
                self._prefill(seq, context)
            t0 = time.perf_counter()
            tok = int(self._prefill(seq, prompt)[0].argmax())
            dt = time.perf_counter() - t0
        finally:
            seq.release()
        return {"seconds": dt, "tokens": len(prompt), "first_token": tok}

    def batch_decode(self, prompts: list[list[int]], steps: int) -> dict:
        seqs = [self.model.new_sequence() for _ in prompts]
        try:
            toks = np.array([int(self._prefill(s, p)[0].argmax()) for s, p in zip(seqs, prompts)],
                            np.int32)
            t0 = time.perf_counter()
            for _ in range(steps):
                logits = self.model.step([self.StepInput(s, toks[i:i + 1])
                                          for i, s in enumerate(seqs)])
                toks = logits.argmax(axis=1).astype(np.int32)
            dt = time.perf_counter() - t0
        finally:
            for s in seqs:
                s.release()
        return {"seconds": dt, "steps": steps, "batch": len(prompts)}


def cold_start(cmd: list[str]) -> dict:
    """Spawn `cmd`; seconds from just before the spawn to its first stdout line."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as errf:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True, cwd=str(REPO))
        first = p.stdout.readline()
        t1 = time.perf_counter()
        rest = p.stdout.read()  # (communicate() would skip what readline already buffered)
        p.wait(timeout=300)
        if p.returncode != 0 or not first.strip():
            errf.seek(0)
            raise RuntimeError(f"cold-start process failed (rc={p.returncode}): "
                               f"{errf.read().strip()[-2000:]}")
    res = {"seconds": t1 - t0, "token": int(first)}
    for line in rest.splitlines():
        if line.startswith("{"):
            res["breakdown"] = json.loads(line)
    return res


# ---------------------------------------------------------------- helpers


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": statistics.median(values), "min": min(values),
            "max": max(values), "values": values}


def verdict(key: str, value: float | None) -> dict:
    label, op, target = TARGETS[key]
    met = None if value is None else (value >= target if op == ">=" else value <= target)
    return {"label": label, "value": value, "op": op, "target": target, "met": met}


# ---------------------------------------------------------------- llama-bench

FA_NAMES = {-1: "auto", 0: "off", 1: "on"}


def fa_name(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (int, float)):
        return FA_NAMES.get(int(v), str(v))
    return {"enabled": "on", "disabled": "off"}.get(str(v), str(v))


def lb_key(row: dict) -> str:
    """The comparison row a llama-bench result belongs to: pp100_d0, tg32_d1000, ..."""
    if int(row["n_gen"]) == 0:
        return f"pp{int(row['n_prompt'])}_d{int(row['n_depth'])}"
    return f"tg{int(row['n_gen'])}_d{int(row['n_depth'])}"


def lb_side(row: dict) -> str:
    side = f"llama_bench_fa_{fa_name(row['flash_attn'])}"
    if "repack" in row:  # builds with --repack: weights repacked for the CPU's kernels (AMX...)
        side += f"_repack_{'on' if row['repack'] else 'off'}"
    return side


def _cpu_kernels() -> str:
    """The CPU matmul kernel set in use (gpu/ops/cpu_features.py; ZEROLAYER_CPU_KERNELS)."""
    from zerolayer.gpu.ops import cpu_features
    return cpu_features.describe()


def _load_ours(model_path: str):
    """Our runtime loaded and its kernels compiled (or loaded from the JIT cache), with the
    prompts every measurement uses: (zl, prompts, batch_prompts, jit_s, numba_info)."""
    log(f"loading zerolayer ({model_path})")
    zl = ZeroLayer(model_path, THREADS)
    pool = zl.tokenizer.encode(CORPUS)
    while len(pool) < 1000 + 8 * 64:
        pool = pool + pool
    prompts = {"ctx50": pool[:50], "ctx1000": pool[:1000], "p100": pool[100:200],
               "p500": pool[200:700]}
    batch_prompts = [pool[37 * i: 37 * i + 50] for i in range(8)]

    t0 = time.perf_counter()
    zl.decode(prompts["ctx50"], 2)
    zl.batch_decode(batch_prompts[:2], 1)
    zl.batch_decode(batch_prompts, 1)
    jit_s = time.perf_counter() - t0
    log(f"zerolayer first steps (JIT compile or cache load): {jit_s:.1f} s")
    import numba
    numba_info = {"numba": numba.__version__, "threading_layer": numba.threading_layer(),
                  "num_threads": numba.get_num_threads(),
                  "cache_dir": os.environ.get("NUMBA_CACHE_DIR"),
                  "cpu_kernels": _cpu_kernels(),
                  # NUMBA_CPU_NAME / NUMBA_CPU_FEATURES: what Numba compiles for (host if unset)
                  "numba_cpu_name": numba.config.CPU_NAME,
                  "numba_cpu_features": numba.config.CPU_FEATURES}
    return zl, prompts, batch_prompts, jit_s, numba_info


class Comparison:
    """One run: llama-bench and ours, in interleaved rounds, each sample checked for noise.

    samples[key][side] holds one value per round that has one (the median of its R samples);
    raw_lb and raw_zl every llama-bench row and every sample of ours, reruns included."""

    def __init__(self, args):
        self.args = args
        self.runs = args.runs or (2 if args.quick else 5)
        self.reps = args.reps or (1 if args.quick else 3)
        self.steps = 32  # decode steps per sample, llama-bench -n
        self.binary = Path(args.llama_bench)
        self.help_text = llama_bench_help(self.binary)
        self.depths = [0, 1000]
        if "--n-depth" not in self.help_text:
            log("WARNING: this llama-bench has no -d/--n-depth; only depth-0 rows are compared")
            self.depths = [0]
        v = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True,
                           timeout=60)
        self.version = (v.stdout + v.stderr).strip()
        from zerolayer.gpu.gguf_loader import default_model_path
        self.model_path = os.path.abspath(args.model or default_model_path())
        # --repack (llama.cpp's default: on) repacks the weights for the CPU's own kernels (on
        # an AMX machine: the AMX buffer type). Both modes are measured and the better taken
        # per row, like -fa; a row that crashes llama-bench in one mode (this llama.cpp's AMX
        # path dies of SIGSEGV on prompts of more than one token) is measured in the other
        # and reported.
        self.repacks = ([r for r in args.repack.split(",") if r]
                        if "--repack" in self.help_text else [])
        self.full_cmd = self.lb_cmd("100,500", str(self.steps), ",".join(map(str, self.depths)),
                                    args.fa)
        # one test per command: (p, n, d), for a mode that crashed on some test
        self.single_tests = [("0", str(self.steps), str(d)) for d in self.depths] + [
            (str(pp), "0", str(d)) for pp in (100, 500) for d in self.depths]
        log(f"llama-bench: {shlex.join(self.full_cmd)}"
            + (f", in each of --repack {', '.join(self.repacks)}" if self.repacks else ""))
        self.tg0, self.tg1000 = f"tg{self.steps}_d0", f"tg{self.steps}_d1000"
        self.watch = CpuWatch(children=True)  # the cold-start probes are ours
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.raw_lb: list[dict] = []
        self.raw_zl: list[dict] = []
        self.lb_runs: list[dict] = []
        self.excluded = {"llama_bench_rows": 0, "zerolayer_samples": 0}
        self.crashed: dict[str, dict] = {}  # "<test> repack <r>" -> the crash, once seen
        self.seen_cache: str | None = None

    def lb_cmd(self, p: str, n: str, d: str, fa: str, repack: str | None = None) -> list[str]:
        cmd = [str(self.binary), "-m", self.model_path, "-t", str(THREADS), "-p", p, "-n", n]
        if "--n-depth" in self.help_text:
            cmd += ["-d", d]
        if repack is not None:
            cmd += ["--repack", repack]
        return cmd + ["-fa", fa, "-o", "jsonl", "-r", str(self.reps)]

    # ------------------------------------------------------------ ours

    def load_ours(self) -> None:
        """Our runtime loaded and warm, and self.ours: key -> (thunk, kind), kind turning a
        result into a value (tok/s; cold: seconds)."""
        self.zl, self.prompts, batch, self.jit_s, self.numba_info = _load_ours(self.model_path)
        zl, pr, steps = self.zl, self.prompts, self.steps
        self.ours = {
            self.tg0: (lambda: zl.decode(pr["ctx50"], steps), "decode"),
            self.tg1000: (lambda: zl.decode(pr["ctx1000"], steps), "decode"),
            "pp100_d0": (lambda: zl.prefill(pr["p100"]), "prefill"),
            "pp500_d0": (lambda: zl.prefill(pr["p500"]), "prefill"),
            "pp100_d1000": (lambda: zl.prefill(pr["p100"], context=pr["ctx1000"]), "prefill"),
            "pp500_d1000": (lambda: zl.prefill(pr["p500"], context=pr["ctx1000"]), "prefill"),
            "batch8": (lambda: zl.batch_decode(batch, steps), "batch"),
            "cold_start": (self.zl_cold, "cold"),
        }
        if 1000 not in self.depths:
            for k in (self.tg1000, "pp100_d1000", "pp500_d1000"):
                self.ours.pop(k)
        if self.args.no_cold_start:
            self.ours.pop("cold_start")
        log("warm-up: each of our measurements once (llama-bench warms up each test itself)")
        for fn, _ in self.ours.values():
            fn()

    def zl_cold(self) -> dict:
        """A cold start with a warm JIT cache. If gpu/ changed since the last one (others may be
        editing the tree), the child compiled into a new cache dir: that run warmed the new
        cache, so run again and keep the second."""
        cmd = [sys.executable, "-c", ZL_COLD, self.model_path, COLD_PROMPT, str(THREADS),
               str(N_CTX)]
        r = cold_start(cmd)
        cache = r.get("breakdown", {}).get("numba_cache_dir")
        if self.seen_cache is not None and cache != self.seen_cache:
            log(f"  gpu/ changed: new JIT cache {cache}; that cold start ({r['seconds']:.1f} s) "
                "compiled, running it again")
            r = cold_start(cmd) | {"recompiled_run_s": r["seconds"]}
        self.seen_cache = cache
        return r

    @staticmethod
    def value(kind: str, r: dict) -> float:
        if kind == "decode":
            return r["steps"] / r["seconds"]
        if kind == "prefill":
            return r["tokens"] / r["seconds"]
        if kind == "batch":
            return r["batch"] * r["steps"] / r["seconds"]
        return r["seconds"]

    def add(self, key: str, side: str, v: float) -> None:
        self.samples.setdefault(key, {}).setdefault(side, []).append(v)

    def quiet(self) -> float:
        return self.watch.wait_quiet(self.args.max_foreign, self.args.max_wait)["waited_s"]

    def zl_round(self, rnd: int, keys: list[str]) -> None:
        a_ = self.args
        for key in keys:
            fn, kind = self.ours[key]
            waited = self.quiet()
            n_s = 1 if kind == "cold" else self.reps  # one cold start per round: it takes seconds
            good = []
            for s in range(n_s):
                for attempt in range(a_.retries + 1):
                    if attempt:
                        self.quiet()
                    a = self.watch.snap()
                    r = fn()
                    r["foreign_share"] = self.watch.foreign(a, self.watch.snap())
                    if r["foreign_share"] <= a_.max_foreign or attempt == a_.retries:
                        break
                    log(f"  zerolayer {key}: disturbed (other processes took "
                        f"{r['foreign_share']:.0%} of the machine); rerun")
                spoiled = r["foreign_share"] > a_.max_foreign
                self.excluded["zerolayer_samples"] += spoiled
                r["value"] = self.value(kind, r)
                if kind == "decode":
                    r.pop("tokens")  # the greedy ids: nothing to compare them with here
                self.raw_zl.append({"round": rnd, "metric": key, "sample": s,
                                    "attempts": attempt + 1, "waited_s": waited,
                                    "used": not spoiled, **r})
                if not spoiled:
                    good.append(r["value"])
                time.sleep(0.1)
            if good:
                self.add(key, "zerolayer", statistics.median(good))
        vals = ", ".join(f"{k}={self.samples[k]['zerolayer'][-1]:.3g}" for k in keys
                         if self.samples.get(k, {}).get("zerolayer"))
        log(f"round {rnd} zerolayer: {vals}")

    # ------------------------------------------------------------ llama-bench

    def lb_commands(self) -> list[tuple[list[str], tuple | None]]:
        """This round's llama-bench commands (each with its single test, or None for all)."""
        if not self.repacks:
            return [(self.full_cmd, None)]
        out = []
        for r in self.repacks:
            if not any(k.endswith(f" repack {r}") for k in self.crashed):
                out.append((self.full_cmd + ["--repack", r], None))
                continue
            for t in self.single_tests:
                if f"{'/'.join(t)} repack {r}" not in self.crashed:
                    out.append((self.lb_cmd(*t, self.args.fa, r), t))
        return out

    def lb_run(self, rnd: int, cmd: list[str], test) -> list[dict]:
        """One llama-bench command; a crash of a whole-set command is retried test by test
        (so one crashing test loses only itself), a crash of one test is recorded."""
        waited = self.quiet()
        try:
            rows, run = run_llama_bench(cmd, self.watch)
        except LlamaBenchCrash as e:
            r = cmd[cmd.index("--repack") + 1]
            if test is None:
                log(f"  llama-bench crashed with --repack {r}; running its tests one by one")
                self.crashed[f"all repack {r}"] = {"error": str(e).splitlines()[0]}
                return [row for t in self.single_tests
                        for row in self.lb_run(rnd, self.lb_cmd(*t, self.args.fa, r), t)]
            key = f"{'/'.join(test)} repack {r}"
            log(f"  llama-bench -p/-n/-d {'/'.join(test)} --repack {r}: crashed "
                f"({str(e).splitlines()[0][:60]}...); not measured in that mode")
            self.crashed[key] = {"round": rnd, "cmd": cmd, "error": str(e)[-600:]}
            return []
        self.lb_runs.append({"round": rnd, "cmd": cmd, "waited_s": waited, **run})
        return rows

    def lb_rerun(self, rnd: int, row: dict) -> dict:
        """A disturbed row measured again in a llama-bench run of that row alone."""
        cmd = self.lb_cmd(str(int(row["n_prompt"])), str(int(row["n_gen"])),
                          str(int(row["n_depth"])),
                          {"off": "0", "on": "1", "auto": "auto"}[fa_name(row["flash_attn"])],
                          str(int(row["repack"])) if "repack" in row else None)
        waited = self.quiet()
        one, run = run_llama_bench(cmd, self.watch)
        self.lb_runs.append({"round": rnd, "cmd": cmd, "waited_s": waited, **run})
        new = next(r for r in one if lb_key(r) == lb_key(row))
        new["foreign_share"] = max(new["foreign_share"], run["foreign_share"])
        return new

    def lb_round(self, rnd: int) -> None:
        a_ = self.args
        rows = [row for cmd, test in self.lb_commands() for row in self.lb_run(rnd, cmd, test)]
        for row in rows:
            attempt = 0
            while row["foreign_share"] > a_.max_foreign and attempt < a_.retries:
                attempt += 1
                log(f"  llama-bench {lb_key(row)} {lb_side(row)}: disturbed (other processes "
                    f"took {row['foreign_share']:.0%} of the machine); rerunning that row")
                self.raw_lb.append({"round": rnd, "attempt": attempt - 1, "used": False, **row})
                row = self.lb_rerun(rnd, row)
            spoiled = row["foreign_share"] > a_.max_foreign
            self.excluded["llama_bench_rows"] += spoiled
            self.raw_lb.append({"round": rnd, "attempt": attempt, "used": not spoiled, **row})
            if not spoiled:
                self.add(lb_key(row), lb_side(row), row["value"])
        took = sum(r["wall_s"] for r in self.lb_runs if r["round"] == rnd)
        vals = ", ".join(f"{lb_key(r)}/{fa_name(r['flash_attn'])}={r['value']:.1f}" for r in rows)
        log(f"round {rnd} llama-bench ({took:.0f} s): {vals}")

    # ------------------------------------------------------------ the rounds and the result

    def run_rounds(self) -> None:
        """Rounds, the side going first alternating, until every row has --runs values (at
        most 2 x --runs rounds)."""
        self.lb_keys_expected: set[tuple[str, str]] = set()
        rnd = 0
        t0 = time.perf_counter()
        while rnd < 2 * self.runs:
            lb_short = rnd == 0 or any(len(self.samples.get(k, {}).get(s, [])) < self.runs
                                       for k, s in self.lb_keys_expected)
            zl_short = [k for k in self.ours
                        if len(self.samples.get(k, {}).get("zerolayer", [])) < self.runs]
            if not lb_short and not zl_short:
                break
            order = ["llama-bench", "zerolayer"] if rnd % 2 == 0 else ["zerolayer", "llama-bench"]
            for who in order:
                if who == "llama-bench" and lb_short:
                    self.lb_round(rnd)
                    if rnd == 0:
                        self.lb_keys_expected = {(lb_key(r), lb_side(r)) for r in self.raw_lb}
                elif who == "zerolayer" and zl_short:
                    self.zl_round(rnd, zl_short)
                time.sleep(0.2)  # let the other side's threads stop spinning
            rnd += 1
        self.rounds_done, self.rounds_s = rnd, time.perf_counter() - t0

    def compare(self) -> dict:
        """stats, the best llama-bench mode per row, the ratios and the targets' verdicts."""
        stats = {k: {who: summary(v) for who, v in d.items() if v}
                 for k, d in self.samples.items()}
        lb_sides = sorted({s for d in stats.values() for s in d if s != "zerolayer"})

        def med(key, who):
            s = stats.get(key, {}).get(who)
            return s["median"] if s else None

        tg0, tg1000 = self.tg0, self.tg1000
        # a mode that crashed on any test is no peer (it could not serve the prompts), however
        # fast its other rows: the baseline is the best of the modes that completed every test
        serving = [s for s in lb_sides if not crashed_mode(s, self.crashed)]
        best_lb, ratios = {}, {}
        for key in [tg0, tg1000, "pp100_d0", "pp500_d0", "pp100_d1000", "pp500_d1000"]:
            cands = [(med(key, s), s) for s in serving if med(key, s) is not None]
            if cands:
                v, s = max(cands)
                best_lb[key] = {"side": s, "median": v}
            z, b = med(key, "zerolayer"), best_lb.get(key, {}).get("median")
            ratios[key] = z / b if z and b else None
            for s in lb_sides:
                l_ = med(key, s)
                ratios[f"{key}_vs_{s}"] = z / l_ if z and l_ else None
        z8, z1, z1000 = med("batch8", "zerolayer"), med(tg0, "zerolayer"), med(tg1000, "zerolayer")
        ratios["batch8_vs_own_batch1"] = z8 / z1 if z8 and z1 else None
        ratios["decode_short_over_ctx1000_zerolayer"] = z1 / z1000 if z1 and z1000 else None
        for s in lb_sides:
            l0, l1000 = med(tg0, s), med(tg1000, s)
            ratios[f"decode_short_over_ctx1000_{s}"] = l0 / l1000 if l0 and l1000 else None
        targets = {
            "decode_ctx50": verdict("decode_ctx50", ratios[tg0]),
            "decode_ctx1000": verdict("decode_ctx1000", ratios[tg1000]),
            "prefill_100": verdict("prefill_100", ratios["pp100_d0"]),
            "prefill_500": verdict("prefill_500", ratios["pp500_d0"]),
            "cold_start": verdict("cold_start", med("cold_start", "zerolayer")),
            "attn_scaling": verdict("attn_scaling",
                                    ratios["decode_short_over_ctx1000_zerolayer"]),
        }
        return {"stats": stats, "sides": ["zerolayer", *lb_sides], "best_llama_bench": best_lb,
                "ratios": ratios, "targets": targets}

    def short_of_runs(self) -> dict:
        runs, samples = self.runs, self.samples
        short = {f"{k}/{s}": len(v) for k, d in samples.items() for s, v in d.items()
                 if len(v) < runs}
        short |= {f"{k}/{s}": 0 for k, s in self.lb_keys_expected
                  if s not in samples.get(k, {})}
        if short:
            log(f"WARNING: fewer than {runs} undisturbed rounds for {short}")
        return short

    def llama_bench_info(self) -> dict:
        first = self.raw_lb[0] if self.raw_lb else {}
        return {"cmd": self.full_cmd, "repack_modes": self.repacks, "crashed": self.crashed,
                "binary": str(self.binary), "version": self.version,
                **{k: first.get(k) for k in ("build_commit", "build_number", "cpu_info",
                                             "backends", "n_batch", "n_ubatch", "type_k",
                                             "type_v")},
                "has_n_depth": "--n-depth" in self.help_text, "runs": self.lb_runs}


def _main_llama_bench(args, command: str, started: _dt.datetime, out_path: Path) -> int:
    loadavg0 = os.getloadavg()
    uptime0 = sh(["uptime"])
    log(f"uptime: {uptime0}")
    if loadavg0[0] > 0.5:
        log(f"WARNING: 1-min load average {loadavg0[0]:.2f} > 0.5; busy processes: {top_processes()}")
    from zerolayer.gpu import __version__ as zl_version
    src_hash0 = gpu_source_hash()
    head_at_start = git_head(short=False)
    git_dirty_gpu = sh(["git", "-C", str(REPO), "status", "--porcelain", "gpu"]).splitlines()

    c = Comparison(args)
    c.load_ours()
    c.run_rounds()
    short = c.short_of_runs()
    loadavg1 = os.getloadavg()
    src_hash1 = gpu_source_hash()
    if src_hash1 != src_hash0:
        log("WARNING: gpu/ sources changed during the run")
    compared = c.compare()
    result = {
        "schema": "zerolayer-bench-runtime/3",
        "reference": "llama-bench",
        "date": started.isoformat(timespec="seconds"),
        "command": command,
        "quick": args.quick,
        "runs": c.runs,
        "reps_per_round": c.reps,
        "rounds_done": c.rounds_done,
        "rounds_s": c.rounds_s,
        "decode_steps": c.steps,
        "threads": THREADS,
        "n_ctx": N_CTX,
        "llama_bench": c.llama_bench_info(),
        "model": {"path": c.model_path, "bytes": os.path.getsize(c.model_path),
                  "sha256": file_sha256(c.model_path)},
        "zerolayer_prompts": {"decode_short_ctx": len(c.prompts["ctx50"]),
                              "decode_long_ctx": len(c.prompts["ctx1000"]),
                              "depth_context": len(c.prompts["ctx1000"]), "batch8_each": 50},
        "cold_prompt": COLD_PROMPT,
        "sides": compared.pop("sides"),
        "baseline": "per row, the best of llama-bench's modes (flash attention, repack) in "
                    "`sides` that completed every test; a mode that crashed on any row is in "
                    "llama_bench.crashed and is never the baseline",
        "machine": machine_info() | {"uptime_before": uptime0, "loadavg_before": loadavg0,
                                     "loadavg_after": loadavg1},
        "lock": {"path": LOCK_PATH, "waited_s": getattr(args, "lock_wait_s", None)},
        "noise": {"max_foreign_share": args.max_foreign, "retries": args.retries,
                  "excluded": c.excluded, "short_of_runs": short,
                  "note": "foreign_share = CPU time of other processes + steal, as a share of all "
                          "CPUs: per llama-bench row since the previous row, per sample of ours"},
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "zerolayer": zl_version, **c.numba_info,
                     "git_head_at_start": head_at_start, "git_dirty_gpu_at_start": git_dirty_gpu,
                     "gpu_source_hash_start": src_hash0, "gpu_source_hash_end": src_hash1},
        "zerolayer_jit_first_steps_s": c.jit_s,
        "zerolayer_load_s": c.zl.load_s,
        **compared,
        "llama_bench_rows": c.raw_lb,
        "zerolayer_samples": c.raw_zl,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(render_llama_bench(result))
    print(f"\nJSON: {out_path}")
    return 0


def crashed_mode(side: str, crashed: dict) -> bool:
    """Whether llama-bench side `side` (..._repack_on / _repack_off) is a --repack mode that
    crashed on some test (crashed's keys end in "repack <0|1>")."""
    modes = {k.rsplit(" repack ", 1)[1] for k in crashed if " repack " in k}
    return any(side.endswith(f"_repack_{'on' if r == '1' else 'off'}") for r in modes)


def _signal_name(error: str) -> str:
    """"llama-bench failed (rc=-11): ..." -> "SIGSEGV"."""
    import re
    import signal
    m = re.search(r"rc=(-?\d+)", error)
    if not m:
        return "failed"
    try:
        return signal.Signals(-int(m.group(1))).name
    except ValueError:
        return f"rc {m.group(1)}"


def render_llama_bench(r: dict) -> str:
    st, ra, tg, best = r["stats"], r["ratios"], r["targets"], r["best_llama_bench"]
    lb_sides = [s for s in r["sides"] if s != "zerolayer"]
    n = r["decode_steps"]
    tg0, tg1000 = f"tg{n}_d0", f"tg{n}_d1000"
    short = r["zerolayer_prompts"]["decode_short_ctx"]

    def cell(key, who, fmt="{:.1f}"):
        s = st.get(key, {}).get(who)
        if not s:
            return "–"
        return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})"

    def rt(x, fmt="{:.2f}×"):
        return "–" if x is None else fmt.format(x)

    def mark(key):
        t = tg[key]
        return "–" if t["met"] is None else ("met" if t["met"] else "**missed**")

    rows = [  # key, label, target text, target key
        (tg0, f"decode tok/s, batch 1, {n} tokens at ctx 0 (llama-bench tg{n}) / {short} (ours)",
         "≥ 1.25×", "decode_ctx50"),
        (tg1000, f"decode tok/s, batch 1, {n} tokens at ctx 1000", "≥ 1.25×", "decode_ctx1000"),
        ("pp100_d0", "prefill tok/s, 100 tokens", "≥ 1.25×", "prefill_100"),
        ("pp500_d0", "prefill tok/s, 500 tokens", "≥ 1.25×", "prefill_500"),
        ("pp100_d1000", "prefill tok/s, 100 tokens after 1000", "", None),
        ("pp500_d1000", "prefill tok/s, 500 tokens after 1000", "", None),
    ]
    lb = r["llama_bench"]
    def side_name(side: str) -> str:  # llama_bench_fa_on_repack_off -> fa=on repack=off
        rest = side.removeprefix("llama_bench_")
        return "llama-bench " + " ".join("=".join(kv.split("_")) for kv in
                                         rest.replace("_repack", " repack").split(" "))

    head = " | ".join(side_name(s) for s in lb_sides)
    m = r["machine"]
    lines = [
        f"zerolayer vs llama.cpp llama-bench (build {lb.get('build_number')}, "
        f"{lb.get('build_commit')}), {r['threads']} threads each, "
        f"{r['model']['path'].rsplit('/', 1)[-1]}",
        f"{r['date']} · {m['cpu_model']} ({m['cpus']} CPUs, {m['hypervisor'] or 'bare metal'}) · "
        f"load avg before {m['loadavg_before'][0]:.2f}, after {m['loadavg_after'][0]:.2f} · "
        f"medians over {r['runs']} interleaved rounds (min–max of the round values), "
        f"each round's value the median of {r['reps_per_round']} samples",
        f"ours: {r['versions'].get('cpu_kernels', '?')}, compiled for "
        f"{r['versions'].get('numba_cpu_name') or 'this host'}",
        f"llama-bench: `{shlex.join(lb['cmd'])}`"
        + (f", in each of `--repack {','.join(lb['repack_modes'])}`"
           if lb.get("repack_modes") else ""),
        f"command: `{r['command']}`",
        "",
        f"| metric | zerolayer | {head} | ours / best llama-bench | target | |",
        "|---|---|" + "---|" * len(lb_sides) + "---|---|---|",
    ]
    for key, label, target, tkey in rows:
        if key not in st:
            continue
        b = best.get(key, {}).get("side")
        lls = " | ".join(cell(key, s) + (" ←" if s == b and len(lb_sides) > 1 else "")
                         for s in lb_sides)
        lines.append(f"| {label} | {cell(key, 'zerolayer')} | {lls} | {rt(ra.get(key))} | "
                     f"{target} | {mark(tkey) if tkey else ''} |")
    dash = " | ".join("–" for _ in lb_sides)
    if "batch8" in st:
        lines.append(f"| aggregate decode tok/s, batch 8, ctx {short} | {cell('batch8', 'zerolayer')} | "
                     f"{dash} | {rt(ra['batch8_vs_own_batch1'])} our batch 1 | retired (serving "
                     "aggregate instead) | |")
    if "cold_start" in st:
        lines.append(f"| cold start to first token, s (warm caches) | "
                     f"{cell('cold_start', 'zerolayer', '{:.2f}')} | {dash} | | ≤ 1.5 s | "
                     f"{mark('cold_start')} |")
    lls = " | ".join(rt(ra.get(f"decode_short_over_ctx1000_{s}")) for s in lb_sides)
    lines.append(f"| decode slowdown, short ctx → 1000 | "
                 f"{rt(ra.get('decode_short_over_ctx1000_zerolayer'))} | {lls} | | "
                 f"≤ 1.5× | {mark('attn_scaling')} |")
    lines.append("")
    if len(lb_sides) > 1:
        lines.append("← = llama-bench's best mode for that row that completed every test, "
                     "the one the ratio uses.")
    crashed = [k for k in sorted(lb.get("crashed", {})) if not k.startswith("all ")]
    if crashed:
        why = {_signal_name(lb["crashed"][k]["error"]) for k in crashed}
        gone = [s for s in lb_sides if crashed_mode(s, lb["crashed"])]
        lines.append(f"llama-bench died ({', '.join(sorted(why))}) on -p/-n/-d "
                     f"{'; '.join(crashed)}: not measured in those modes, and "
                     f"{', '.join(side_name(s) for s in gone)} is no baseline for any row "
                     "(a mode that crashes on prompts cannot serve).")
    met = [t["label"] for t in tg.values() if t["met"]]
    missed = [f"{t['label']}: {t['value']:.2f} (target {t['op']} {t['target']})"
              for t in tg.values() if t["met"] is False]
    lines.append(f"Targets met ({len(met)}/{len(tg)}): " + ("; ".join(met) or "none"))
    lines.append(f"Targets missed ({len(missed)}/{len(tg)}): " + ("; ".join(missed) or "none"))
    nz = r["noise"]
    ex = nz["excluded"]
    lines.append(f"Noise: {ex['llama_bench_rows']} llama-bench row(s) and {ex['zerolayer_samples']} "
                 f"sample(s) of ours left out (other processes took > {nz['max_foreign_share']:.0%} "
                 f"of the machine even after {nz['retries']} reruns); {r['rounds_done']} rounds"
                 + (f"; SHORT of {r['runs']} rounds: {nz['short_of_runs']}"
                    if nz["short_of_runs"] else "") + ".")
    if r.get("quick"):
        lines.append("QUICK RUN: smoke test only, not for publishing.")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=None,
                    help="interleaved rounds (default 5; --quick: 2)")
    ap.add_argument("--reps", type=int, default=None,
                    help="samples per round on each side, llama-bench -r (default 3; --quick: 1)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: fewer rounds / runs (not for publishing)")
    ap.add_argument("--out", default=None, help="JSON results path "
                    "(default bench/results/runtime-<timestamp>.json)")
    ap.add_argument("--model", default=None, help="GGUF path (default: the bundled SmolLM2-135M Q4_1)")
    ap.add_argument("--llama-bench", default=str(LLAMA_BENCH),
                    help="llama-bench binary (default .bench-llamacpp/bin/llama-bench, from "
                    "bench/setup_llamacpp.sh)")
    ap.add_argument("--fa", default="0,1",
                    help="llama-bench -fa: flash-attention modes, each row's baseline is the best "
                    "of them (default 0,1)")
    ap.add_argument("--repack", default="0,1",
                    help="llama-bench --repack modes to measure, best per row (default 0,1; "
                         "ignored by builds without --repack)")
    ap.add_argument("--no-cold-start", action="store_true",
                    help="skip our cold-start measurement")
    ap.add_argument("--max-foreign", type=float, default=0.05,
                    help="max share of the machine other processes may take during a sample "
                    "before it is rerun (default 0.05 = 10%% of one of 2 cores)")
    ap.add_argument("--retries", type=int, default=4, help="reruns of a disturbed sample (default 4)")
    ap.add_argument("--max-wait", type=float, default=None,
                    help="seconds to wait for a quiet machine before each sample "
                    "(default 120; --quick: 10)")
    args = ap.parse_args()
    command = command_line()
    if args.max_wait is None:
        args.max_wait = 10.0 if args.quick else 120.0
    started = _dt.datetime.now().astimezone()
    out_path = Path(args.out) if args.out else RESULTS / f"runtime-{started:%Y%m%d-%H%M%S}.json"
    if not os.access(args.llama_bench, os.X_OK):
        log(f"missing {args.llama_bench}: build it with bench/setup_llamacpp.sh "
            "(see bench/README.md)")
        return 2
    with bench_lock(command) as args.lock_wait_s:  # the whole run: loads and JIT compiles too
        return _main_llama_bench(args, command, started, out_path)


if __name__ == "__main__":
    sys.exit(main())
