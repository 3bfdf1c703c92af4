#!/usr/bin/env python
"""zerolayer vs llama-cpp-python on the same GGUF, 2 threads each, in one run (issue 2).

    .venv/bin/python bench/bench_runtime.py [--runs N] [--quick] [--out PATH]

What it measures (medians over --runs repetitions, after one discarded warm-up repetition):

* decode tok/s at batch 1 after a prompt of 50 and of 1000 tokens (greedy, --steps steps;
  each step is one forward of one token plus an argmax over the vocab, on both sides);
* prefill tok/s of a 100- and a 500-token prompt on a fresh sequence / cleared KV cache
  (one batched forward, llama.cpp with n_batch = n_ubatch = 512);
* zerolayer's aggregate decode tok/s at batch 8 (8 sequences with different 50-token
  prompts, one step() for all 8), against our own batch 1 at the same context;
* cold start to the first token with a warm JIT cache: a fresh interpreter that imports the
  runtime, loads the model, tokenizes a prompt and prints the first greedy token, timed from
  just before the process is spawned to the moment its first stdout line arrives.

How it keeps the comparison fair:

* llama.cpp runs in a separate process (bench/_llamacpp_worker.py under .venv-bench), never in
  ours: two OpenMP runtimes, no shared threads. Both get 2 threads; both see the same token ids
  (the prompts are tokenized once here and sent to the worker).
* llama.cpp runs in each flash-attention mode of --llama-flash-attn (default auto and off), one
  worker each; for every metric the baseline is llama.cpp's best mode on that metric.
* The runtimes alternate: every repetition runs each measurement for all of them, and which one
  goes first rotates from one repetition to the next, so drifting machine noise hits all.
* The machine is small and shared. Before each pair of measurements the script waits for the
  other processes on the machine to go quiet, and afterwards it counts the CPU time that
  processes other than the two runtimes (and steal time) took while the pair ran. A pair
  disturbed by more than --max-foreign of the machine is run again (up to --retries times); one
  still disturbed after that is left out of the medians and replaced by an extra repetition
  (at most 2 x --runs in all). The JSON keeps every sample with its foreign-CPU share.

Results: a JSON file (default bench/results/runtime-<timestamp>.json, gitignored) and a
markdown table on stdout, with the ratios and which of the issue's targets are met.
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

REPO = Path(__file__).resolve().parent.parent
BENCH_PY = REPO / ".venv-bench" / "bin" / "python"
WORKER = REPO / "bench" / "_llamacpp_worker.py"
RESULTS = REPO / "bench" / "results"
THREADS = 2
N_CTX = 2048  # both runtimes: room for the 1000-token context plus the decode steps
CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1

TARGETS = {  # from issue 2, "Benchmark"
    "decode_ctx50": ("decode ctx 50 vs llama.cpp", ">=", 1.25),
    "decode_ctx1000": ("decode ctx 1000 vs llama.cpp", ">=", 1.25),
    "prefill_100": ("prefill 100 vs llama.cpp", ">=", 1.0),
    "prefill_500": ("prefill 500 vs llama.cpp", ">=", 1.0),
    "batch8": ("batch-8 aggregate vs our batch 1", ">=", 4.0),
    "cold_start": ("cold start to first token (s)", "<=", 3.0),
    "attn_scaling": ("decode ctx 50 / ctx 1000 slowdown (issue scope 4)", "<=", 1.5),
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


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- machine-noise accounting


def _busy_jiffies() -> int:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...: steal counts as taken from us
    return v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)


def _proc_jiffies(pid: int | str, children: bool = False) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    n = int(rest[11]) + int(rest[12])  # utime, stime
    if children:  # cutime, cstime: the cold-start processes we spawned and waited for
        n += int(rest[13]) + int(rest[14])
    return n


class CpuWatch:
    """CPU taken by everything except us and our llama.cpp worker, as a share of the machine."""

    def __init__(self, worker_pids: list[int]):
        self.worker_pids = worker_pids

    def snap(self) -> tuple[float, int, int]:
        ours = _proc_jiffies("self", children=True)
        for pid in self.worker_pids:
            ours += _proc_jiffies(pid)
        return time.perf_counter(), _busy_jiffies(), ours

    @staticmethod
    def foreign(a, b) -> float:
        wall = max(b[0] - a[0], 1e-6)
        other = max(0, (b[1] - a[1]) - (b[2] - a[2]))
        return other / (wall * CLK_TCK * NCPU)

    def wait_quiet(self, limit: float, max_wait: float, window: float = 0.5) -> tuple[float, float]:
        """Wait until foreign CPU over `window` is <= limit; returns (waited_s, last share)."""
        t0 = time.perf_counter()
        announced = False
        while True:
            a = self.snap()
            time.sleep(window)
            share = self.foreign(a, self.snap())
            waited = time.perf_counter() - t0
            if share <= limit or waited >= max_wait:
                if announced and share <= limit:
                    log(f"  quiet again after {waited:.0f} s")
                elif announced:
                    log(f"  still busy after {waited:.0f} s ({share:.0%}); measuring anyway")
                return waited, share
            if not announced:
                log(f"  machine busy (other processes use {share:.0%} of it); waiting "
                    f"up to {max_wait:.0f} s: {top_processes(3)}")
                announced = True
            time.sleep(1.0)


def top_processes(n: int = 5) -> list[str]:
    try:
        out = subprocess.run(["ps", "-eo", "pcpu,pid,comm", "--sort=-pcpu"], capture_output=True,
                             text=True, timeout=5).stdout.splitlines()[1:n + 1]
        return [" ".join(line.split()) for line in out]
    except Exception:
        return []


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

    def prefill(self, prompt: list[int]) -> dict:
        seq = self.model.new_sequence()
        try:
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


class LlamaCppWorker:
    def __init__(self, path: str, threads: int, flash_attn: str):
        self.cmd = [str(BENCH_PY), str(WORKER), "--model", path, "--threads", str(threads),
                    "--n-ctx", str(N_CTX), "--n-batch", "512", "--flash-attn", flash_attn]
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=str(REPO))

    def call(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"llama.cpp worker died (rc={self.proc.poll()})")
        res = json.loads(line)
        if "error" in res:
            raise RuntimeError(f"llama.cpp worker: {res['error']}")
        return res

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()


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


def sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as e:
        return f"<{e}>"


def machine_info() -> dict:
    lscpu = {}
    for line in sh(["lscpu"]).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            lscpu[k.strip()] = v.strip()
    flags = lscpu.get("Flags", "").split()
    return {
        "cpu_model": lscpu.get("Model name"),
        "cpus": NCPU,
        "cores_per_socket": lscpu.get("Core(s) per socket"),
        "threads_per_core": lscpu.get("Thread(s) per core"),
        "hypervisor": lscpu.get("Hypervisor vendor"),
        "simd": [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni") if f in flags],
        "kernel": platform.release(),
        "mem_total": next((line.split(":", 1)[1].strip() for line in open("/proc/meminfo")
                           if line.startswith("MemTotal")), None),
    }


def gpu_source_hash() -> str:
    h = hashlib.sha256()
    for p in sorted((REPO / "gpu").rglob("*.py")):
        h.update(str(p.relative_to(REPO)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


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


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=None,
                    help="measured repetitions per metric (default 7; --quick: 2)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: fewer runs and decode steps (not for publishing)")
    ap.add_argument("--out", default=None, help="JSON results path "
                    "(default bench/results/runtime-<timestamp>.json)")
    ap.add_argument("--model", default=None, help="GGUF path (default: the bundled SmolLM2-135M Q4_1)")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per run (default 32; --quick: 8)")
    ap.add_argument("--llama-flash-attn", default="auto,off",
                    help="llama.cpp flash-attention modes to run, comma-separated, each in its own "
                    "worker; each metric's baseline is the best of them (default auto,off: "
                    "llama.cpp's own default and llama-cpp-python's; on this CPU off decodes faster "
                    "at long contexts, auto at short ones)")
    ap.add_argument("--max-foreign", type=float, default=0.05,
                    help="max share of the machine other processes may take during a sample "
                    "before it is rerun (default 0.05 = 10%% of one of 2 cores)")
    ap.add_argument("--retries", type=int, default=4, help="reruns of a disturbed sample (default 4)")
    ap.add_argument("--max-wait", type=float, default=None,
                    help="seconds to wait for a quiet machine before each sample "
                    "(default 120; --quick: 10)")
    args = ap.parse_args()
    runs = args.runs or (2 if args.quick else 7)
    steps = args.steps or (8 if args.quick else 32)
    if args.max_wait is None:
        args.max_wait = 10.0 if args.quick else 120.0
    warmup_reps = 1
    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    started = _dt.datetime.now().astimezone()
    out_path = Path(args.out) if args.out else RESULTS / f"runtime-{started:%Y%m%d-%H%M%S}.json"

    loadavg0 = os.getloadavg()
    uptime0 = sh(["uptime"])
    log(f"uptime: {uptime0}")
    if loadavg0[0] > 0.5:
        log(f"WARNING: 1-min load average {loadavg0[0]:.2f} > 0.5; busy processes: {top_processes()}")
    if not BENCH_PY.exists():
        log(f"missing {BENCH_PY}: llama-cpp-python's venv (see bench/README.md)")
        return 2

    from zerolayer.gpu import __version__ as zl_version
    from zerolayer.gpu.gguf_loader import default_model_path

    model_path = os.path.abspath(args.model or default_model_path())
    src_hash0 = gpu_source_hash()
    git_head = sh(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    git_dirty_gpu = sh(["git", "-C", str(REPO), "status", "--porcelain", "gpu"]).splitlines()

    log(f"loading zerolayer ({model_path})")
    zl = ZeroLayer(model_path, THREADS)
    tok = zl.tokenizer
    pool = tok.encode(CORPUS)
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
                  "cache_dir": os.environ.get("NUMBA_CACHE_DIR")}

    fa_modes = list(dict.fromkeys(m.strip() for m in args.llama_flash_attn.split(",") if m.strip()))
    bad = [m for m in fa_modes if m not in ("auto", "on", "off")]
    if bad or not fa_modes:
        log(f"--llama-flash-attn: unknown mode(s) {bad}; use auto, on, off")
        return 2
    workers: dict[str, LlamaCppWorker] = {}
    ll_info: dict[str, dict] = {}
    for fa in fa_modes:
        side = f"llama_cpp_fa_{fa}"
        log(f"starting llama.cpp worker ({side})")
        workers[side] = LlamaCppWorker(model_path, THREADS, fa)
        ll_info[side] = workers[side].call(op="info")
        workers[side].call(op="decode", prompt=prompts["ctx50"], steps=2)
    ll_sides = list(workers)
    sides = ["zerolayer", *ll_sides]
    watch = CpuWatch([w.proc.pid for w in workers.values()])

    zl_cold_cmd = [sys.executable, "-c", ZL_COLD, model_path, COLD_PROMPT, str(THREADS), str(N_CTX)]
    ll_cold_cmd = {s: [*w.cmd, "--cold", "--prompt", COLD_PROMPT] for s, w in workers.items()}
    log("warming the cold-start paths (JIT cache, model cache, page cache)")
    zl_cold_warm = cold_start(zl_cold_cmd)
    for cmd in ll_cold_cmd.values():
        cold_start(cmd)
    if zl_cold_warm.get("breakdown", {}).get("numba_cache_dir") != numba_info["cache_dir"]:
        log("WARNING: the cold-start process uses another numba cache dir than this one "
            "(gpu/ sources changed?)")

    seen_cache = [zl_cold_warm.get("breakdown", {}).get("numba_cache_dir")]

    def zl_cold() -> dict:
        """A cold start with a warm JIT cache. If gpu/ changed since the last one (others may be
        editing the tree), the child compiled into a new cache dir: that run warmed the new
        cache, so run again and keep the second."""
        r = cold_start(zl_cold_cmd)
        cache = r.get("breakdown", {}).get("numba_cache_dir")
        if cache != seen_cache[0]:
            log(f"  gpu/ changed: new JIT cache {cache}; that cold start ({r['seconds']:.1f} s) "
                "compiled, running it again")
            seen_cache[0] = cache
            r = cold_start(zl_cold_cmd) | {"recompiled_run_s": r["seconds"]}
        return r

    def ll_thunks(op: str, **req):
        return {s: (lambda w=w: w.call(op=op, **req)) for s, w in workers.items()}

    # One measurement = (key, {side: thunk}, kind). kind says how a result becomes a value:
    # decode/prefill/batch -> tokens per second (higher is better); cold -> seconds (lower).
    measurements = [
        ("decode_ctx50", {"zerolayer": lambda: zl.decode(prompts["ctx50"], steps),
                          **ll_thunks("decode", prompt=prompts["ctx50"], steps=steps)}, "decode"),
        ("decode_ctx1000", {"zerolayer": lambda: zl.decode(prompts["ctx1000"], steps),
                            **ll_thunks("decode", prompt=prompts["ctx1000"], steps=steps)}, "decode"),
        ("prefill_100", {"zerolayer": lambda: zl.prefill(prompts["p100"]),
                         **ll_thunks("prefill", prompt=prompts["p100"])}, "prefill"),
        ("prefill_500", {"zerolayer": lambda: zl.prefill(prompts["p500"]),
                         **ll_thunks("prefill", prompt=prompts["p500"])}, "prefill"),
        ("batch8", {"zerolayer": lambda: zl.batch_decode(batch_prompts, steps)}, "batch"),
        ("cold_start", {"zerolayer": zl_cold,
                        **{s: (lambda c=c: cold_start(c)) for s, c in ll_cold_cmd.items()}}, "cold"),
    ]
    lower_is_better = {"cold_start"}

    def value(kind: str, r: dict) -> float:
        if kind == "decode":
            return r["steps"] / r["seconds"]
        if kind == "prefill":
            return r["tokens"] / r["seconds"]
        if kind == "batch":
            return r["batch"] * r["steps"] / r["seconds"]
        return r["seconds"]

    samples: dict[str, dict[str, list]] = {k: {s: [] for s in fns} for k, fns, _ in measurements}
    raw: list[dict] = []
    excluded = 0
    greedy_agree: list[float] = []
    max_reps = warmup_reps + 2 * runs  # room to replace samples spoiled by other processes
    rep = 0
    while rep < max_reps:
        todo = [(mi, m) for mi, m in enumerate(measurements)
                if rep < warmup_reps or len(samples[m[0]]["zerolayer"]) < runs]
        if not todo:
            break
        for mi, (key, fns, kind) in todo:
            names = list(fns)
            shift = (rep + mi) % len(names)  # rotate who goes first from one repetition to the next
            order = names[shift:] + names[:shift]
            for attempt in range(args.retries + 1):
                waited, _ = watch.wait_quiet(args.max_foreign, args.max_wait)
                a = watch.snap()
                res = {}
                for who in order:
                    sa = watch.snap()
                    r = fns[who]()
                    r["foreign_share"] = watch.foreign(sa, watch.snap())
                    res[who] = r
                    time.sleep(0.2)  # let the previous side's OpenMP threads stop spinning
                share = watch.foreign(a, watch.snap())
                worst = max(r["foreign_share"] for r in res.values())
                if worst <= args.max_foreign or attempt == args.retries:
                    break
                log(f"  {key}: disturbed (other processes took {worst:.0%} of the machine); rerun")
            is_warm = rep < warmup_reps
            spoiled = worst > args.max_foreign  # still disturbed after every rerun: not counted
            if spoiled and not is_warm:
                excluded += 1
            entry = {"rep": rep, "warmup": is_warm, "excluded": spoiled, "metric": key,
                     "order": order, "attempts": attempt + 1, "waited_s": waited,
                     "foreign_share": share}
            for who, r in res.items():
                r = dict(r)
                r["value"] = value(kind, r)
                entry[who] = r
                if not is_warm and not spoiled:
                    samples[key][who].append(r["value"])
            if kind == "decode" and not is_warm:
                for s in ll_sides:
                    a_t, b_t = res["zerolayer"]["tokens"], res[s]["tokens"]
                    n = min(len(a_t), len(b_t))
                    greedy_agree.append(next((i for i in range(n) if a_t[i] != b_t[i]), n) / n)
            raw.append(entry)
            vals = ", ".join(f"{w}={entry[w]['value']:.3g}" for w in sides if w in entry)
            tag = " (warm-up)" if is_warm else (" EXCLUDED: disturbed" if spoiled else "")
            log(f"rep {rep} {key}: {vals} (foreign {share:.0%}){tag}; "
                f"{len(samples[key]['zerolayer'])}/{runs} samples")
        rep += 1
    short = {k: len(d["zerolayer"]) for k, d in samples.items() if len(d["zerolayer"]) < runs}
    if short:
        log(f"WARNING: fewer than {runs} undisturbed samples for {short}")

    for w in workers.values():
        w.close()
    loadavg1 = os.getloadavg()
    src_hash1 = gpu_source_hash()
    if src_hash1 != src_hash0:
        log("WARNING: gpu/ sources changed during the run; the cold-start processes may have "
            "compiled (see cold_start breakdowns)")

    stats = {k: {who: summary(v) for who, v in d.items() if v} for k, d in samples.items()}

    def med(key, who):
        s = stats.get(key, {}).get(who)
        return s["median"] if s else None

    # llama.cpp's baseline for each metric: its best configuration on that metric.
    best_ll = {}
    for key, fns, _ in measurements:
        cands = [(med(key, s), s) for s in ll_sides if med(key, s) is not None]
        if cands:
            v, s = (min if key in lower_is_better else max)(cands)
            best_ll[key] = {"side": s, "median": v}
    ratios = {}
    for key in ("decode_ctx50", "decode_ctx1000", "prefill_100", "prefill_500"):
        z, b = med(key, "zerolayer"), best_ll.get(key, {}).get("median")
        ratios[key] = z / b if z and b else None
        for s in ll_sides:
            l_ = med(key, s)
            ratios[f"{key}_vs_{s}"] = z / l_ if z and l_ else None
    z8, z1 = med("batch8", "zerolayer"), med("decode_ctx50", "zerolayer")
    ratios["batch8_vs_own_batch1"] = z8 / z1 if z8 and z1 else None
    zc, lc = med("cold_start", "zerolayer"), best_ll.get("cold_start", {}).get("median")
    ratios["cold_start_llama_over_zerolayer"] = lc / zc if zc and lc else None
    z1000 = med("decode_ctx1000", "zerolayer")
    ratios["decode_ctx50_over_ctx1000_zerolayer"] = z1 / z1000 if z1 and z1000 else None
    for s in ll_sides:
        l50, l1000 = med("decode_ctx50", s), med("decode_ctx1000", s)
        ratios[f"decode_ctx50_over_ctx1000_{s}"] = l50 / l1000 if l50 and l1000 else None

    targets = {
        "decode_ctx50": verdict("decode_ctx50", ratios["decode_ctx50"]),
        "decode_ctx1000": verdict("decode_ctx1000", ratios["decode_ctx1000"]),
        "prefill_100": verdict("prefill_100", ratios["prefill_100"]),
        "prefill_500": verdict("prefill_500", ratios["prefill_500"]),
        "batch8": verdict("batch8", ratios["batch8_vs_own_batch1"]),
        "cold_start": verdict("cold_start", zc),
        "attn_scaling": verdict("attn_scaling", ratios["decode_ctx50_over_ctx1000_zerolayer"]),
    }

    cold_breakdowns = {who: [e[who].get("breakdown") for e in raw
                             if e["metric"] == "cold_start" and not e["warmup"] and who in e]
                       for who in sides}
    result = {
        "schema": "zerolayer-bench-runtime/2",
        "date": started.isoformat(timespec="seconds"),
        "command": command,
        "quick": args.quick,
        "runs": runs,
        "warmup_reps": warmup_reps,
        "decode_steps": steps,
        "threads": THREADS,
        "n_ctx": N_CTX,
        "model": {"path": model_path, "bytes": os.path.getsize(model_path),
                  "sha256": file_sha256(model_path)},
        "prompt_lengths": {k: len(v) for k, v in prompts.items()} | {"batch8_each": 50},
        "cold_prompt": COLD_PROMPT,
        "sides": sides,
        "llama_cpp_baseline": "per metric, the best of the llama.cpp configurations in `sides`",
        "machine": machine_info() | {"uptime_before": uptime0, "loadavg_before": loadavg0,
                                     "loadavg_after": loadavg1},
        "noise": {"max_foreign_share": args.max_foreign, "retries": args.retries,
                  "excluded_samples": excluded, "metrics_short_of_runs": short,
                  "note": "foreign_share = CPU time of other processes + steal during a sample, "
                          "as a share of all CPUs"},
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "zerolayer": zl_version, **numba_info,
                     "llama_cpp": ll_info,
                     "git_head_at_start": git_head, "git_dirty_gpu_at_start": git_dirty_gpu,
                     "gpu_source_hash_start": src_hash0, "gpu_source_hash_end": src_hash1},
        "zerolayer_jit_first_steps_s": jit_s,
        "zerolayer_load_s": zl.load_s,
        "stats": stats,
        "best_llama_cpp": best_ll,
        "ratios": ratios,
        "targets": targets,
        "greedy_agreement_prefix": summary(greedy_agree),
        "cold_start_breakdown": cold_breakdowns,
        "samples": raw,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))

    print(render(result))
    print(f"\nJSON: {out_path}")
    return 0


def render(r: dict) -> str:
    st, ra, tg, best = r["stats"], r["ratios"], r["targets"], r["best_llama_cpp"]
    ll_sides = [s for s in r["sides"] if s != "zerolayer"]

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

    def fa(side):
        return side.rsplit("_", 1)[-1]

    rows = [  # key, label, target text, format
        ("decode_ctx50", "decode tok/s, batch 1, ctx 50", "≥ 1.25×", "{:.1f}"),
        ("decode_ctx1000", "decode tok/s, batch 1, ctx 1000", "≥ 1.25×", "{:.1f}"),
        ("prefill_100", "prefill tok/s, 100 tokens", "≥ 1.0×", "{:.1f}"),
        ("prefill_500", "prefill tok/s, 500 tokens", "≥ 1.0×", "{:.1f}"),
    ]
    ll_head = " | ".join(f"llama.cpp fa={fa(s)}" for s in ll_sides)
    m = r["machine"]
    lines = [
        f"zerolayer vs llama-cpp-python "
        f"{next(iter(r['versions']['llama_cpp'].values()))['llama_cpp_python']}, "
        f"{r['threads']} threads each, {r['model']['path'].rsplit('/', 1)[-1]}",
        f"{r['date']} · {m['cpu_model']} ({m['cpus']} CPUs, {m['hypervisor'] or 'bare metal'}) · "
        f"load avg before {m['loadavg_before'][0]:.2f}, after {m['loadavg_after'][0]:.2f} · "
        f"medians of {r['runs']} runs (min–max) · {r['decode_steps']} decode steps per run",
        f"command: `{r['command']}`",
        "",
        f"| metric | zerolayer | {ll_head} | ratio to best llama.cpp | target | |",
        "|---|---|" + "---|" * len(ll_sides) + "---|---|---|",
    ]
    for key, label, target, fmt in rows:
        b = best.get(key, {}).get("side")
        lls = " | ".join(cell(key, s, fmt) + (" ←" if s == b and len(ll_sides) > 1 else "")
                         for s in ll_sides)
        lines.append(f"| {label} | {cell(key, 'zerolayer', fmt)} | {lls} | {rt(ra[key])} | "
                     f"{target} | {mark(key)} |")
    dash = " | ".join("–" for _ in ll_sides)
    lines.append(f"| aggregate decode tok/s, batch 8, ctx 50 | {cell('batch8', 'zerolayer')} | {dash} | "
                 f"{rt(ra['batch8_vs_own_batch1'])} our batch 1 | ≥ 4× | {mark('batch8')} |")
    lls = " | ".join(cell("cold_start", s, "{:.2f}") for s in ll_sides)
    lines.append(f"| cold start to first token, s (warm caches) | "
                 f"{cell('cold_start', 'zerolayer', '{:.2f}')} | {lls} | "
                 f"{rt(ra['cold_start_llama_over_zerolayer'])} (llama.cpp s / ours) | ≤ 3 s | "
                 f"{mark('cold_start')} |")
    lls = " | ".join(rt(ra.get(f"decode_ctx50_over_ctx1000_{s}")) for s in ll_sides)
    lines.append(f"| decode slowdown, ctx 50 → 1000 | {rt(ra['decode_ctx50_over_ctx1000_zerolayer'])}"
                 f" | {lls} | | ≤ 1.5× (scope 4) | {mark('attn_scaling')} |")
    lines.append("")
    if len(ll_sides) > 1:
        lines.append("← = llama.cpp's best configuration for that row, the one the ratio uses.")
    met = [t["label"] for t in tg.values() if t["met"]]
    missed = [f"{t['label']}: {t['value']:.2f} (target {t['op']} {t['target']})"
              for t in tg.values() if t["met"] is False]
    lines.append(f"Targets met ({len(met)}/{len(tg)}): " + ("; ".join(met) or "none"))
    lines.append(f"Targets missed ({len(missed)}/{len(tg)}): " + ("; ".join(missed) or "none"))
    n = r["noise"]
    lines.append(f"Noise: {n['excluded_samples']} sample(s) excluded and replaced (other processes took "
                 f"> {n['max_foreign_share']:.0%} of the machine even after {n['retries']} reruns)"
                 + (f"; SHORT of {r['runs']} samples: {n['metrics_short_of_runs']}"
                    if n["metrics_short_of_runs"] else "") + ".")
    if r.get("quick"):
        lines.append("QUICK RUN: smoke test only, not for publishing.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
