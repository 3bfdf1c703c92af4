#!/usr/bin/env python
"""zerolayer vs llama.cpp's own `llama-bench` on the same GGUF, 2 threads each: what each row
measures and how the comparison is kept fair, in bench/README.md ("bench_runtime.py").
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import shlex
import signal
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
    CpuWatch,
    LlamaBenchCrash,
    bench_lock,
    command_line,
    git_head,
    gpu_source_hash,
    llama_bench_help,
    log,
    machine_info,
    results_path,
    run_llama_bench,
    sh,
    timed_decode,
    top_processes,
)

THREADS = 2
N_CTX = 2048  # room for the 1000-token context plus a 500-token prompt or the decode steps
STEPS = 32    # decode steps per sample, llama-bench -n
TG0, TG1000 = f"tg{STEPS}_d0", f"tg{STEPS}_d1000"
PEER_KEYS = [TG0, TG1000, "pp100_d0", "pp500_d0", "pp100_d1000", "pp500_d1000"]

# target key -> (label, op, target, what it judges: a key of the ratios, or a stat of ours)
TARGETS = {
    "decode_ctx50": ("decode ctx 50 vs llama.cpp", ">=", 1.25, TG0),
    "decode_ctx1000": ("decode ctx 1000 vs llama.cpp", ">=", 1.25, TG1000),
    "prefill_100": ("prefill 100 vs llama.cpp", ">=", 1.25, "pp100_d0"),
    "prefill_500": ("prefill 500 vs llama.cpp", ">=", 1.25, "pp500_d0"),
    # batching is judged against llama-server's serving (bench_dataplane.py): the batch-8 row
    # is information only
    "cold_start": ("cold start to first token (s)", "<=", 1.5, "cold_start"),
    "attn_scaling": ("decode ctx 50 / ctx 1000 slowdown", "<=", 1.5,
                     "decode_short_over_ctx1000_zerolayer"),
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
t_import = time.perf_counter()
set_threads(int(sys.argv[3]))
m = LlamaModel.load(sys.argv[1], max_seq_len=int(sys.argv[4]))
t_load = time.perf_counter()
ids = m.tokenizer().encode(sys.argv[2])
t_tok = time.perf_counter()
logits = m.step([StepInput(m.new_sequence(), np.array(ids, np.int32))])
tok = int(logits[0].argmax())
t_first = time.perf_counter()
print(tok, flush=True)
print(json.dumps({"token": tok, "prompt_tokens": len(ids), "import_s": t_import - t0,
                  "load_s": t_load - t_import, "tokenize_s": t_tok - t_load,
                  "first_step_s": t_first - t_tok, "in_process_total_s": t_first - t0,
                  "numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR")}), flush=True)
"""


# ---------------------------------------------------------------- ours


def prefill(model, prompt: list[int], context: list[int] | None = None) -> dict:
    """One step of the whole prompt; with `context`, on a sequence that already holds it
    (appended untimed first: llama-bench's pp at depth)."""
    from zerolayer.gpu.model import StepInput
    seq = model.new_sequence()
    try:
        if context:
            model.step([StepInput(seq, np.asarray(context, np.int32))])
        t0 = time.perf_counter()
        tok = int(model.step([StepInput(seq, np.asarray(prompt, np.int32))])[0].argmax())
        dt = time.perf_counter() - t0
    finally:
        seq.release()
    return {"seconds": dt, "tokens": len(prompt), "first_token": tok, "value": len(prompt) / dt}


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
    res = {"seconds": t1 - t0, "token": int(first), "value": t1 - t0}
    for line in rest.splitlines():
        if line.startswith("{"):
            res["breakdown"] = json.loads(line)
    return res


def summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": statistics.median(values), "min": min(values),
            "max": max(values), "values": values}


# ---------------------------------------------------------------- llama-bench rows


def fa_name(v) -> str:
    """llama-bench's flash_attn field (a bool, -1/0/1 or a word, by build) as off/on/auto."""
    if isinstance(v, (int, float)):  # bool included
        return {-1: "auto", 0: "off", 1: "on"}.get(int(v), str(v))
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


def crashed_mode(side: str, crashed: dict) -> bool:
    """Whether llama-bench side `side` (..._repack_on / _repack_off) is a --repack mode that
    crashed on some test (crashed's keys end in "repack <0|1>")."""
    modes = {k.rsplit(" repack ", 1)[1] for k in crashed if " repack " in k}
    return any(side.endswith(f"_repack_{'on' if r == '1' else 'off'}") for r in modes)


