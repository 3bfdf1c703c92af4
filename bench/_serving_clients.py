"""Helpers for bench_serving.py: the two servers as subprocesses, a stdlib-only streaming
HTTP/SSE client for llama-cpp-python's OpenAI-compatible server, a timed wrapper around our
SDK, and machine-noise accounting. Nothing here imports llama_cpp: that side only ever runs in
its own process under .venv-bench.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- noise accounting


def busy_jiffies() -> int:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal: steal counts as taken from us
    return v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)


def proc_jiffies(pid: int | str) -> int:
    """utime + stime of a process, all its threads included."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(rest[11]) + int(rest[12])


def top_processes(n: int = 5) -> list[str]:
    try:
        out = subprocess.run(["ps", "-eo", "pcpu,pid,args", "--sort=-pcpu"], capture_output=True,
                             text=True, timeout=5).stdout.splitlines()[1:n + 1]
        return [" ".join(line.split())[:140] for line in out]
    except Exception:
        return []


class CpuWatch:
    """Splits the machine's CPU time over a block into: this process (the clients), each
    server, and everything else ("foreign": other processes and hypervisor steal)."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids

    def snap(self) -> dict:
        return {"t": time.perf_counter(), "busy": busy_jiffies(), "self": proc_jiffies("self"),
                **{k: proc_jiffies(p) for k, p in self.pids.items()}}

    @staticmethod
    def delta(a: dict, b: dict) -> dict:
        wall = max(b["t"] - a["t"], 1e-6)
        cap = wall * CLK_TCK * NCPU           # jiffies the whole machine had
        ours = sum(b[k] - a[k] for k in a if k not in ("t", "busy"))
        out = {k: (b[k] - a[k]) / cap for k in a if k not in ("t", "busy")}
        out["foreign"] = max(0, (b["busy"] - a["busy"]) - ours) / cap
        return out                            # shares of the machine (1.0 = both cores busy)

    def foreign_share(self, window: float) -> float:
        a = self.snap()
        time.sleep(window)
        return self.delta(a, self.snap())["foreign"]

    def wait_quiet(self, limit: float, max_wait: float, poll: float, window: float) -> dict:
        """Wait until other processes use <= limit of the machine over `window` seconds,
        checking every `poll` seconds for at most `max_wait`."""
        t0 = time.perf_counter()
        announced = False
        while True:
            share = self.foreign_share(window)
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


# ---------------------------------------------------------------- the servers


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
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                               + self.log_path.read_text()[-3000:])

    def stop(self) -> int | None:
        terminate(self.proc)
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


class LlamaServer(_Proc):
    """`python -m llama_cpp.server` (llama-cpp-python's FastAPI/uvicorn/sse-starlette server)."""
    name = "llama_cpp.server"

    def __init__(self, python: str, model: str, threads: int, n_ctx: int, port: int,
                 log_path: Path, extra: list[str] = ()):
        self.port = port
        cmd = [python, "-m", "llama_cpp.server", "--model", model,
               "--n_threads", str(threads), "--n_threads_batch", str(threads),
               "--n_ctx", str(n_ctx), "--host", "127.0.0.1", "--port", str(port), *extra]
        super().__init__(cmd, log_path)

    def wait_ready(self, timeout: float = 180) -> None:
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            self._check_alive()
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/v1/models")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    self.ready_s = time.perf_counter() - self.t_spawn
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout} s")


class ZeroLayerDaemon(_Proc):
    """`python -m zerolayer.daemon.server` (zerolayerd) on 127.0.0.1 with a fresh key."""
    name = "zerolayerd"

    def __init__(self, python: str, model: str, threads: int, max_seq_len: int, keys_dir: Path,
                 log_path: Path, extra: list[str] = (), env: dict | None = None):
        self.key_id = 1
        self.secret = secrets.token_bytes(32)
        keys = keys_dir / "keys"
        keys.write_text(f"{self.key_id} {self.secret.hex()}\n")
        os.chmod(keys, 0o600)
        self.port = free_port(socket.SOCK_DGRAM)
        self.metrics_port = free_port()
        self.addr = ("127.0.0.1", self.port)
        cmd = [python, "-m", "zerolayer.daemon.server", "--security-keys-file", str(keys),
               "--network-port", str(self.port), "--metrics-port", str(self.metrics_port),
               "--model-path", model, "--model-threads", str(threads),
               "--model-max-seq-len", str(max_seq_len), *extra]
        super().__init__(cmd, log_path, env)

    def wait_ready(self, timeout: float = 300) -> None:
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            self._check_alive()
            if "ready on" in self.log_path.read_text():
                self.ready_s = time.perf_counter() - self.t_spawn
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout} s")


