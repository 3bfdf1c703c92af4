"""The benchmarks' shared harness: statistics, machine info, the one-benchmark-at-a-time lock,
noise accounting, the servers under test (zerolayerd, llama-server, llama-bench), a stdlib
streaming client for llama-server's OpenAI API, and a timed wrapper around our SDK."""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import http.client
import json
import os
import platform
import secrets
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
LLAMA_BIN = REPO / ".bench-llamacpp" / "bin"   # bench/setup_llamacpp.sh builds the peers there
LLAMA_BENCH = LLAMA_BIN / "llama-bench"
# Every benchmark holds this while it measures, so two never share the machine.
LOCK_PATH = "/tmp/zl-bench.lock"
CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------- statistics and the machine


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (q in 0..100) by linear interpolation between closest ranks (numpy's
    default); with 50 samples p99 lies between the two slowest."""
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def stats(values: list[float | None]) -> dict | None:
    """n, p50, p99, mean, min and max of the values that are not None (None when none are)."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"n": len(v), "p50": pct(v, 50), "p99": pct(v, 99),
            "mean": statistics.fmean(v), "min": min(v), "max": max(v)}


def sh(cmd: str | list[str], timeout: float = 15) -> str:
    """A command's stdout (or stderr when stdout is empty), stripped; `<error>` when it fails.
    A string runs through the shell."""
    try:
        p = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True,
                           timeout=timeout)
        return (p.stdout or p.stderr).strip()
    except Exception as e:  # noqa: BLE001
        return f"<{e}>"


def machine_info() -> dict:
    """The host, as every benchmark records it beside its numbers."""
    lscpu = {}
    for line in sh(["lscpu"]).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            lscpu[k.strip()] = v.strip()
    flags = lscpu.get("Flags", "").split()
    with open("/proc/meminfo") as f:
        mem = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("MemTotal")), None)
    return {
        "cpu_model": lscpu.get("Model name"), "l3_cache": lscpu.get("L3 cache"),
        "nproc": sh("nproc"), "cpus": os.cpu_count(),
        "cores_per_socket": lscpu.get("Core(s) per socket"),
        "threads_per_core": lscpu.get("Thread(s) per core"),
        "hypervisor": lscpu.get("Hypervisor vendor"),
        "simd": [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni",
                             "amx_int8", "amx_bf16") if f in flags],
        "kernel": platform.release(), "mem_total": mem,
        "rmem_max": sh("cat /proc/sys/net/core/rmem_max"),
        "rmem_default": sh("cat /proc/sys/net/core/rmem_default"),
    }


