"""The GPU check's compile pool: worker processes compile every registered kernel and the CPU
twins into Numba's on-disk cache before the check needs them (why and how: bench/README.md).

    pool = Pool.start(workers=n)   # at once; host work meanwhile
    report = pool.wait(timeout_s)  # then enable_caching() before the first launch
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
CPU_TWIN_JOBS = ("cpu:matmul", "cpu:attention", "cpu:elementwise")
CC = (9, 0)  # PTX mode: the H100/H200 target, as tests/test_cuda_ptx.py
# The check's shapes: SmolLM2-135M's (the GPU check and its peers), and small ones (--sim, the
# CPU twins compiled here); n_ff a multiple of 64: the fused step kernel runs under the
# simulator too, as on a GPU
SMOL = dict(n_layer=30, d=576, ff=1536, n_head=9, n_kv=3, hd=64, vocab=49152, ctx=2048)
TINY = dict(n_layer=2, d=64, ff=128, n_head=4, n_kv=2, hd=16, vocab=200, ctx=256)


# ------------------------------------------------------------------ kernels and caching

def registry() -> dict:
    """name -> (dispatcher, [signature]) of every registered kernel, the check's own included."""
    import zerolayer.gpu.cuda  # noqa: F401  (each module registers its kernels)
    from zerolayer.gpu.cuda import _cuda_shim as shim
    return {name: (k, list(sigs)) for name, k, sigs in [*shim.KERNELS, *bench_kernels()]}


@functools.cache
def bench_kernels() -> list:
    """The check's own kernels (the stream gate, an empty kernel), defined once per process."""
    from numba import int32, uint32

    from zerolayer.gpu.cuda._cuda_shim import cuda

    def gate(flag, status, max_polls):
        """One thread holds its stream until the host opens the gate (flag[0] != 0), or
        gives up after max_polls (~1 us each): status 1 opened, 2 gave up."""
        for _ in range(max_polls):
            if cuda.atomic.add(flag, 0, int32(0)) != 0:
                status[0] = 1
                return
            cuda.nanosleep(uint32(1000))
        status[0] = 2

    def empty(x):
        pass

    return [("bench.gate", cuda.jit(gate), ["void(int32[::1], int32[::1], int64)"]),
            ("bench.empty", cuda.jit(empty), ["void(float32[::1])"])]


def _cache_kernel(k, errors: list) -> bool:
    """Turn on the on-disk cache of one dispatcher. A save or load that fails (a kernel that
    captured a device array cannot be pickled) is recorded and costs only the cache."""
    if not hasattr(k, "enable_caching"):
        return False  # the simulator's kernels
    k.enable_caching()
    cache = getattr(k, "_cache", None)
    if cache is None:
        return False
    save, load = cache.save_overload, cache.load_overload

    def safe_save(sig, data):
        try:
            save(sig, data)
        except Exception as e:
            errors.append(f"save {getattr(k, '__name__', k)}: {type(e).__name__}: {e}")

    def safe_load(sig, target_context):
        try:
            return load(sig, target_context)
        except Exception as e:
            errors.append(f"load {getattr(k, '__name__', k)}: {type(e).__name__}: {e}")
            return None

    cache.save_overload, cache.load_overload = safe_save, safe_load
    return True


CACHE_ERRORS: list[str] = []


def enable_caching() -> int:
    """Caching on for every registered kernel of this process; the number turned on."""
    return sum(_cache_kernel(k, CACHE_ERRORS) for k, _ in registry().values())


def cache_counts() -> dict:
    """Loaded-from-cache and compiled signatures so far in this process, over every kernel."""
    ks = [k for k, _ in registry().values()]
    return {f"cache_{n}": sum(sum(getattr(k, f"_cache_{n}", {}).values()) for k in ks)
            for n in ("hits", "misses")}


def launch_key(sig: str) -> tuple:
    """A registered signature as a launch compiles it: the tuple of its argument types."""
    from numba.cuda.core import sigutils
    args, _ = sigutils.normalize_signature(sig)
    return tuple(args)


def jobs(only: list[str] | None = None) -> list[str]:
    """Every job, the largest first: the CPU twins' (the matmul twin alone measured 43 CPU-s
    cold, more than any kernel), then the kernels by source length (which stands for their
    compile cost)."""
    import inspect
    reg = registry()

    def size(name: str) -> int:
        k, sigs = reg[name]
        try:
            return len(inspect.getsource(k.py_func)) * len(sigs)
        except (OSError, TypeError):
            return 0
    names = list(CPU_TWIN_JOBS) + sorted(reg, key=lambda n: (-size(n), n))
    return [n for n in names if not only or n in only]


# ------------------------------------------------------------------ worker side