class NativeLlamaServer(_Proc):
    """llama.cpp's own C++ `llama-server` (built by bench/setup_llamacpp.sh): continuous
    batching over `parallel` slots of `ctx_per_slot` tokens each."""
    name = "llama-server"

    def __init__(self, binary: str, model: str, threads: int, parallel: int, port: int,
                 log_path: Path, ctx_per_slot: int = 2048, extra: list[str] = (),
                 prefix: list[str] = ()):
        self.port = port
        self.parallel = parallel
        # prefix: a wrapper to run it under, e.g. ["ip", "netns", "exec", NS, "taskset", ...]
        cmd = [*prefix, binary, "-m", model, "-np", str(parallel), "-c", str(ctx_per_slot * parallel),
               "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1",
               "--port", str(port), *extra]
        super().__init__(cmd, log_path)

    def wait_ready(self, timeout: float = 180) -> None:
        """GET /health answers 503 while the model loads and 200 once it serves."""
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            self._check_alive()
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    self.ready_s = time.perf_counter() - self.t_spawn
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout} s")


# ---------------------------------------------------------------- the llama.cpp side: stdlib HTTP


def messages_of(content: str | list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [("user", content)] if isinstance(content, str) else list(content)


def chat_body(content: str | list[tuple[str, str]], max_tokens: int, stream: bool = True,
              extra: dict | None = None) -> bytes:
    """Greedy on llama-cpp-python's server: temperature 0 selects its greedy sampler; the
    repeat penalty (server default 1.1) is set to 1.0 so the chain is argmax only, like ours.
    `extra`: more body fields (e.g. llama-server's "stream_options")."""
    return json.dumps({
        "messages": [{"role": r, "content": c} for r, c in messages_of(content)],
        "max_tokens": max_tokens, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
        "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "stream": stream, **(extra or {}),
    }).encode()


HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def http_stream_chat(conn: http.client.HTTPConnection, body: bytes,
                     headers: dict | None = None) -> dict:
    """POST /v1/chat/completions with stream=true and read the SSE stream line by line as it
    arrives. TTFT = request start -> first event whose delta carries non-empty content.
    headers: added to the defaults (e.g. an Authorization header)."""
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers={**HEADERS, **(headers or {})})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft = None
    parts: list[str] = []
    n_content = 0
    finish = None
    usage = None
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data:"):
            continue                          # blank separators, ": ping" comments
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", ()):
            text = (ch.get("delta") or {}).get("content")
            if text:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                parts.append(text)
                n_content += 1
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    r.read()                                  # drain the chunked terminator: keep-alive reuse
    e2e = time.perf_counter() - t0
    return {"ttft_s": ttft, "e2e_s": e2e, "text": "".join(parts), "content_chunks": n_content,
            "finish_reason": finish, "usage": usage}


def http_chat(conn: http.client.HTTPConnection, body: bytes) -> dict:
    """Non-streaming POST /v1/chat/completions (for usage: token counts and the prompt size)."""
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
    d = json.loads(data)
    return {"text": d["choices"][0]["message"]["content"], "usage": d["usage"],
            "finish_reason": d["choices"][0]["finish_reason"]}


def http_get_timed(conn: http.client.HTTPConnection, path: str) -> float:
    t0 = time.perf_counter()
    conn.request("GET", path)
    r = conn.getresponse()
    r.read()
    dt = time.perf_counter() - t0
    if r.status != 200:
        raise RuntimeError(f"GET {path}: HTTP {r.status}")
    return dt


# ---------------------------------------------------------------- our side: the SDK


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
