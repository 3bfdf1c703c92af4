#!/usr/bin/env python
"""zerolayerd vs llama-cpp-python's OpenAI-compatible server, side by side in one run.

    .venv/bin/python bench/bench_serving.py [--out PATH] [--quick]

Both servers load the same GGUF with 2 threads on the same (2-core) machine. Both are started
once and stay up; the measurements alternate between them in blocks (A B B A ...), and only one
server has requests in flight at any time (the other is idle; its CPU during the block is
recorded). The clients run in this process and are as light as each side allows: for llama.cpp
a stdlib http.client reading the SSE stream line by line, for us the project's SDK.

1. TTFT and end-to-end latency, chat question "What is the capital of France?", greedy,
   max_tokens 32, --seq requests per side after --warmup warm-ups; p50 and p99.
   TTFT = just before the request is sent -> first non-empty content chunk.
   Target: our TTFT p50 <= 0.5x llama.cpp's.
2. Aggregate tok/s, --conc concurrent streams (threads) of max_tokens --conc-tokens each, one
   short distinct chat prompt per stream; completion tokens (ours: usage from DONE; theirs:
   usage of the same greedy request run non-streamed once beforehand, cross-checked against
   the content chunks counted in the stream) / wall time of the whole batch; median over
   --rounds rounds. Target: >= 1.5x.
3. PING round trip, --pings per side: ours Client.ping() (authenticated PING/PONG over UDP),
   theirs GET /v1/models (the server has no /health) on one fresh keep-alive connection.

Results: JSON under bench/results/ (gitignored) and a markdown table on stdout.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import http.client
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    CpuWatch,
    LlamaServer,
    ZeroLayerDaemon,
    chat_body,
    free_port,
    http_chat,
    http_get_timed,
    http_stream_chat,
    log,
    top_processes,
    zl_stream_chat,
)

REPO = Path(__file__).resolve().parent.parent
BENCH_PY = REPO / ".venv-bench" / "bin" / "python"
RESULTS = REPO / "bench" / "results"
QUESTION = "What is the capital of France?"
TOPICS = ["the sea", "volcanoes", "the moon", "bees", "rivers", "trains", "chess", "coffee",
          "mountains", "owls", "rain", "bridges", "the desert", "music", "autumn", "clocks"]
TARGETS = {"ttft_p50_ratio": ("our TTFT p50 / llama.cpp server's", "<=", 0.5),
           "tok_s_ratio": ("our aggregate tok/s / llama.cpp server's", ">=", 1.5)}


SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def fresh_prompt(i: int) -> list[tuple[str, str]]:
    """The chat question behind a system message that starts differently every time (the
    template's default one, numbered), so no server can reuse an earlier request's KV cache
    beyond the first few template tokens: the TTFT includes a real ~40-token prefill."""
    return [("system", f"Request {i}. {SYSTEM}"), ("user", QUESTION)]


def conc_prompt(i: int) -> str:
    return f"Write a short poem about {TOPICS[i % len(TOPICS)]}."


def pct(values: list[float], q: float) -> float:
    """Percentile by linear interpolation between closest ranks (numpy's default); with 50
    samples p99 lies between the two slowest."""
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def stats(values: list[float]) -> dict:
    return {"n": len(values), "p50": pct(values, 50), "p99": pct(values, 99),
            "mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=15).stdout.strip()
    except Exception as e:
        return f"<{e}>"


def machine_info() -> dict:
    lscpu = dict(line.split(":", 1) for line in sh("lscpu").splitlines() if ":" in line)
    lscpu = {k.strip(): v.strip() for k, v in lscpu.items()}
    return {"cpu_model": lscpu.get("Model name"), "cpus": os.cpu_count(),
            "cores_per_socket": lscpu.get("Core(s) per socket"),
            "threads_per_core": lscpu.get("Thread(s) per core"),
            "hypervisor": lscpu.get("Hypervisor vendor"), "kernel": platform.release()}


def versions() -> dict:
    bench = sh(f"{BENCH_PY} -c 'import importlib.metadata as m, sys; print(sys.version.split()[0]);"
               " [print(p, m.version(p)) for p in (\"llama_cpp_python\", \"uvicorn\", \"fastapi\","
               " \"sse-starlette\", \"starlette\")]'").splitlines()
    out = {"python_ours": platform.python_version(),
           "python_llama": bench[0] if bench else None,
           "zerolayer_git": sh(f"git -C {REPO} rev-parse --short HEAD"),
           "zerolayer_dirty": bool(sh(f"git -C {REPO} status --porcelain -- daemon gpu"))}
    for line in bench[1:]:
        k, _, v = line.partition(" ")
        out[k] = v
    return out


class Bench:
    def __init__(self, args):
        self.a = args
        self.blocks: list[dict] = []

    # -- a measured block: wait for quiet, account CPU, keep the samples -----------------------

    def block(self, kind: str, side: str, fn) -> dict:
        pre = self.watch.wait_quiet(self.a.quiet_limit, self.a.block_wait, poll=2.0, window=0.5)
        a = self.watch.snap()
        samples = fn()
        cpu = {k: round(v, 4) for k, v in self.watch.delta(a, self.watch.snap()).items()}
        b = {"kind": kind, "side": side, "pre_wait": pre, "cpu_share": cpu, "samples": samples}
        self.blocks.append(b)
        idle = "zl" if side == "llama" else "llama"
        log(f"  {kind:<5} {side:<5} done: cpu self {cpu['self']:.0%} {side} {cpu[side]:.0%} "
            f"idle {idle} {cpu[idle]:.1%} foreign {cpu['foreign']:.1%}")
        return b

    # -- the two sides ---------------------------------------------------------------------

    def seq_llama(self, n: int, prompts=None, max_tokens=None) -> list[dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.llama.port, timeout=60)
        mt = max_tokens or self.a.seq_tokens
        out = [http_stream_chat(conn, chat_body(p, mt)) for p in (prompts or [QUESTION] * n)]
        conn.close()
        return out

    def seq_zl(self, n: int, prompts=None, max_tokens=None) -> list[dict]:
        mt = max_tokens or self.a.seq_tokens
        return [zl_stream_chat(self.client, p, mt) for p in (prompts or [QUESTION] * n)]

    def _concurrent(self, worker, n: int) -> dict:
        barrier = threading.Barrier(n + 1)
        results: list[dict | None] = [None] * n
        ends = [0.0] * n
        errors: list[str] = []

        def run(i):
            try:
                prep = worker("prep", i, None)
                barrier.wait()
                results[i] = worker("go", i, prep)
            except Exception as e:       # noqa: BLE001 - recorded and reported
                errors.append(f"{i}: {e!r}")
            ends[i] = time.perf_counter()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = max(ends) - t0
        return {"wall_s": wall, "errors": errors, "streams": results}

    def conc_llama(self) -> dict:
        def worker(step, i, conn):
            if step == "prep":   # connect before the start line: no TCP handshake in the timing
                c = http.client.HTTPConnection("127.0.0.1", self.llama.port, timeout=300)
                c.connect()
                return c
            r = http_stream_chat(conn, chat_body(conc_prompt(i), self.a.conc_tokens))
            conn.close()
            return r
        r = self._concurrent(worker, self.a.conc)
        toks = 0
        chunks = 0
        for i, s in enumerate(r["streams"]):
            if s is None:
                continue
            chunks += s["content_chunks"]
            toks += self.llama_ref[i]["completion_tokens"]
            s["completion_tokens"] = self.llama_ref[i]["completion_tokens"]
            s["same_text_as_reference"] = s["text"] == self.llama_ref[i]["text"]
        r.update(completion_tokens=toks, content_chunks=chunks, tok_s=toks / r["wall_s"])
        return r

    def conc_zl(self) -> dict:
        def worker(step, i, _):
            if step == "prep":
                return None
            return zl_stream_chat(self.client, conc_prompt(i), self.a.conc_tokens)
        r = self._concurrent(worker, self.a.conc)
        toks = sum(s["usage"]["completion_tokens"] for s in r["streams"] if s)
        chunks = sum(s["content_chunks"] for s in r["streams"] if s)
        r.update(completion_tokens=toks, content_chunks=chunks, tok_s=toks / r["wall_s"])
        return r

    def ping_llama(self, n: int) -> list[dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.llama.port, timeout=10)
        conn.connect()
        out = [{"rtt_s": http_get_timed(conn, "/v1/models")} for _ in range(n)]
        conn.close()
        return out

    def ping_zl(self, n: int) -> list[dict]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            inner = self.client.ping()
            out.append({"rtt_s": time.perf_counter() - t0, "sdk_rtt_s": inner})
        return out

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> dict:
        a = self.a
        RESULTS.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out_path = Path(a.out) if a.out else RESULTS / f"serving-{stamp}.json"
        started = _dt.datetime.now().astimezone()
        r: dict = {"bench": "serving", "issue": 3, "date": started.isoformat(timespec="seconds"),
                   "command": shlex.join([sys.executable, *sys.argv]),
                   "machine": machine_info(), "versions": versions(), "args": vars(a)}
        r["machine"]["uptime_before"] = sh("uptime")
        r["machine"]["vmstat_before"] = sh("vmstat 1 3")
        log(f"uptime: {r['machine']['uptime_before']}")
        log("vmstat 1 3:\n" + r["machine"]["vmstat_before"])

        self.watch = CpuWatch({})
        log("checking that the machine is quiet before starting the servers")
        r["preflight"] = self.watch.wait_quiet(a.quiet_limit, a.max_wait, poll=a.poll, window=3.0)
        r["preflight"]["top"] = top_processes(4)
        if not r["preflight"]["quiet"]:
            if not a.measure_if_busy:
                raise SystemExit(f"machine still busy after {a.max_wait:.0f} s "
                                 f"({r['preflight']['top']}); not measuring "
                                 "(--measure-if-busy to measure anyway)")
            log(f"WARNING: machine still busy after {a.max_wait:.0f} s; results will be noisy")

        model = a.model or sh(f"{sys.executable} -c 'from zerolayer.gpu.gguf_loader import "
                              "default_model_path as p; print(p())'")
        r["model"] = {"path": model, "bytes": os.path.getsize(model)}
        tmp = Path(tempfile.mkdtemp(prefix="zl-bench-serving-"))
        llama_extra = ["--interrupt_requests", "False", "--verbose", "False",
                       "--flash_attn", str(a.llama_flash_attn), *shlex.split(a.llama_extra)]
        self.llama = self.zl = None
        try:
            log("starting llama_cpp.server")
            self.llama = LlamaServer(str(BENCH_PY), model, a.threads, a.n_ctx, free_port(),
                                     tmp / "llama.log", llama_extra)
            self.llama.wait_ready()
            log(f"  ready in {self.llama.ready_s:.1f} s (pid {self.llama.pid})")
            log("starting zerolayerd")
            self.zl = ZeroLayerDaemon(sys.executable, model, a.threads, 2048, tmp,
                                      tmp / "zerolayerd.log", shlex.split(a.zl_extra))
            self.zl.wait_ready()
            log(f"  ready in {self.zl.ready_s:.1f} s (pid {self.zl.pid})")
            r["servers"] = {
                "llama": {"cmd": shlex.join(self.llama.cmd), "ready_s": self.llama.ready_s,
                          "ping_endpoint": "GET /v1/models"},
                "zl": {"cmd": shlex.join(self.zl.cmd), "ready_s": self.zl.ready_s,
                       "ping_endpoint": "Client.ping() (PING/PONG)"}}
            from zerolayer.client import Client
            self.client = Client(self.zl.addr, self.zl.key_id, self.zl.secret, timeout=60)
            self.watch = CpuWatch({"llama": self.llama.pid, "zl": self.zl.pid})
            self._measure(r)
        finally:
            for s in (self.zl, self.llama):
                if s is not None:
                    s.stop()
            for name, s in (("llama", self.llama), ("zl", self.zl)):
                if s is not None:
                    r.setdefault("server_logs_tail", {})[name] = s.log_path.read_text()[-2000:]
        r["machine"]["uptime_after"] = sh("uptime")
        r["blocks"] = self.blocks
        r["finished"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        r["duration_s"] = (_dt.datetime.now().astimezone() - started).total_seconds()
        self._summarise(r)
        out_path.write_text(json.dumps(r, indent=1, default=str))
        r["json_path"] = str(out_path)
        return r

    def _measure(self, r: dict) -> None:
        a = self.a
        # warm-up + equality checks: same prompt (token count), same greedy answer
        log(f"warm-up: {a.warmup} streamed requests per side, then one non-streamed llama request")
        wl = self.block("warm", "llama", lambda: self.seq_llama(a.warmup))
        wz = self.block("warm", "zl", lambda: self.seq_zl(a.warmup))
        conn = http.client.HTTPConnection("127.0.0.1", self.llama.port, timeout=60)
        ref = http_chat(conn, chat_body(QUESTION, a.seq_tokens, stream=False))
        conn.close()
        r["check"] = {
            "llama_text": wl["samples"][-1]["text"], "zl_text": wz["samples"][-1]["text"],
            "llama_prompt_tokens": ref["usage"]["prompt_tokens"],
            "llama_completion_tokens": ref["usage"]["completion_tokens"],
            "llama_stream_content_chunks": wl["samples"][-1]["content_chunks"],
            "zl_prompt_tokens": wz["samples"][-1]["usage"]["prompt_tokens"],
            "zl_completion_tokens": wz["samples"][-1]["usage"]["completion_tokens"]}
        log(f"  check: {r['check']}")

        half = max(1, a.seq // 2)
        log(f"sequential TTFT/e2e: {a.seq} per side in blocks of {half}, A B B A")
        for side in ("llama", "zl", "zl", "llama")[:2 if a.seq == half else 4]:
            self.block("seq", side, (lambda: self.seq_llama(half)) if side == "llama"
                       else (lambda: self.seq_zl(half)))

        if a.fresh:
            half = max(1, a.fresh // 2)
            log(f"sequential TTFT, no prompt reuse: {a.fresh} per side, distinct system "
                f"messages, max_tokens {a.fresh_tokens}, A B B A")
            k = 0
            for side in ("llama", "zl", "zl", "llama"):
                prompts = [fresh_prompt(k + j) for j in range(half)]
                k += half
                self.block("fresh", side, (lambda p=prompts: self.seq_llama(half, p, a.fresh_tokens))
                           if side == "llama" else
                           (lambda p=prompts: self.seq_zl(half, p, a.fresh_tokens)))

        log(f"concurrency: reference token counts for llama ({a.conc} prompts, non-streamed, "
            f"serial; doubles as its warm-up) and one discarded round for zerolayerd")
        self.llama_ref = []
        conn = http.client.HTTPConnection("127.0.0.1", self.llama.port, timeout=300)
        for i in range(a.conc):
            x = http_chat(conn, chat_body(conc_prompt(i), a.conc_tokens, stream=False))
            self.llama_ref.append({"completion_tokens": x["usage"]["completion_tokens"],
                                   "prompt_tokens": x["usage"]["prompt_tokens"], "text": x["text"]})
        conn.close()
        r["conc_llama_reference"] = self.llama_ref
        self.block("cwarm", "zl", self.conc_zl)
        order = ("llama", "zl", "zl", "llama", "llama", "zl", "zl", "llama")[:2 * a.rounds]
        log(f"concurrency: {a.rounds} rounds per side, order {' '.join(order)}")
        for side in order:
            b = self.block("conc", side, self.conc_llama if side == "llama" else self.conc_zl)
            s = b["samples"]
            log(f"    {side}: {s['completion_tokens']} tokens in {s['wall_s']:.2f} s = "
                f"{s['tok_s']:.1f} tok/s, errors {len(s['errors'])}")

        half = max(1, a.pings // 2)
        log(f"ping: {a.pings} per side in blocks of {half}, A B B A")
        for side in ("llama", "zl", "zl", "llama"):
            self.block("ping", side, (lambda: self.ping_llama(half)) if side == "llama"
                       else (lambda: self.ping_zl(half)))

    def _summarise(self, r: dict) -> None:
        def samples(kind, side):
            out = []
            for b in self.blocks:
                if b["kind"] == kind and b["side"] == side:
                    out.extend(b["samples"] if isinstance(b["samples"], list) else [b["samples"]])
            return out

        s: dict = {}
        for side in ("llama", "zl"):
            seq = samples("seq", side)
            conc = samples("conc", side)
            pings = samples("ping", side)
            fresh = samples("fresh", side)
            d = {}
            if fresh:
                d["fresh_ttft_s"] = stats([x["ttft_s"] for x in fresh if x["ttft_s"] is not None])
                if side == "zl":
                    d["fresh_prompt_tokens"] = sorted({x["usage"]["prompt_tokens"] for x in fresh})
                    d["fresh_cached_prompt_tokens"] = sorted(
                        {x["usage"]["cached_prompt_tokens"] for x in fresh})
                    d["fresh_prefill_us"] = stats([x["timings_us"]["prefill_us"] for x in fresh])
            if seq:
                d["ttft_s"] = stats([x["ttft_s"] for x in seq if x["ttft_s"] is not None])
                d["e2e_s"] = stats([x["e2e_s"] for x in seq])
                d["seq_completion_tokens"] = sorted({x["usage"]["completion_tokens"] for x in seq
                                                     if x.get("usage")} or
                                                    {x["content_chunks"] for x in seq})
                d["seq_texts"] = sorted({x["text"] for x in seq})
                if side == "zl":
                    d["seq_cached_prompt_tokens"] = sorted(
                        {x["usage"]["cached_prompt_tokens"] for x in seq})
                    d["seq_prefill_us"] = stats([x["timings_us"]["prefill_us"] for x in seq])
                # time per generated token after the first, so that answers of different
                # lengths (the two runtimes' greedy answers differ) can still be compared
                per = []
                for x in seq:
                    n = x["usage"]["completion_tokens"] if x.get("usage") else x["content_chunks"]
                    if n > 1 and x["ttft_s"] is not None:
                        per.append((x["e2e_s"] - x["ttft_s"]) / (n - 1))
                if per:
                    d["after_first_per_token_s"] = stats(per)
            if conc:
                d["tok_s_rounds"] = [x["tok_s"] for x in conc]
                d["tok_s_median"] = statistics.median(d["tok_s_rounds"])
                d["conc_wall_s"] = [x["wall_s"] for x in conc]
                d["conc_tokens"] = [x["completion_tokens"] for x in conc]
                d["conc_content_chunks"] = [x["content_chunks"] for x in conc]
                d["conc_errors"] = sum(len(x["errors"]) for x in conc)
                ttfts = [st["ttft_s"] for x in conc for st in x["streams"] if st and st["ttft_s"]]
                if ttfts:
                    d["conc_ttft_s"] = stats(ttfts)
            if pings:
                d["ping_s"] = stats([x["rtt_s"] for x in pings])
                if side == "zl":
                    d["ping_sdk_internal_s"] = stats([x["sdk_rtt_s"] for x in pings])
            s[side] = d
        L, Z = s.get("llama", {}), s.get("zl", {})
        ratios = {}
        if "ttft_s" in L and "ttft_s" in Z:
            ratios["ttft_p50_ratio"] = Z["ttft_s"]["p50"] / L["ttft_s"]["p50"]
            ratios["ttft_p99_ratio"] = Z["ttft_s"]["p99"] / L["ttft_s"]["p99"]
            ratios["e2e_p50_ratio"] = Z["e2e_s"]["p50"] / L["e2e_s"]["p50"]
            ratios["e2e_p99_ratio"] = Z["e2e_s"]["p99"] / L["e2e_s"]["p99"]
        if "after_first_per_token_s" in L and "after_first_per_token_s" in Z:
            ratios["per_token_p50_ratio"] = (Z["after_first_per_token_s"]["p50"]
                                             / L["after_first_per_token_s"]["p50"])
        if "fresh_ttft_s" in L and "fresh_ttft_s" in Z:
            ratios["fresh_ttft_p50_ratio"] = Z["fresh_ttft_s"]["p50"] / L["fresh_ttft_s"]["p50"]
            ratios["fresh_ttft_p99_ratio"] = Z["fresh_ttft_s"]["p99"] / L["fresh_ttft_s"]["p99"]
        if "tok_s_median" in L and "tok_s_median" in Z:
            ratios["tok_s_ratio"] = Z["tok_s_median"] / L["tok_s_median"]
        if "ping_s" in L and "ping_s" in Z:
            ratios["ping_p50_ratio"] = Z["ping_s"]["p50"] / L["ping_s"]["p50"]
            ratios["ping_p99_ratio"] = Z["ping_s"]["p99"] / L["ping_s"]["p99"]
        verdicts = {}
        for k, (label, op, target) in TARGETS.items():
            v = ratios.get(k)
            met = None if v is None else (v <= target if op == "<=" else v >= target)
            verdicts[k] = {"label": label, "value": v, "op": op, "target": target, "met": met}
        foreign = [b["cpu_share"]["foreign"] for b in self.blocks]
        idle = [b["cpu_share"]["zl" if b["side"] == "llama" else "llama"] for b in self.blocks]
        s["noise"] = {"foreign_share_max": max(foreign, default=None),
                      "foreign_share_median": statistics.median(foreign) if foreign else None,
                      "idle_server_share_max": max(idle, default=None),
                      "blocks_disturbed": sum(f > self.a.quiet_limit for f in foreign)}
        r["summary"] = s
        r["ratios"] = ratios
        r["targets"] = verdicts


def ms(x: float) -> str:
    return f"{x * 1e3:.2f}" if x < 0.1 else f"{x * 1e3:.1f}"


def render(r: dict) -> str:
    s, R, T = r["summary"], r["ratios"], r["targets"]
    L, Z = s["llama"], s["zl"]
    m, v = r["machine"], r["versions"]
    a = r["args"]

    def met(k):
        t = T[k]
        return ("**met**" if t["met"] else "**missed**") + f" (target {t['op']} {t['target']}x)"

    lines = [
        f"### Serving: zerolayerd vs llama-cpp-python server ({r['date']})", "",
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs ({m['cores_per_socket']} cores/socket, "
        f"{m['threads_per_core']} thread/core, {m['hypervisor'] or 'bare metal'}), "
        f"kernel {m['kernel']}. Model: `{Path(r['model']['path']).name}`, 2 threads each.",
        f"Versions: zerolayer {v['zerolayer_git']}{' (dirty)' if v['zerolayer_dirty'] else ''}"
        f" (Python {v['python_ours']}); llama-cpp-python {v.get('llama_cpp_python')} "
        f"(Python {v['python_llama']}, uvicorn {v.get('uvicorn')}, fastapi {v.get('fastapi')}, "
        f"sse-starlette {v.get('sse-starlette')}).", "",
        "| metric | zerolayerd | llama.cpp server | ratio (ours/theirs) | target |",
        "|---|---|---|---|---|",
        f"| TTFT p50, ms ({L['ttft_s']['n']} seq. requests) | {ms(Z['ttft_s']['p50'])} | "
        f"{ms(L['ttft_s']['p50'])} | {R['ttft_p50_ratio']:.3f} | {met('ttft_p50_ratio')} |",
        f"| TTFT p99, ms | {ms(Z['ttft_s']['p99'])} | {ms(L['ttft_s']['p99'])} | "
        f"{R['ttft_p99_ratio']:.3f} | |",
        *([f"| TTFT p50, ms, no prompt reuse ({L['fresh_ttft_s']['n']} seq., distinct system "
           f"messages; not the issue's metric) | {ms(Z['fresh_ttft_s']['p50'])} | "
           f"{ms(L['fresh_ttft_s']['p50'])} | {R['fresh_ttft_p50_ratio']:.3f} | |",
           f"| TTFT p99, ms, no prompt reuse | {ms(Z['fresh_ttft_s']['p99'])} | "
           f"{ms(L['fresh_ttft_s']['p99'])} | {R['fresh_ttft_p99_ratio']:.3f} | |"]
          if "fresh_ttft_p50_ratio" in R else []),
        f"| end-to-end p50, ms (max_tokens {a['seq_tokens']}) | {ms(Z['e2e_s']['p50'])} | "
        f"{ms(L['e2e_s']['p50'])} | {R['e2e_p50_ratio']:.3f} | |",
        f"| end-to-end p99, ms | {ms(Z['e2e_s']['p99'])} | {ms(L['e2e_s']['p99'])} | "
        f"{R['e2e_p99_ratio']:.3f} | |",
        f"| after the first token, ms/token p50 | {ms(Z['after_first_per_token_s']['p50'])} | "
        f"{ms(L['after_first_per_token_s']['p50'])} | {R['per_token_p50_ratio']:.3f} | |",
        f"| aggregate tok/s, {a['conc']} streams x {a['conc_tokens']} tok, median of "
        f"{len(Z['tok_s_rounds'])} | {Z['tok_s_median']:.1f} | {L['tok_s_median']:.1f} | "
        f"{R['tok_s_ratio']:.2f} | {met('tok_s_ratio')} |",
        f"| PING p50, ms ({L['ping_s']['n']} each) | {ms(Z['ping_s']['p50'])} | "
        f"{ms(L['ping_s']['p50'])} | {R['ping_p50_ratio']:.3f} | |",
        f"| PING p99, ms | {ms(Z['ping_s']['p99'])} | {ms(L['ping_s']['p99'])} | "
        f"{R['ping_p99_ratio']:.3f} | |",
        "",
        f"- tok/s rounds: ours {', '.join(f'{x:.1f}' for x in Z['tok_s_rounds'])}; theirs "
        f"{', '.join(f'{x:.1f}' for x in L['tok_s_rounds'])} (tokens per round: ours "
        f"{Z['conc_tokens']}, theirs {L['conc_tokens']}; content chunks theirs "
        f"{L['conc_content_chunks']}).",
    ]
    if "conc_ttft_s" in Z and "conc_ttft_s" in L:
        lines.append(f"- TTFT under {a['conc']} concurrent streams, p50/p99 ms: ours "
                     f"{ms(Z['conc_ttft_s']['p50'])}/{ms(Z['conc_ttft_s']['p99'])}, theirs "
                     f"{ms(L['conc_ttft_s']['p50'])}/{ms(L['conc_ttft_s']['p99'])} "
                     "(llama-cpp-python serves one request at a time behind a lock).")
    c = r["check"]
    lines.append(
        f"- Prompt reuse: in the sequential run (the same prompt 50 times) llama-cpp-python "
        f"keeps the previous request's KV cache and evaluates only the tokens after the longest "
        f"common prefix, so its TTFT holds almost no prefill; ours reported cached prompt tokens "
        f"{Z.get('seq_cached_prompt_tokens')} and a server-side prefill p50 of "
        f"{Z['seq_prefill_us']['p50'] / 1e3:.1f} ms. The 'no prompt reuse' rows take that away.")
    lines += [
        f"- Same prompt, same answer: prompt tokens ours {c['zl_prompt_tokens']}, theirs "
        f"{c['llama_prompt_tokens']}; greedy answer ours {c['zl_text']!r} "
        f"({c['zl_completion_tokens']} tokens), theirs {c['llama_text']!r} "
        f"({c['llama_completion_tokens']} tokens): the end-to-end rows compare answers of "
        f"different lengths; the ms/token row normalises that.",
        f"- PING: ours `Client.ping()` timed around the call (fresh UDP socket, HMAC-signed "
        f"PING, signed PONG; the SDK's own figure p50 {ms(Z['ping_sdk_internal_s']['p50'])} ms); "
        f"theirs `GET /v1/models` (llama-cpp-python has no /health) on one keep-alive connection.",
        f"- Noise: other processes took at most {s['noise']['foreign_share_max']:.1%} of the "
        f"machine during a block (median {s['noise']['foreign_share_median']:.1%}); the idle "
        f"server at most {s['noise']['idle_server_share_max']:.1%}. Preflight waited "
        f"{r['preflight']['waited_s']:.0f} s for quiet.",
        f"- Load: before `{r['machine']['uptime_before'].strip()}`; after "
        f"`{r['machine']['uptime_after'].strip()}`. Run took {r['duration_s']:.0f} s.",
        f"- llama.cpp server: `{r['servers']['llama']['cmd']}`",
        f"- zerolayerd: `{r['servers']['zl']['cmd']}`",
        f"- Command: `{r['command']}`",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="GGUF (default: the bundled SmolLM2-135M Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096, help="llama.cpp server context")
    ap.add_argument("--seq", type=int, default=50, help="sequential requests per side")
    ap.add_argument("--seq-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--fresh", type=int, default=20,
                    help="extra: sequential requests per side with no reusable prompt prefix (0 = skip)")
    ap.add_argument("--fresh-tokens", type=int, default=8)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--conc-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pings", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny counts, not for publishing")
    ap.add_argument("--llama-flash-attn", default="False", choices=["False", "True"],
                    help="llama_cpp.server --flash_attn (its default: False)")
    ap.add_argument("--llama-extra", default="", help="more llama_cpp.server flags")
    ap.add_argument("--zl-extra", default="", help="more zerolayerd flags")
    ap.add_argument("--quiet-limit", type=float, default=0.10,
                    help="share of the machine other processes may use (0.10 = 20%% of a core)")
    ap.add_argument("--max-wait", type=float, default=900, help="preflight: wait this long for quiet")
    ap.add_argument("--measure-if-busy", action="store_true",
                    help="measure even if the machine is still busy after --max-wait")
    ap.add_argument("--poll", type=float, default=30, help="preflight: poll interval, s")
    ap.add_argument("--block-wait", type=float, default=60, help="before a block: wait for quiet")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.quick:
        a.seq, a.warmup, a.conc, a.conc_tokens, a.rounds, a.pings, a.fresh = 6, 1, 4, 16, 1, 20, 4
    r = Bench(a).run()
    print(render(r))
    print(f"\nJSON: {r['json_path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