def rand_weight(rng, fmt: int, L: int, rows: int, cols: int):
    """A random quant.Weight in the kernels' layout, scaled so x @ W.T keeps unit variance."""
    import math

    import numpy as np

    from zerolayer.gpu import quant
    G, nb = -(-rows // quant.LANES), cols // quant.QK
    if fmt == quant.FMT_F32:
        w = (rng.standard_normal((L, rows, cols)) / math.sqrt(cols)).astype(np.float32)
        return quant.Weight(fmt, np.zeros((L, 0, 0, 0, 0), np.uint8), np.zeros((L, 0, 0, 0), np.float32),
                            np.zeros((L, 0, 0, 0), np.float32), w)
    inner, half, std = (16, 7.5, 4.6) if fmt == quant.FMT_Q4 else (32, 127.5, 74.0)
    qs = rng.integers(0, 256, (L, G, nb, inner, quant.LANES), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, (L, G, nb, quant.LANES)) / (std * math.sqrt(cols))).astype(np.float32)
    m = (-half * d).astype(np.float32)
    return quant.Weight(fmt, qs, d, m, np.zeros((L, 0, 0), np.float32))


def _cpu_twins(group: str) -> None:
    """Compile (and cache) the CPU twins that the kernel checks (tests/gpu_checks.py) call, with
    the same argument types, by calling them once on tiny arrays."""
    import numpy as np

    from zerolayer.gpu import quant
    from zerolayer.gpu.ops import attention as att
    from zerolayer.gpu.ops.embedding import embed
    from zerolayer.gpu.ops.matmul import matmul
    from zerolayer.gpu.ops.rmsnorm import rmsnorm
    from zerolayer.gpu.ops.rope import rope, rope_tables
    from zerolayer.gpu.ops.swiglu import swiglu
    rng = np.random.default_rng(0)
    c = TINY
    f32 = np.float32
    D, F, hd = c["d"], c["ff"], c["hd"]
    x = rng.standard_normal((2, D)).astype(f32)
    if group == "cpu:elementwise":
        rmsnorm(x, np.ones(D, f32), f32(1e-5), np.empty_like(x))
        swiglu(rng.standard_normal((2, 2 * F)).astype(f32), np.empty((2, F), f32))
        cos, sin = rope_tables(c["ctx"], hd, 100000.0)
        q = rng.standard_normal((2, (c["n_head"] + 2 * c["n_kv"]) * hd)).astype(f32)
        rope(q, 0, np.zeros(2, np.int32), cos, sin, c["n_head"] + c["n_kv"], hd)
        emb = rand_weight(rng, quant.FMT_Q8, 1, c["vocab"], D).layer(0)
        embed(*emb, np.zeros(2, np.int32), np.empty((2, D), f32))
    elif group == "cpu:matmul":
        for fmt in (quant.FMT_Q4, quant.FMT_Q8, quant.FMT_F32):
            wt = rand_weight(rng, fmt, 1, 64, D).layer(0)
            for T in (1, 16):
                matmul(*wt, rng.standard_normal((T, D)).astype(f32), np.empty((T, 64), f32))
    elif group == "cpu:attention":
        nh, nkv, BT = c["n_head"], c["n_kv"], att.BLOCK_TOKENS
        kp = np.zeros((2, 1, nkv, hd, BT), f32)
        vp = np.zeros((2, 1, nkv, BT, hd), f32)
        qkv = rng.standard_normal((1, (nh + 2 * nkv) * hd)).astype(f32)
        seq, pos, tab = np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros((1, 1), np.int32)
        att.kv_write(qkv, kp, vp, 0, seq, pos, tab, nh, nkv, hd)
        att.attention(qkv, kp, vp, 0, seq, pos, tab, nh, nkv, hd, 1, np.empty((1, nh * hd), f32))
    else:
        raise ValueError(group)