def git_head(repo: Path | str = REPO, short: bool = True) -> str:
    """The commit a checkout is at (the code that ran), as benchmarks record it."""
    return sh(["git", "-C", str(repo), "rev-parse", *(["--short"] if short else []), "HEAD"])


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), '?' when it says none."""
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")


def gpu_source_hash() -> str:
    """A hash of the runtime's source (gpu/), recorded beside timings of it."""
    h = hashlib.sha256()
    for p in sorted((REPO / "gpu").rglob("*.py")):
        h.update(str(p.relative_to(REPO)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def default_model() -> str:
    """The bundled GGUF's path, asked of a child interpreter: this process (the clients) does
    not import the runtime."""
    return subprocess.run(
        [sys.executable, "-c", "from zerolayer.gpu.gguf_loader import default_model_path as p; "
         "print(p())"], capture_output=True, text=True, check=True).stdout.strip()


# ---------------------------------------- one benchmark at a time, and the noise around it


def take_lock(max_wait: float, command: str, path: str = LOCK_PATH):
    """Exclusive flock and POSIX lockf on `path` (both, so a tool taking either kind waits for
    us), waited for at most max_wait seconds (SystemExit after that); the holder's pid and
    command are written into the file for whoever waits next. Returns (file, seconds waited):
    closing the file releases both locks."""
    f = open(path, "a+")
    t0 = time.monotonic()
    told = False
    for how, fn in (("flock", fcntl.flock), ("lockf", fcntl.lockf)):
        while True:
            try:
                fn(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (BlockingIOError, PermissionError):
                waited = time.monotonic() - t0
                if waited >= max_wait:
                    f.close()
                    raise SystemExit(f"{path} ({how}) still held after {waited:.0f} s; "
                                     "giving up") from None
                if not told:
                    f.seek(0)
                    log(f"waiting for {path} (up to {max_wait:.0f} s), held by: "
                        f"{f.read().strip() or 'unknown'}")
                    told = True
                time.sleep(1)
    waited = time.monotonic() - t0
    if told:
        log(f"got {path} after {waited:.0f} s")
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: {command}\n")
    f.flush()
    return f, waited


@contextlib.contextmanager
def bench_lock(command: str, max_wait: float = float("inf"), path: str = LOCK_PATH):
    """take_lock as a context: yields the seconds waited, releases on exit."""
    f, waited = take_lock(max_wait, command, path)
    try:
        yield waited
    finally:
        f.close()


def command_line() -> str:
    """This process's command line, shell-quoted (what the lock file and results record)."""
    return " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])


def proc_jiffies(pid: int | str, children: bool = False) -> int:
    """utime + stime of a process, all its threads included; with `children`, plus those of
    its children it has waited for (cutime, cstime)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    n = int(rest[11]) + int(rest[12])
    if children:
        n += int(rest[13]) + int(rest[14])
    return n


def top_processes(n: int = 5) -> list[str]:
    out = sh(["ps", "-eo", "pcpu,pid,args", "--sort=-pcpu"], timeout=5).splitlines()[1:n + 1]
    return [" ".join(line.split())[:140] for line in out]


class CpuWatch:
    """Splits the machine's CPU time over a block into: this process (the clients), each
    server in `pids`, and everything else ("foreign": other processes and hypervisor steal).
    children: this process's reaped children count as ours (short-lived probes we spawn);
    live_pids: children still running that count as ours until then (a llama-bench run)."""

    def __init__(self, pids: dict[str, int] | None = None, children: bool = False):
        self.pids = pids or {}
        self.children = children
        self.live_pids: list[int] = []

    def snap(self) -> dict:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal: steal counts as taken from us
        busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
        return {"t": time.perf_counter(), "busy": busy,
                "self": proc_jiffies("self", self.children),
                "live": sum(proc_jiffies(p) for p in self.live_pids),
                **{k: proc_jiffies(p) for k, p in self.pids.items()}}

    @staticmethod
    def delta(a: dict, b: dict) -> dict:
        wall = max(b["t"] - a["t"], 1e-6)
        cap = wall * CLK_TCK * NCPU           # jiffies the whole machine had
        ours = sum(b[k] - a[k] for k in a if k not in ("t", "busy"))
        out = {k: (b[k] - a[k]) / cap for k in a if k not in ("t", "busy", "live")}
        out["foreign"] = max(0, (b["busy"] - a["busy"]) - ours) / cap
        return out                            # shares of the machine (1.0 = both cores busy)

    @classmethod
    def foreign(cls, a: dict, b: dict) -> float:
        return cls.delta(a, b)["foreign"]

    def wait_quiet(self, limit: float, max_wait: float, poll: float = 1.0,
                   window: float = 0.5) -> dict:
        """Wait until other processes use <= limit of the machine over `window` seconds,
        checking every `poll` seconds for at most `max_wait`."""
        t0 = time.perf_counter()
        announced = False
        while True:
            a = self.snap()
            time.sleep(window)
            share = self.foreign(a, self.snap())
            waited = time.perf_counter() - t0
            if share <= limit or waited >= max_wait:
                if announced:
                    log(f"  {'quiet again' if share <= limit else 'still busy'}"
                        f" after {waited:.0f} s (others: {share:.0%} of the machine)")
                return {"waited_s": round(waited, 1), "foreign_share": round(share, 4),
                        "quiet": share <= limit}
            if not announced:
                log(f"  machine busy: other processes use {share:.0%} of it; waiting up to "
                    f"{max_wait:.0f} s (polling every {poll:.0f} s): {top_processes(3)}")
                announced = True
            time.sleep(poll)


# ---------------------------------------- the programs under test: servers and llama-bench


class _Proc:
    name = "?"

    def __init__(self, cmd: list[str], log_path: Path, env: dict | None = None):
        self.cmd = cmd
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.t_spawn = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        self.pid = self.proc.pid
        self.ready_s: float | None = None

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with status {self.proc.returncode} before it "
                               f"was ready ({time.perf_counter() - self.t_spawn:.1f} s):\n"
                               + self.log_path.read_text()[-3000:])

    def _wait_until(self, ready, timeout: float, poll: float) -> None:
        """Poll ready() (while the process lives) until it is true; ready_s is when it was."""
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            self._check_alive()
            if ready():
                self.ready_s = time.perf_counter() - self.t_spawn
                return
            time.sleep(poll)
        raise RuntimeError(f"{self.name} not ready after {timeout} s:\n"
                           + self.log_path.read_text()[-3000:])

    def stop(self, timeout: float = 60) -> int | None:
        terminate(self.proc, timeout)
        self._log.close()
        return self.proc.returncode


def terminate(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM (a graceful drain), then SIGKILL after `timeout` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ZeroLayerDaemon(_Proc):
    """`python -m zerolayer.daemon.server` (zerolayerd) with a fresh key, on free UDP and
    metrics ports of 127.0.0.1 unless told. model / threads / max_seq_len None: the daemon's
    defaults. prefix: a wrapper to run it under (["ip", "netns", "exec", NS, "taskset", ...]);
    entry: what follows the interpreter (another script that runs the daemon's main)."""
    name = "zerolayerd"

    def __init__(self, python: str, model: str | None, threads: int | None,
                 max_seq_len: int | None, keys_dir: Path, log_path: Path,
                 extra: list[str] = (), env: dict | None = None, *, prefix: list[str] = (),
                 port: int | None = None, metrics_port: int | None = None,
                 entry: list[str] = ("-m", "zerolayer.daemon.server")):
        self.key_id = 1
        self.secret = secrets.token_bytes(32)
        fd, keys = tempfile.mkstemp(dir=keys_dir, prefix="keys-")   # 0600, unique per daemon
        with os.fdopen(fd, "w") as f:
            f.write(f"{self.key_id} {self.secret.hex()}\n")
        self.port = port or free_port(socket.SOCK_DGRAM)
        self.metrics_port = metrics_port if metrics_port is not None else free_port()
        self.addr = ("127.0.0.1", self.port)
        opt = {"--model-path": model, "--model-threads": threads, "--model-max-seq-len": max_seq_len}
        cmd = [*prefix, python, *entry, "--security-keys-file", keys,
               "--network-port", str(self.port), "--metrics-port", str(self.metrics_port),
               *(x for k, v in opt.items() if v is not None for x in (k, str(v))), *extra]
        super().__init__(cmd, log_path, env)

    def wait_ready(self, timeout: float = 300) -> None:
        self._wait_until(lambda: "ready on" in self.log_path.read_text(), timeout, 0.05)

    def client(self, timeout: float = 60, addr=None):
        """An SDK client with this daemon's key (addr: another carrier's address)."""
        from zerolayer.client import Client
        return Client(addr or self.addr, self.key_id, self.secret, timeout=timeout)


class NativeLlamaServer(_Proc):
    """llama.cpp's own C++ `llama-server` (built by bench/setup_llamacpp.sh): continuous
    batching over `parallel` slots of `ctx_per_slot` tokens each; prefix as ZeroLayerDaemon's."""
    name = "llama-server"

    def __init__(self, binary: str, model: str, threads: int, parallel: int, port: int,
                 log_path: Path, ctx_per_slot: int = 2048, extra: list[str] = (),
                 prefix: list[str] = ()):
        self.port = port
        self.parallel = parallel
        cmd = [*prefix, binary, "-m", model, "-np", str(parallel), "-c", str(ctx_per_slot * parallel),
               "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1",
               "--port", str(port), *extra]
        super().__init__(cmd, log_path)

    def wait_ready(self, timeout: float = 180) -> None:
        """GET /health answers 503 while the model loads and 200 once it serves."""
        def serves() -> bool:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                http_get_timed(c, "/health")
                return True
            except (OSError, RuntimeError):     # not listening yet; 503 while loading
                return False
            finally:
                c.close()
        self._wait_until(serves, timeout, 0.1)


def llama_server_that_serves(start, wait_ready) -> tuple[NativeLlamaServer, list[str]]:
    """start(extra flags) -> a NativeLlamaServer, and wait_ready(server): its default first;
    if that dies of SIGSEGV before it serves (llama.cpp 0c1e570's AMX weight repacking, whose
    warm-up is a prompt, on the Xeon class), once more with --no-repack: a mode that crashes
    on prompts is no peer. Returns the server and the flags it needed."""
    for extra in ([], ["--no-repack"]):
        srv = start(extra)
        try:
            wait_ready(srv)
            return srv, extra
        except RuntimeError as e:
            srv.stop()
            if extra or "exited with status -11" not in str(e):
                raise
            log("  llama-server crashed (SIGSEGV) with its default weight repacking; "
                "measuring it with --no-repack")
    raise AssertionError("unreachable")


class LlamaBenchCrash(RuntimeError):
    """llama-bench died of a signal (not a usage error): that test can't be measured in that
    mode on this machine, which the results then say."""


def llama_bench_help(binary: Path) -> str:
    r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    return r.stdout + r.stderr


def run_llama_bench(cmd: list[str], watch: CpuWatch) -> tuple[list[dict], dict]:
    """Run llama-bench (-o jsonl); each row it prints gets the share of the machine that other
    processes took since the previous row (or the start), so a disturbance is pinned on the
    tests that ran during it."""
    with tempfile.TemporaryFile("w+") as errf:
        a = prev = watch.snap()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True, cwd=str(REPO))
        watch.live_pids = [p.pid]
        rows = []
        try:
            for line in p.stdout:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                now = watch.snap()
                row = json.loads(line)
                row["foreign_share"] = watch.foreign(prev, now)
                row["interval_s"] = now["t"] - prev["t"]
                row["value"] = statistics.median(row["samples_ts"])
                prev = now
                rows.append(row)
            p.wait(timeout=600)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            watch.live_pids = []
        b = watch.snap()  # reaped: its CPU time is in our children's now
        if p.returncode != 0:
            errf.seek(0)
            err = RuntimeError if p.returncode > 0 else LlamaBenchCrash
            raise err(f"llama-bench failed (rc={p.returncode}): {shlex.join(cmd)}\n"
                      f"{errf.read().strip()[-2000:]}")
    return rows, {"wall_s": b["t"] - a["t"], "foreign_share": watch.foreign(a, b)}


# ---------------------------------------- the clients: stdlib HTTP (llama-server) and our SDK


def messages_of(content: str | list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [("user", content)] if isinstance(content, str) else list(content)


def chat_body(content: str | list[tuple[str, str]], max_tokens: int, stream: bool = True,
              extra: dict | None = None) -> bytes:
    """Greedy on llama-server: temperature 0 selects its greedy sampler; the repeat penalty
    is set to 1.0 so the chain is argmax only, like ours.
    `extra`: more body fields (e.g. llama-server's "stream_options")."""
    return json.dumps({
        "messages": [{"role": r, "content": c} for r, c in messages_of(content)],
        "max_tokens": max_tokens, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
        "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "stream": stream, **(extra or {}),
    }).encode()


HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def sse_events(r):
    """The JSON events of an SSE response, as they arrive (read line by line; blank
    separators and ": ping" comments skipped)."""
    while True:
        line = r.readline()
        if not line:
            return
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


def http_stream_chat(conn: http.client.HTTPConnection, body: bytes,
                     headers: dict | None = None, first_only: bool = False) -> dict:
    """POST /v1/chat/completions with stream=true and read the SSE stream as it arrives.
    TTFT = request start -> first event whose delta carries non-empty content. headers: added
    to the defaults (e.g. an Authorization header). first_only: return right after the first
    content chunk, leaving the response open (the caller closes it). tokens: the final
    usage's completion_tokens, else llama-server's timings.predicted_n, else the chunks
    (token_source says which)."""
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers={**HEADERS, **(headers or {})})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    out = {"ttft_s": None, "content_chunks": 0, "usage": None, "timings": None,
           "finish_reason": None}
    parts: list[str] = []
    for ev in sse_events(r):
        if ev.get("usage"):
            out["usage"] = ev["usage"]
        if ev.get("timings"):
            out["timings"] = ev["timings"]
        for ch in ev.get("choices", ()):
            text = (ch.get("delta") or {}).get("content")
            if text:
                if out["ttft_s"] is None:
                    out["ttft_s"] = time.perf_counter() - t0
                parts.append(text)
                out["content_chunks"] += 1
            if ch.get("finish_reason"):
                out["finish_reason"] = ch["finish_reason"]
        if first_only and out["ttft_s"] is not None:
            out["text"] = "".join(parts)
            return out
    r.read()                                  # drain the chunked terminator: keep-alive reuse
    out["e2e_s"] = time.perf_counter() - t0
    out["text"] = "".join(parts)
    u, t = out["usage"], out["timings"]
    if u and "completion_tokens" in u:
        out["tokens"], out["token_source"] = u["completion_tokens"], "usage"
    elif t and "predicted_n" in t:
        out["tokens"], out["token_source"] = t["predicted_n"], "timings.predicted_n"
    else:
        out["tokens"], out["token_source"] = out["content_chunks"], "content chunks"
    return out


def http_get_timed(conn: http.client.HTTPConnection, path: str) -> float:
    t0 = time.perf_counter()
    conn.request("GET", path)
    r = conn.getresponse()
    r.read()
    dt = time.perf_counter() - t0
    if r.status != 200:
        raise RuntimeError(f"GET {path}: HTTP {r.status}")
    return dt


def zl_stream_chat(client, content: str | list[tuple[str, str]], max_tokens: int) -> dict:
    """client.stream(chat) iterated chunk by chunk; same clock points as http_stream_chat
    (t0 just before the call that builds and sends the request)."""
    from zerolayer.protocol.wire import ChatMessage
    t0 = time.perf_counter()
    ttft = None
    parts: list[str] = []
    msgs = [ChatMessage(r, c) for r, c in messages_of(content)]
    with client.stream(messages=msgs, max_tokens=max_tokens,
                       temperature=0.0) as s:
        for chunk in s:
            if chunk:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                parts.append(chunk)
    e2e = time.perf_counter() - t0
    res = s.result
    return {"ttft_s": ttft, "e2e_s": e2e, "text": "".join(parts), "content_chunks": len(parts),
            "finish_reason": res.finish_reason, "attempts": res.attempts,
            "usage": dataclasses.asdict(res.usage),
            "timings_us": dataclasses.asdict(res.timings)}


def results_path(out: str | None, prefix: str) -> Path:
    """Where a run's JSON goes: `out` when given, else bench/results/<prefix>-<time>.json;
    its folder is made."""
    p = Path(out) if out else RESULTS / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def run_meta(**extra) -> dict:
    """What a result records of its run: the date (UTC), the command line and the commit,
    and `extra`."""
    import datetime
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": command_line(), "git": git_head(), **extra}


# ---------------------------------------- tables and threads

def fmt(v: float | None, spec: str = ".1f") -> str:
    """A number for a table cell: `spec`-formatted, '-' when there is none."""
    return "-" if v is None else format(v, spec)


def md_table(head: list[str], rows: list[list]) -> str:
    """A markdown table: the header, its rule, then the rows (cells str()-ed)."""
    return "\n".join("| " + " | ".join(map(str, r)) + " |"
                     for r in [head, ["---"] * len(head), *rows])


def spawn(n: int, fn) -> list:
    """n daemon threads running fn(i), started."""
    import threading
    threads = [threading.Thread(target=fn, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


# ---------------------------------------- the CPU runtime's model, for the kernel and runtime benchmarks

# bench/synth_gguf.py writes its TinyLlama-1.1B-shaped files here
SYNTH_DIR = Path(os.environ.get("ZEROLAYER_SYNTH_DIR",
                                Path.home() / ".cache" / "zerolayer" / "synth"))
# the compiled forward's matmul weight arguments: name -> index in model._wargs (gpu/model.py)
MATMUL_WARGS = {"wqkv": 1, "wo": 2, "wgu": 3, "wdown": 4, "output": 8}


def with_matmuls(model, weight) -> tuple:
    """model._wargs with each matmul's weights replaced by weight(name)."""
    args = list(model._wargs)
    for name, i in MATMUL_WARGS.items():
        args[i] = weight(name)
    return tuple(args)


def activation_wargs(model, act: str) -> tuple:
    """model._wargs with the matmul weights prepared from the model's own for activations `act`
    (gpu/ops/int8_matmul.py), so only the activation width differs."""
    from zerolayer.gpu.ops import cpu_features, int8_matmul
    mw = int8_matmul.prepare_model(model.w, cpu_features.ISA, act)
    return with_matmuls(model, lambda name: int8_matmul.for_forward(getattr(mw, name)))


def timed_decode(model, prompts: list[list[int]], steps: int) -> dict:
    """`steps` greedy steps of each prompt's sequence after its prefill, one step() for all;
    timed from the first step to the last."""
    import numpy as np

    from zerolayer.gpu.model import StepInput
    seqs = [model.new_sequence() for _ in prompts]
    try:
        toks = np.array([int(model.step([StepInput(s, np.asarray(p, np.int32))])[0].argmax())
                         for s, p in zip(seqs, prompts)], np.int32)
        t0 = time.perf_counter()
        for _ in range(steps):
            logits = model.step([StepInput(s, toks[i:i + 1]) for i, s in enumerate(seqs)])
            toks = logits.argmax(axis=1).astype(np.int32)
        dt = time.perf_counter() - t0
    finally:
        for s in seqs:
            s.release()
    return {"seconds": dt, "steps": steps, "batch": len(prompts), "value": len(prompts) * steps / dt}
