#!/usr/bin/env python
"""zerolayer-http (the HTTP/SSE edge) vs llama.cpp's `llama-server` vs our direct SDK.

    .venv/bin/python bench/bench_http.py [--out PATH] [--quick]

Three sides, the same GGUF and the same number of threads (--threads, 2), all started once:
- `llama-server` (native C++, bench/setup_llamacpp.sh, .bench-llamacpp/bin) with --parallel
  slots (16) of 2048 tokens each;
- zerolayerd + zerolayer-http in front of it (two processes: the edge's CPU is part of what
  is measured);
- the same zerolayerd through the async SDK, no HTTP (the edge's baseline).

1. TTFT, sequential: the chat question, greedy, max_tokens --seq-tokens (32). The three
   sides take turns request by request, in an order that rotates every round, each request
   after --gap-ms (50) of quiet, so drift in the machine's speed is shared and no side always
   follows the same other one; p50/p99 per side. The HTTP sides use one stdlib client
   (bench/_harness.http_stream_chat: keep-alive, SSE read line by line; TTFT = just
   before the request is sent -> first non-empty content delta); the SDK side
   zl_stream_chat (same clock points).
2. Aggregate tok/s: --conc (16) concurrent streams of --conc-tokens (64) each, one distinct
   short prompt per stream, through the OpenAI Python SDK (AsyncOpenAI, stream_options
   include_usage for the token counts) against llama-server and against the edge; and the
   same 16 streams through AsyncClient straight to zerolayerd. Completion tokens / wall time
   of the batch, median over --rounds.
3. Edge overhead over the SDK: TTFT p50 ratio (edge / SDK) and tok/s ratio (edge / SDK).

Results: JSON under bench/results/ (gitignored) and a markdown table on stdout. Takes the
benchmark lock (/tmp/zl-bench.lock, as bench_dataplane.py) so benchmarks never overlap.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import http.client
import json
import os
import secrets
import shlex
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    LLAMA_BIN,
    LOCK_PATH,
    RESULTS,
    CpuWatch,
    NativeLlamaServer,
    ZeroLayerDaemon,
    _Proc,
    chat_body,
    default_model,
    free_port,
    git_head,
    http_stream_chat,
    log,
    machine_info,
    sh,
    stats,
    take_lock,
    zl_stream_chat,
)

LLAMA_SERVER = LLAMA_BIN / "llama-server"
MODEL_NAME = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"
TOPICS = ["the sea", "volcanoes", "the moon", "bees", "rivers", "trains", "chess", "coffee",
          "mountains", "owls", "rain", "bridges", "the desert", "music", "autumn", "clocks"]
# Greedy on every side: temperature 0; llama.cpp's other samplers neutral (the edge accepts
# these llama.cpp fields at their neutral values, so one request body fits both servers).
GREEDY_EXTRA = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}


def conc_prompt(i: int) -> str:
    return f"Write a short poem about {TOPICS[i % len(TOPICS)]}."


class EdgeServer(_Proc):
    """`python -m zerolayer.daemon.programs.http_edge.app` (zerolayer-http) in front of a daemon."""
    name = "zerolayer-http"

    def __init__(self, python: str, daemon: ZeroLayerDaemon, work: Path, log_path: Path):
        self.token = "zl-bench-" + secrets.token_urlsafe(24)
        keys, tokens = work / "edge-keys", work / "edge-tokens"
        keys.write_text(f"{daemon.key_id} {daemon.secret.hex()}\n")
        tokens.write_text(f"{daemon.key_id} {self.token}\n")
        for p in (keys, tokens):
            os.chmod(p, 0o600)
        self.port = free_port()
        cmd = [python, "-m", "zerolayer.daemon.programs.http_edge.app",
               "--daemon", f"{daemon.addr[0]}:{daemon.addr[1]}", "--keys", str(keys),
               "--tokens", str(tokens), "--listen", f"127.0.0.1:{self.port}",
               "--model-name", MODEL_NAME, "--log-level", "warning"]
        super().__init__(cmd, log_path)

    def wait_ready(self, timeout: float = 60) -> None:
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5):
                    self.ready_s = time.perf_counter() - self.t_spawn
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout} s")


class AuthConnection(http.client.HTTPConnection):
    """http_stream_chat's connection, plus the edge's bearer token on every request."""
    extra_headers: dict[str, str] = {}

    def request(self, method, url, body=None, headers=None, **kw):  # type: ignore[override]
        super().request(method, url, body, {**(headers or {}), **self.extra_headers}, **kw)


class Bench:
    def __init__(self, a: argparse.Namespace):
        self.a = a

    # -- sequential TTFT ---------------------------------------------------------------------

    def http_side(self, port: int, token: str | None):
        body = chat_body(QUESTION, self.a.seq_tokens, extra={"model": MODEL_NAME})

        def one() -> dict:
            # llama-server closes the connection after a streamed response (see
            # bench_dataplane.py), so every request on either HTTP side gets a fresh one,
            # connected before the clock starts: no TCP handshake in anyone's TTFT.
            conn = AuthConnection("127.0.0.1", port, timeout=120)
            conn.extra_headers = {"Authorization": f"Bearer {token}"} if token else {}
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                return http_stream_chat(conn, body)
            finally:
                conn.close()
        return one

    def sdk_side(self):
        return lambda: zl_stream_chat(self.client, QUESTION, self.a.seq_tokens)

    def seq(self) -> dict:
        sides = {"llama": self.http_side(self.llama.port, None),
                 "edge": self.http_side(self.edge.port, self.edge.token),
                 "sdk": self.sdk_side()}
        for fn in sides.values():                # warm-up: connections, caches, JIT
            for _ in range(self.a.warmup):
                fn()
        out: dict[str, list[dict]] = {k: [] for k in sides}
        names = list(sides)
        for i in range(self.a.seq):
            # The order rotates, so each side follows each other side equally often (a server
            # may still be tidying up after its answer), and each request starts after a
            # short quiet gap.
            for name in names[i % 3:] + names[:i % 3]:
                time.sleep(self.a.gap_ms / 1e3)
                out[name].append(sides[name]())
        return out

    # -- concurrency ---------------------------------------------------------------------------

    async def conc_openai(self, port: int, token: str) -> dict:
        import openai
        c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token,
                               max_retries=0, timeout=600)

        async def one(i: int) -> dict:
            t0 = time.perf_counter()
            ttft = None
            toks = 0
            stream = await c.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": conc_prompt(i)}],
                max_tokens=self.a.conc_tokens, temperature=0.0, top_p=1.0, stream=True,
                stream_options={"include_usage": True}, extra_body=GREEDY_EXTRA)
            async for ch in stream:
                if ch.choices and ch.choices[0].delta.content and ttft is None:
                    ttft = time.perf_counter() - t0
                if ch.usage is not None:
                    toks = ch.usage.completion_tokens
            return {"ttft_s": ttft, "completion_tokens": toks}

        try:
            return await self._timed(one)
        finally:
            await c.close()

    async def conc_sdk(self) -> dict:
        from zerolayer.client import AsyncClient, ChatMessage
        c = AsyncClient(self.zl.addr, self.zl.key_id, self.zl.secret, timeout=120)

        async def one(i: int) -> dict:
            t0 = time.perf_counter()
            ttft = None
            s = await c.stream(messages=[ChatMessage("user", conc_prompt(i))],
                               max_tokens=self.a.conc_tokens, temperature=0.0)
            async with s:
                async for chunk in s:
                    if chunk and ttft is None:
                        ttft = time.perf_counter() - t0
            assert s.result is not None
            return {"ttft_s": ttft, "completion_tokens": s.result.usage.completion_tokens}

        try:
            return await self._timed(one)
        finally:
            await c.aclose()

    async def _timed(self, one) -> dict:
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one(i) for i in range(self.a.conc)), return_exceptions=True)
        wall = time.perf_counter() - t0
        ok = [r for r in res if isinstance(r, dict)]
        errors = [repr(r) for r in res if not isinstance(r, dict)]
        toks = sum(r["completion_tokens"] for r in ok)
        return {"wall_s": wall, "completion_tokens": toks, "tok_s": toks / wall,
                "errors": errors, "ttft_s": [r["ttft_s"] for r in ok]}

    def conc(self) -> dict:
        sides = {"llama": lambda: self.conc_openai(self.llama.port, "none"),
                 "edge": lambda: self.conc_openai(self.edge.port, self.edge.token),
                 "sdk": self.conc_sdk}
        for fn in sides.values():                 # one discarded round each
            asyncio.run(fn())
        out: dict[str, list[dict]] = {k: [] for k in sides}
        for _ in range(self.a.rounds):
            for name, fn in sides.items():
                r = asyncio.run(fn())
                out[name].append(r)
                log(f"  conc {name}: {r['completion_tokens']} tok in {r['wall_s']:.2f} s = "
                    f"{r['tok_s']:.1f} tok/s, errors {len(r['errors'])}")
        return out

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> dict:
        a = self.a
        RESULTS.mkdir(parents=True, exist_ok=True)
        out_path = Path(a.out) if a.out else RESULTS / f"http-{time.strftime('%Y%m%d-%H%M%S')}.json"
        lock, waited = take_lock(a.lock_wait, shlex.join(sys.argv))
        started = _dt.datetime.now().astimezone()
        r: dict = {"bench": "http_edge", "date": started.isoformat(timespec="seconds"),
                   "command": shlex.join([sys.executable, *sys.argv]), "args": vars(a),
                   "machine": machine_info(), "lock_waited_s": waited,
                   "zerolayer_git": git_head(),
                   "llama_server_version": sh(f"{LLAMA_SERVER} --version 2>&1 | tail -n 2")}
        model = a.model or default_model()
        r["model"] = model
        tmp = Path(tempfile.mkdtemp(prefix="zl-bench-http-"))
        self.llama = self.zl = self.edge = None
        try:
            log(f"starting llama-server -np {a.parallel}")
            self.llama = NativeLlamaServer(str(LLAMA_SERVER), model, a.threads, a.parallel,
                                           free_port(), tmp / "llama.log")
            self.llama.wait_ready()
            log("starting zerolayerd")
            self.zl = ZeroLayerDaemon(sys.executable, model, a.threads, 2048, tmp,
                                      tmp / "zerolayerd.log", shlex.split(a.zl_extra))
            self.zl.wait_ready()
            log("starting zerolayer-http")
            self.edge = EdgeServer(sys.executable, self.zl, tmp, tmp / "edge.log")
            self.edge.wait_ready()
            r["servers"] = {s.name: {"cmd": shlex.join(s.cmd), "ready_s": s.ready_s}
                            for s in (self.llama, self.zl, self.edge)}
            from zerolayer.client import Client
            self.client = Client(self.zl.addr, self.zl.key_id, self.zl.secret, timeout=60)
            watch = CpuWatch({"llama": self.llama.pid, "zl": self.zl.pid, "edge": self.edge.pid})
            log(f"sequential TTFT: {a.seq} rounds of llama/edge/sdk, max_tokens {a.seq_tokens}")
            c0 = watch.snap()
            r["seq"] = self.seq()
            r["seq_cpu_share"] = watch.delta(c0, watch.snap())
            log(f"concurrency: {a.conc} streams x {a.conc_tokens} tokens, {a.rounds} round(s)")
            c0 = watch.snap()
            r["conc"] = self.conc()
            r["conc_cpu_share"] = watch.delta(c0, watch.snap())
        finally:
            for s in (self.edge, self.zl, self.llama):
                if s is not None:
                    s.stop()
                    r.setdefault("logs_tail", {})[s.name] = s.log_path.read_text(
                        errors="replace")[-1500:]
            lock.close()
        r["duration_s"] = (_dt.datetime.now().astimezone() - started).total_seconds()
        summarise(r)
        out_path.write_text(json.dumps(r, indent=1, default=str))
        r["json_path"] = str(out_path)
        return r


def summarise(r: dict) -> None:
    s: dict = {}
    for side in ("llama", "edge", "sdk"):
        seq = r["seq"][side]
        conc = r["conc"][side]
        rounds = [x["tok_s"] for x in conc]
        s[side] = {"ttft_s": stats([x["ttft_s"] for x in seq]),
                   "e2e_s": stats([x["e2e_s"] for x in seq]),
                   "texts": sorted({x["text"] for x in seq}),
                   "tok_s_rounds": rounds,
                   "tok_s_median": statistics.median(rounds) if rounds else None,
                   "conc_ttft_s": stats([t for x in conc for t in x["ttft_s"]]),
                   "conc_errors": sum(len(x["errors"]) for x in conc)}

    def ratio(x, y):
        return x / y if x is not None and y else None

    L, E, S = s["llama"], s["edge"], s["sdk"]
    p50 = {k: (v["ttft_s"] or {}).get("p50") for k, v in s.items()}
    r["summary"] = s
    r["ratios"] = {
        "edge_vs_llama_ttft_p50": ratio(p50["edge"], p50["llama"]),
        "sdk_vs_llama_ttft_p50": ratio(p50["sdk"], p50["llama"]),
        "edge_over_sdk_ttft_p50": ratio(p50["edge"], p50["sdk"]),
        "edge_minus_sdk_ttft_p50_s": (p50["edge"] - p50["sdk"]
                                      if p50["edge"] is not None and p50["sdk"] is not None
                                      else None),
        "edge_vs_llama_tok_s": ratio(E["tok_s_median"], L["tok_s_median"]),
        "sdk_vs_llama_tok_s": ratio(S["tok_s_median"], L["tok_s_median"]),
        "edge_over_sdk_tok_s": ratio(E["tok_s_median"], S["tok_s_median"]),
    }


def render(r: dict) -> str:
    s, R, a = r["summary"], r["ratios"], r["args"]

    def ms(st: dict | None, k: str) -> str:
        return "n/a" if not st else f"{st[k] * 1e3:.1f}"

    def x(v: float | None, fmt: str = ".3f") -> str:
        return "n/a" if v is None else format(v, fmt)

    L, E, S = s["llama"], s["edge"], s["sdk"]
    lines = [
        f"### HTTP edge: zerolayer-http vs llama-server vs the SDK ({r['date']})", "",
        f"Machine: {r['machine'].get('cpu_model')}, {r['machine'].get('cpus')} CPUs; model "
        f"`{Path(r['model']).name}`, {a['threads']} threads each; llama-server "
        f"-np {a['parallel']}; zerolayer {r['zerolayer_git']}.", "",
        "| metric | zerolayer-http | llama-server | direct SDK | edge/llama | edge/SDK |",
        "|---|---|---|---|---|---|",
        f"| chat TTFT p50, ms ({a['seq']} seq., max_tokens {a['seq_tokens']}) | "
        f"{ms(E['ttft_s'], 'p50')} | {ms(L['ttft_s'], 'p50')} | {ms(S['ttft_s'], 'p50')} | "
        f"{x(R['edge_vs_llama_ttft_p50'])} | {x(R['edge_over_sdk_ttft_p50'])} |",
        f"| chat TTFT p99, ms | {ms(E['ttft_s'], 'p99')} | {ms(L['ttft_s'], 'p99')} | "
        f"{ms(S['ttft_s'], 'p99')} | | |",
        f"| end-to-end p50, ms | {ms(E['e2e_s'], 'p50')} | {ms(L['e2e_s'], 'p50')} | "
        f"{ms(S['e2e_s'], 'p50')} | | |",
        f"| aggregate tok/s, {a['conc']} streams x {a['conc_tokens']} tok (median of "
        f"{a['rounds']}) | {x(E['tok_s_median'], '.1f')} | {x(L['tok_s_median'], '.1f')} | "
        f"{x(S['tok_s_median'], '.1f')} | {x(R['edge_vs_llama_tok_s'], '.2f')} | "
        f"{x(R['edge_over_sdk_tok_s'], '.2f')} |",
        f"| TTFT p50 under {a['conc']} streams, ms | {ms(E['conc_ttft_s'], 'p50')} | "
        f"{ms(L['conc_ttft_s'], 'p50')} | {ms(S['conc_ttft_s'], 'p50')} | | |",
        "",
        f"- Edge overhead over the SDK: TTFT p50 +{x((R['edge_minus_sdk_ttft_p50_s'] or 0) * 1e3, '.2f')}"
        f" ms (x{x(R['edge_over_sdk_ttft_p50'])}); tok/s x{x(R['edge_over_sdk_tok_s'])}.",
        f"- Errors in the concurrent rounds: edge {E['conc_errors']}, llama {L['conc_errors']}, "
        f"SDK {S['conc_errors']}.",
        f"- Greedy answers (sequential): edge {E['texts']!r}; llama {L['texts']!r}; "
        f"SDK {S['texts']!r}.",
        "- HTTP sides in the sequential run: a stdlib client reading SSE lines, a fresh "
        "connection per request (connected before the clock starts); "
        "concurrent runs: AsyncOpenAI (openai SDK), usage from stream_options.include_usage.",
        f"- Run took {r['duration_s']:.0f} s. Command: `{r['command']}`",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="GGUF (default: the bundled SmolLM2-135M Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=16, help="llama-server slots")
    ap.add_argument("--seq", type=int, default=50, help="sequential requests per side")
    ap.add_argument("--seq-tokens", type=int, default=32)
    ap.add_argument("--gap-ms", type=float, default=50.0,
                    help="quiet time before each sequential request")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--conc-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--zl-extra", default="", help="more zerolayerd flags")
    ap.add_argument("--lock-wait", type=float, default=3600,
                    help=f"wait this long for {LOCK_PATH}")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny counts, not for publishing")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.quick:
        a.seq, a.warmup, a.conc, a.conc_tokens, a.rounds = 3, 1, 2, 8, 1
    r = Bench(a).run()
    print(render(r))
    print(f"\nJSON: {r['json_path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