# ---------------------------------------------------------------- the run


class Comparison:
    """One run: llama-bench and ours, in interleaved rounds, each sample checked for noise.

    samples[key][side] holds one value per round that has one (the median of its R samples);
    raw_lb and raw_zl every llama-bench row and every sample of ours, reruns included."""

    def __init__(self, args):
        self.args = args
        self.runs = args.runs or (2 if args.quick else 5)
        self.reps = args.reps or (1 if args.quick else 3)
        self.binary = Path(args.llama_bench)
        self.help_text = llama_bench_help(self.binary)
        self.depths = [0, 1000]
        if "--n-depth" not in self.help_text:
            log("WARNING: this llama-bench has no -d/--n-depth; only depth-0 rows are compared")
            self.depths = [0]
        self.version = sh([str(self.binary), "--version"], timeout=60)
        from zerolayer.gpu.gguf_loader import default_model_path
        self.model_path = os.path.abspath(args.model or default_model_path())
        # --repack modes are measured like -fa, the best per row; a test that crashes in one
        # (the AMX path dies of SIGSEGV on prompts) is measured in the other (README)
        self.repacks = ([r for r in args.repack.split(",") if r]
                        if "--repack" in self.help_text else [])
        self.full_cmd = self.lb_cmd("100,500", str(STEPS), ",".join(map(str, self.depths)),
                                    args.fa)
        # one test per command: (p, n, d), for a mode that crashed on some test
        self.single_tests = [("0", str(STEPS), str(d)) for d in self.depths] + [
            (str(pp), "0", str(d)) for pp in (100, 500) for d in self.depths]
        log(f"llama-bench: {shlex.join(self.full_cmd)}"
            + (f", in each of --repack {', '.join(self.repacks)}" if self.repacks else ""))
        self.watch = CpuWatch(children=True)  # the cold-start probes are ours
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.raw_lb, self.raw_zl, self.lb_runs = [], [], []
        self.lb_keys_expected: set[tuple[str, str]] = set()
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
        """Our runtime loaded, its kernels compiled (or loaded from the JIT cache) and each
        measurement run once; self.ours: key -> a thunk whose result's value is tok/s (cold
        start: seconds)."""
        log(f"loading zerolayer ({self.model_path})")
        t0 = time.perf_counter()
        from zerolayer.gpu.model import LlamaModel, set_threads
        set_threads(THREADS)
        m = LlamaModel.load(self.model_path, max_seq_len=N_CTX)
        tokenizer = m.tokenizer()
        self.load_s = time.perf_counter() - t0
        pool = tokenizer.encode(CORPUS)
        while len(pool) < 1000 + 8 * 64:
            pool = pool + pool
        pr = self.prompts = {"ctx50": pool[:50], "ctx1000": pool[:1000], "p100": pool[100:200],
                             "p500": pool[200:700]}
        batch = [pool[37 * i: 37 * i + 50] for i in range(8)]
        t0 = time.perf_counter()
        for prompts, steps in (([pr["ctx50"]], 2), (batch[:2], 1), (batch, 1)):
            timed_decode(m, prompts, steps)
        self.jit_s = time.perf_counter() - t0
        log(f"zerolayer first steps (JIT compile or cache load): {self.jit_s:.1f} s")
        import numba

        from zerolayer.gpu.ops import cpu_features
        self.numba_info = {"numba": numba.__version__, "threading_layer": numba.threading_layer(),
                           "num_threads": numba.get_num_threads(),
                           "cache_dir": os.environ.get("NUMBA_CACHE_DIR"),
                           "cpu_kernels": cpu_features.describe(),
                           # NUMBA_CPU_NAME / _FEATURES: what Numba compiles for (host if unset)
                           "numba_cpu_name": numba.config.CPU_NAME,
                           "numba_cpu_features": numba.config.CPU_FEATURES}
        self.ours = {
            TG0: lambda: timed_decode(m, [pr["ctx50"]], STEPS),
            TG1000: lambda: timed_decode(m, [pr["ctx1000"]], STEPS),
            "pp100_d0": lambda: prefill(m, pr["p100"]),
            "pp500_d0": lambda: prefill(m, pr["p500"]),
            "pp100_d1000": lambda: prefill(m, pr["p100"], pr["ctx1000"]),
            "pp500_d1000": lambda: prefill(m, pr["p500"], pr["ctx1000"]),
            "batch8": lambda: timed_decode(m, batch, STEPS),
            "cold_start": self.zl_cold,
        }
        if 1000 not in self.depths:
            for k in (TG1000, "pp100_d1000", "pp500_d1000"):
                self.ours.pop(k)
        if self.args.no_cold_start:
            self.ours.pop("cold_start")
        log("warm-up: each of our measurements once (llama-bench warms up each test itself)")
        for fn in self.ours.values():
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

    def add(self, key: str, side: str, v: float) -> None:
        self.samples.setdefault(key, {}).setdefault(side, []).append(v)

    def quiet(self) -> float:
        return self.watch.wait_quiet(self.args.max_foreign, self.args.max_wait)["waited_s"]

    def zl_round(self, rnd: int, keys: list[str]) -> None:
        a_ = self.args
        for key in keys:
            fn = self.ours[key]
            waited = self.quiet()
            n_s = 1 if key == "cold_start" else self.reps  # one cold start a round: it takes seconds
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
            out += [(self.lb_cmd(*t, self.args.fa, r), t) for t in self.single_tests
                    if f"{'/'.join(t)} repack {r}" not in self.crashed]
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
            log(f"  llama-bench -p/-n/-d {'/'.join(test)} --repack {r}: crashed "
                f"({str(e).splitlines()[0][:60]}...); not measured in that mode")
            self.crashed[f"{'/'.join(test)} repack {r}"] = {"round": rnd, "cmd": cmd,
                                                            "error": str(e)[-600:]}
            return []
        self.lb_runs.append({"round": rnd, "cmd": cmd, "waited_s": waited, **run})
        return rows

    def lb_rerun(self, rnd: int, row: dict) -> dict:
        """A disturbed row measured again in a llama-bench run of that row alone."""
        cmd = self.lb_cmd(*(str(int(row[k])) for k in ("n_prompt", "n_gen", "n_depth")),
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
        rnd = 0
        t0 = time.perf_counter()
        while rnd < 2 * self.runs:
            lb_short = rnd == 0 or any(len(self.samples.get(k, {}).get(s, [])) < self.runs
                                       for k, s in self.lb_keys_expected)
            zl_short = [k for k in self.ours
                        if len(self.samples.get(k, {}).get("zerolayer", [])) < self.runs]
            if not lb_short and not zl_short:
                break
            for who in (("llama-bench", "zerolayer") if rnd % 2 == 0 else ("zerolayer",
                                                                           "llama-bench")):
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
            return stats.get(key, {}).get(who, {}).get("median")

        def ratio(a, b):
            return a / b if a and b else None

        # a mode that crashed on any test is no peer (it could not serve the prompts), however
        # fast its other rows: the baseline is the best of the modes that completed every test
        serving = [s for s in lb_sides if not crashed_mode(s, self.crashed)]
        best_lb, ratios = {}, {}
        for key in PEER_KEYS:
            cands = [(med(key, s), s) for s in serving if med(key, s) is not None]
            if cands:
                v, s = max(cands)
                best_lb[key] = {"side": s, "median": v}
            z = med(key, "zerolayer")
            ratios[key] = ratio(z, best_lb.get(key, {}).get("median"))
            for s in lb_sides:
                ratios[f"{key}_vs_{s}"] = ratio(z, med(key, s))
        ratios["batch8_vs_own_batch1"] = ratio(med("batch8", "zerolayer"), med(TG0, "zerolayer"))
        for s in ["zerolayer", *lb_sides]:
            ratios[f"decode_short_over_ctx1000_{s}"] = ratio(med(TG0, s), med(TG1000, s))
        targets = {}
        for k, (label, op, target, src) in TARGETS.items():
            v = med(src, "zerolayer") if src == "cold_start" else ratios[src]
            met = None if v is None else (v >= target if op == ">=" else v <= target)
            targets[k] = {"label": label, "value": v, "op": op, "target": target, "met": met}
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


def run(args, command: str, started: _dt.datetime, out_path: Path) -> int:
    loadavg0, uptime0 = os.getloadavg(), sh(["uptime"])
    log(f"uptime: {uptime0}")
    if loadavg0[0] > 0.5:
        log(f"WARNING: 1-min load average {loadavg0[0]:.2f} > 0.5; busy processes: {top_processes()}")
    from zerolayer.gpu import __version__ as zl_version
    src_hash0, head_at_start = gpu_source_hash(), git_head(short=False)
    git_dirty_gpu = sh(["git", "-C", str(REPO), "status", "--porcelain", "gpu"]).splitlines()

    c = Comparison(args)
    c.load_ours()
    c.run_rounds()
    short = c.short_of_runs()
    loadavg1, src_hash1 = os.getloadavg(), gpu_source_hash()
    if src_hash1 != src_hash0:
        log("WARNING: gpu/ sources changed during the run")
    compared = c.compare()
    with open(c.model_path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    result = {
        "schema": "zerolayer-bench-runtime/3", "reference": "llama-bench",
        "date": started.isoformat(timespec="seconds"), "command": command, "quick": args.quick,
        "runs": c.runs, "reps_per_round": c.reps, "rounds_done": c.rounds_done,
        "rounds_s": c.rounds_s, "decode_steps": STEPS, "threads": THREADS, "n_ctx": N_CTX,
        "llama_bench": c.llama_bench_info(),
        "model": {"path": c.model_path, "bytes": os.path.getsize(c.model_path), "sha256": sha},
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
        "zerolayer_load_s": c.load_s,
        **compared,
        "llama_bench_rows": c.raw_lb,
        "zerolayer_samples": c.raw_zl,
    }
    out_path.write_text(json.dumps(result, indent=1))
    print(render(result))
    print(f"\nJSON: {out_path}")
    return 0


# ---------------------------------------------------------------- the table


def _signal_name(error: str) -> str:
    """"llama-bench failed (rc=-11): ..." -> "SIGSEGV"."""
    m = re.search(r"rc=(-?\d+)", error)
    try:
        return signal.Signals(-int(m.group(1))).name if m else "failed"
    except ValueError:
        return f"rc {m.group(1)}"


def side_name(side: str) -> str:
    """llama_bench_fa_on_repack_off -> llama-bench fa=on repack=off"""
    rest = side.removeprefix("llama_bench_").replace("_repack", " repack")
    return "llama-bench " + " ".join(kv.replace("_", "=") for kv in rest.split(" "))


def render(r: dict) -> str:
    st, ra, tg, best, lb = r["stats"], r["ratios"], r["targets"], r["best_llama_bench"], r["llama_bench"]
    lb_sides = [s for s in r["sides"] if s != "zerolayer"]
    short = r["zerolayer_prompts"]["decode_short_ctx"]

    def cell(key, who, fmt="{:.1f}"):
        s = st.get(key, {}).get(who)
        return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})" \
            if s else "–"

    def rt(x):
        return "–" if x is None else f"{x:.2f}×"

    def mark(key):
        return {None: "–", True: "met", False: "**missed**"}[tg[key]["met"]]

    def target(key, unit="×"):
        t = TARGETS[key]
        return f"{'≥' if t[1] == '>=' else '≤'} {t[2]}{unit}"

    rows = [(TG0, f"decode tok/s, batch 1, {STEPS} tokens at ctx 0 (llama-bench tg{STEPS}) / "
                  f"{short} (ours)", "decode_ctx50"),
            (TG1000, f"decode tok/s, batch 1, {STEPS} tokens at ctx 1000", "decode_ctx1000"),
            ("pp100_d0", "prefill tok/s, 100 tokens", "prefill_100"),
            ("pp500_d0", "prefill tok/s, 500 tokens", "prefill_500"),
            ("pp100_d1000", "prefill tok/s, 100 tokens after 1000", None),
            ("pp500_d1000", "prefill tok/s, 500 tokens after 1000", None)]
    m, v = r["machine"], r["versions"]
    lines = [
        f"zerolayer vs llama.cpp llama-bench (build {lb.get('build_number')}, "
        f"{lb.get('build_commit')}), {r['threads']} threads each, "
        f"{r['model']['path'].rsplit('/', 1)[-1]}",
        f"{r['date']} · {m['cpu_model']} ({m['cpus']} CPUs, {m['hypervisor'] or 'bare metal'}) · "
        f"load avg before {m['loadavg_before'][0]:.2f}, after {m['loadavg_after'][0]:.2f} · "
        f"medians over {r['runs']} interleaved rounds (min–max of the round values), "
        f"each round's value the median of {r['reps_per_round']} samples",
        f"ours: {v.get('cpu_kernels', '?')}, compiled for {v.get('numba_cpu_name') or 'this host'}",
        f"llama-bench: `{shlex.join(lb['cmd'])}`"
        + (f", in each of `--repack {','.join(lb['repack_modes'])}`" if lb.get("repack_modes") else ""),
        f"command: `{r['command']}`",
        "",
        f"| metric | zerolayer | {' | '.join(side_name(s) for s in lb_sides)} | "
        "ours / best llama-bench | target | |",
        "|---|---|" + "---|" * len(lb_sides) + "---|---|---|",
    ]
    for key, label, tkey in rows:
        if key in st:
            b = best.get(key, {}).get("side")
            lls = " | ".join(cell(key, s) + (" ←" if s == b and len(lb_sides) > 1 else "")
                             for s in lb_sides)
            lines.append(f"| {label} | {cell(key, 'zerolayer')} | {lls} | {rt(ra.get(key))} | "
                         f"{target(tkey) if tkey else ''} | {mark(tkey) if tkey else ''} |")
    dash = " | ".join("–" for _ in lb_sides)
    if "batch8" in st:
        lines.append(f"| aggregate decode tok/s, batch 8, ctx {short} | {cell('batch8', 'zerolayer')} | "
                     f"{dash} | {rt(ra['batch8_vs_own_batch1'])} our batch 1 | retired (serving "
                     "aggregate instead) | |")
    if "cold_start" in st:
        lines.append(f"| cold start to first token, s (warm caches) | "
                     f"{cell('cold_start', 'zerolayer', '{:.2f}')} | {dash} | | "
                     f"{target('cold_start', ' s')} | {mark('cold_start')} |")
    lls = " | ".join(rt(ra.get(f"decode_short_over_ctx1000_{s}")) for s in lb_sides)
    lines += [f"| decode slowdown, short ctx → 1000 | "
              f"{rt(ra.get('decode_short_over_ctx1000_zerolayer'))} | {lls} | | "
              f"{target('attn_scaling')} | {mark('attn_scaling')} |", ""]
    if len(lb_sides) > 1:
        lines.append("← = llama-bench's best mode for that row that completed every test, "
                     "the one the ratio uses.")
    crashed = [k for k in sorted(lb.get("crashed", {})) if not k.startswith("all ")]
    if crashed:
        why = {_signal_name(lb["crashed"][k]["error"]) for k in crashed}
        gone = [side_name(s) for s in lb_sides if crashed_mode(s, lb["crashed"])]
        lines.append(f"llama-bench died ({', '.join(sorted(why))}) on -p/-n/-d "
                     f"{'; '.join(crashed)}: not measured in those modes, and "
                     f"{', '.join(gone)} is no baseline for any row "
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=None, help="interleaved rounds (default 5; --quick: 2)")
    ap.add_argument("--reps", type=int, default=None,
                    help="samples per round on each side, llama-bench -r (default 3; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="smoke run: fewer rounds (not for publishing)")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/runtime-<time>.json)")
    ap.add_argument("--model", default=None, help="GGUF path (default: the bundled SmolLM2-135M Q4_1)")
    ap.add_argument("--llama-bench", default=str(LLAMA_BENCH),
                    help="llama-bench binary (default .bench-llamacpp/bin/llama-bench)")
    ap.add_argument("--fa", default="0,1", help="llama-bench -fa modes, best per row (default 0,1)")
    ap.add_argument("--repack", default="0,1", help="llama-bench --repack modes, best per row "
                    "(default 0,1; ignored by builds without --repack)")
    ap.add_argument("--no-cold-start", action="store_true", help="skip our cold-start measurement")
    ap.add_argument("--max-foreign", type=float, default=0.05,
                    help="share of the machine others may take during a sample before it is "
                    "rerun (default 0.05 = 10%% of one of 2 cores)")
    ap.add_argument("--retries", type=int, default=4, help="reruns of a disturbed sample (default 4)")
    ap.add_argument("--max-wait", type=float, default=None,
                    help="seconds to wait for a quiet machine before each sample (default 120; "
                    "--quick: 10)")
    args = ap.parse_args()
    command = command_line()
    if args.max_wait is None:
        args.max_wait = 10.0 if args.quick else 120.0
    started = _dt.datetime.now().astimezone()
    out_path = results_path(args.out, "runtime")
    if not os.access(args.llama_bench, os.X_OK):
        log(f"missing {args.llama_bench}: build it with bench/setup_llamacpp.sh (bench/README.md)")
        return 2
    with bench_lock(command) as args.lock_wait_s:  # the whole run: loads and JIT compiles too
        return run(args, command, started, out_path)


if __name__ == "__main__":
    sys.exit(main())