def _worker(job_dir: str, mode: str) -> None:
    """Take jobs until none is left: claim one (exclusive create), compile it, write its result."""
    t0 = time.monotonic()
    d = Path(job_dir)
    names = json.loads((d / "jobs.json").read_text())
    reg = registry()
    import_s = time.monotonic() - t0
    if mode == "cubin":
        enable_caching()
    from numba import cuda
    for i, name in enumerate(names):
        try:
            os.close(os.open(d / f"claim.{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        t, cpu = time.monotonic(), time.process_time()
        res: dict = {"job": name, "pid": os.getpid(), "import_s": round(import_s, 2)}
        try:
            if name.startswith("cpu:"):
                _cpu_twins(name)
            else:
                k, sigs = reg[name]
                for sig in sigs:
                    if mode == "ptx":
                        cuda.compile_ptx(k.py_func, sig, cc=CC,
                                         fastmath=bool(k.targetoptions.get("fastmath", False)))
                    else:
                        # as a launch asks for it: a tuple of argument types (the cache's index
                        # key is the signature as given, and a string would never match)
                        k.compile(launch_key(sig))
                res["sigs"] = len(sigs)
        except Exception:
            res["error"] = traceback.format_exc()[-2000:]
        res.update(s=round(time.monotonic() - t, 2), cpu_s=round(time.process_time() - cpu, 2))
        if CACHE_ERRORS:
            res["cache_errors"] = CACHE_ERRORS[:]
            CACHE_ERRORS.clear()
        (d / f"result.{i}.json").write_text(json.dumps(res))


# ------------------------------------------------------------------ main-process side

class Pool:
    """Worker processes compiling every job; ``wait`` gathers their results."""

    def __init__(self, procs, job_dir: Path, names: list[str], t0: float, mode: str):
        self.procs, self.dir, self.names, self.t0, self.mode = procs, job_dir, names, t0, mode

    @classmethod
    def start(cls, workers: int | None = None, mode: str = "cubin",
              only: list[str] | None = None, env: dict | None = None) -> Pool:
        t0 = time.monotonic()
        names = jobs(only)
        d = Path(tempfile.mkdtemp(prefix="zl-warm-"))
        (d / "jobs.json").write_text(json.dumps(names))
        n = max(1, min(len(names), workers or (os.cpu_count() or 2) - 2))
        code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import gpu_warm; "
                f"gpu_warm._worker({str(d)!r}, {mode!r})")
        e = dict(os.environ if env is None else env)
        if mode == "ptx":  # the real CUDA target, whatever this process runs on
            e.pop("ZEROLAYER_GPU_BACKEND", None)
            e["NUMBA_ENABLE_CUDASIM"] = "0"
        procs = [subprocess.Popen([sys.executable, "-c", code], env=e, stdout=subprocess.DEVNULL,
                                  stderr=open(d / f"worker.{i}.log", "w"))
                 for i in range(n)]
        pool = cls(procs, d, names, t0, mode)
        # a check killed by its time limit must not leave workers compiling (and holding GPU
        # contexts) while the peers are timed
        atexit.register(pool.kill)
        return pool

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def wait(self, timeout_s: float) -> dict:
        """Wait for the workers (at most timeout_s; the rest are killed and their jobs left to
        compile at first launch); every job's result."""
        end = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        files = [self.dir / f"result.{i}.json" for i in range(len(self.names))]
        results = [json.loads(f.read_text()) for f in files if f.exists()]
        missing = [n for n, f in zip(self.names, files) if not f.exists()]
        errors = [r for r in results if "error" in r]
        logs = {f"worker {i} exit {p.returncode}": (self.dir / f"worker.{i}.log").read_text()[-1500:]
                for i, p in enumerate(self.procs) if p.returncode not in (0, None)}
        busy: dict[int, float] = {}
        for r in results:
            busy[r["pid"]] = busy.get(r["pid"], 0.0) + r["s"]
        return {"mode": self.mode, "workers": len(self.procs), "jobs": len(self.names),
                "done": len(results) - len(errors), "failed": [r["job"] for r in errors],
                "not_done": missing, "wall_s": round(time.monotonic() - self.t0, 2),
                "job_s_sum": round(sum(r["s"] for r in results), 2),
                "cpu_s_sum": round(sum(r["cpu_s"] for r in results), 2),
                "busiest_worker_s": round(max(busy.values(), default=0.0), 2),
                "worker_import_s": max((r["import_s"] for r in results), default=None),
                "slowest": sorted(({"job": r["job"], "s": r["s"]} for r in results),
                                  key=lambda r: -r["s"])[:6],
                "errors": {r["job"]: r["error"] for r in errors},
                "cache_errors": sorted({e for r in results for e in r.get("cache_errors", [])})[:10],
                "worker_logs": logs}


def daemon_main(argv: list[str]) -> int:
    """zerolayerd with its kernels' cache on (the same directory the check's workers filled)."""
    enable_caching()
    from zerolayer.daemon.server import main
    return main(argv)


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ptx", action="store_true", help="compile to sm_90 PTX (no GPU needed)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--only", default="", help="comma-separated job names")
    a = ap.parse_args(argv)
    only = [s for s in a.only.split(",") if s] or None
    pool = Pool.start(a.workers, "ptx" if a.ptx else "cubin", only)
    print(json.dumps(pool.wait(600.0), indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--daemon"]:
        sys.path.insert(0, str(BENCH))
        import gpu_warm  # the same module name as the workers': the same cache entries
        sys.exit(gpu_warm.daemon_main(sys.argv[2:]))
    sys.exit(main())
