#!/usr/bin/env python
"""zerolayer-http (the HTTP/SSE edge) vs llama.cpp's `llama-server` vs our direct SDK: chat
TTFT in turns, aggregate tok/s of concurrent streams; see bench/README.md ("bench_http.py").
"""
from __future__ import annotations

import argparse
import asyncio
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
import _harness as H  # noqa: E402

LLAMA_SERVER = H.LLAMA_BIN / "llama-server"
MODEL_NAME = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"
TOPICS = ["the sea", "volcanoes", "the moon", "bees", "rivers", "trains", "chess", "coffee",
          "mountains", "owls", "rain", "bridges", "the desert", "music", "autumn", "clocks"]
# Greedy on every side: temperature 0; llama.cpp's other samplers neutral (the edge accepts
# these llama.cpp fields at their neutral values, so one request body fits both servers).
GREEDY_EXTRA = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}
SIDES = ("edge", "llama", "sdk")   # the table's column order


def conc_prompt(i: int) -> str:
    return f"Write a short poem about {TOPICS[i % len(TOPICS)]}."


class EdgeServer(H._Proc):
    """`python -m zerolayer.daemon.programs.http_edge.app` (zerolayer-http) in front of a daemon."""
    name = "zerolayer-http"

    def __init__(self, daemon: H.ZeroLayerDaemon, work: Path, log_path: Path):
        self.token = "zl-bench-" + secrets.token_urlsafe(24)
        keys, tokens = work / "edge-keys", work / "edge-tokens"
        keys.write_text(f"{daemon.key_id} {daemon.secret.hex()}\n")
        tokens.write_text(f"{daemon.key_id} {self.token}\n")
        for p in (keys, tokens):
            os.chmod(p, 0o600)
        self.port = H.free_port()
        super().__init__([sys.executable, "-m", "zerolayer.daemon.programs.http_edge.app",
                          "--daemon", f"{daemon.addr[0]}:{daemon.addr[1]}", "--keys", str(keys),
                          "--tokens", str(tokens), "--listen", f"127.0.0.1:{self.port}",
                          "--model-name", MODEL_NAME, "--log-level", "warning"], log_path)

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


def http_side(a, port: int, token: str | None):
    body = H.chat_body(QUESTION, a.seq_tokens, extra={"model": MODEL_NAME})
    auth = {"Authorization": f"Bearer {token}"} if token else {}

    def one() -> dict:
        # llama-server closes the connection after a streamed response, so every request
        # on either HTTP side gets a fresh one, connected before the clock starts.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            return H.http_stream_chat(conn, body, auth)
        finally:
            conn.close()
    return one


def seq(a, llama, edge, zl) -> dict:
    H.log(f"sequential TTFT: {a.seq} rounds of llama/edge/sdk, max_tokens {a.seq_tokens}")
    client = zl.client()
    sides = {"llama": http_side(a, llama.port, None), "edge": http_side(a, edge.port, edge.token),
             "sdk": lambda: H.zl_stream_chat(client, QUESTION, a.seq_tokens)}
    for fn in sides.values():                # warm-up: connections, caches, JIT
        for _ in range(a.warmup):
            fn()
    out: dict[str, list[dict]] = {k: [] for k in sides}
    names = list(sides)
    for i in range(a.seq):
        # The order rotates, so each side follows each other side equally often (a server
        # may still be tidying up after its answer).
        for name in names[i % 3:] + names[:i % 3]:
            time.sleep(a.gap_ms / 1e3)
            out[name].append(sides[name]())
    return out


async def conc_openai(a, port: int, token: str) -> dict:
    import openai
    c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token,
                           max_retries=0, timeout=600)

    async def one(i: int) -> dict:
        t0, ttft, toks = time.perf_counter(), None, 0
        stream = await c.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": conc_prompt(i)}],
            max_tokens=a.conc_tokens, temperature=0.0, top_p=1.0, stream=True,
            stream_options={"include_usage": True}, extra_body=GREEDY_EXTRA)
        async for ch in stream:
            if ch.choices and ch.choices[0].delta.content and ttft is None:
                ttft = time.perf_counter() - t0
            if ch.usage is not None:
                toks = ch.usage.completion_tokens
        return {"ttft_s": ttft, "completion_tokens": toks}

    try:
        return await timed_batch(a.conc, one)
    finally:
        await c.close()


async def conc_sdk(a, zl) -> dict:
    from zerolayer.client import AsyncClient, ChatMessage
    c = AsyncClient(zl.addr, zl.key_id, zl.secret, timeout=120)

    async def one(i: int) -> dict:
        t0, ttft = time.perf_counter(), None
        s = await c.stream(messages=[ChatMessage("user", conc_prompt(i))],
                           max_tokens=a.conc_tokens, temperature=0.0)
        async with s:
            async for chunk in s:
                if chunk and ttft is None:
                    ttft = time.perf_counter() - t0
        assert s.result is not None
        return {"ttft_s": ttft, "completion_tokens": s.result.usage.completion_tokens}

    try:
        return await timed_batch(a.conc, one)
    finally:
        await c.aclose()


async def timed_batch(n: int, one) -> dict:
    t0 = time.perf_counter()
    res = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    wall = time.perf_counter() - t0
    ok = [r for r in res if isinstance(r, dict)]
    toks = sum(r["completion_tokens"] for r in ok)
    return {"wall_s": wall, "completion_tokens": toks, "tok_s": toks / wall,
            "errors": [repr(r) for r in res if not isinstance(r, dict)],
            "ttft_s": [r["ttft_s"] for r in ok]}


def conc(a, llama, edge, zl) -> dict:
    H.log(f"concurrency: {a.conc} streams x {a.conc_tokens} tokens, {a.rounds} round(s)")
    sides = {"llama": lambda: conc_openai(a, llama.port, "none"),
             "edge": lambda: conc_openai(a, edge.port, edge.token),
             "sdk": lambda: conc_sdk(a, zl)}
    for fn in sides.values():                 # one discarded round each
        asyncio.run(fn())
    out: dict[str, list[dict]] = {k: [] for k in sides}
    for _ in range(a.rounds):
        for name, fn in sides.items():
            r = asyncio.run(fn())
            out[name].append(r)
            H.log(f"  conc {name}: {r['completion_tokens']} tok in {r['wall_s']:.2f} s = "
                  f"{r['tok_s']:.1f} tok/s, errors {len(r['errors'])}")
    return out


def run(a: argparse.Namespace) -> dict:
    out_path = H.results_path(a.out, "http")
    with H.bench_lock(shlex.join(sys.argv), a.lock_wait) as waited:
        t0 = time.monotonic()
        r: dict = {"bench": "http_edge", **H.run_meta(), "args": vars(a),
                   "machine": H.machine_info(), "lock_waited_s": waited,
                   "llama_server_version": H.sh(f"{LLAMA_SERVER} --version 2>&1 | tail -n 2"),
                   "model": a.model or H.default_model()}
        tmp = Path(tempfile.mkdtemp(prefix="zl-bench-http-"))
        servers: list[H._Proc] = []
        try:
            H.log(f"starting llama-server -np {a.parallel}, zerolayerd, zerolayer-http")
            # with --no-repack where its default repacking crashes (the AMX Xeon class)
            llama, r["llama_extra"] = H.llama_server_that_serves(
                lambda extra: H.NativeLlamaServer(str(LLAMA_SERVER), r["model"], a.threads,
                                                  a.parallel, H.free_port(), tmp / "llama.log",
                                                  extra=extra), lambda srv: srv.wait_ready())
            servers.append(llama)
            zl = H.ZeroLayerDaemon(sys.executable, r["model"], a.threads, 2048, tmp,
                                   tmp / "zerolayerd.log", shlex.split(a.zl_extra))
            servers.append(zl)
            zl.wait_ready()
            edge = EdgeServer(zl, tmp, tmp / "edge.log")
            servers.append(edge)
            edge.wait_ready()
            r["servers"] = {s.name: {"cmd": shlex.join(s.cmd), "ready_s": s.ready_s}
                            for s in servers}
            watch = H.CpuWatch({"llama": llama.pid, "zl": zl.pid, "edge": edge.pid})
            for part, fn in (("seq", seq), ("conc", conc)):
                c0 = watch.snap()
                r[part] = fn(a, llama, edge, zl)
                r[f"{part}_cpu_share"] = watch.delta(c0, watch.snap())
        finally:
            for s in reversed(servers):
                s.stop()
                r.setdefault("logs_tail", {})[s.name] = s.log_path.read_text(
                    errors="replace")[-1500:]
    r["duration_s"] = time.monotonic() - t0
    summarise(r)
    out_path.write_text(json.dumps(r, indent=1, default=str))
    r["json_path"] = str(out_path)
    return r


def summarise(r: dict) -> None:
    s: dict = {}
    for side in SIDES:
        sq, cc = r["seq"][side], r["conc"][side]
        rounds = [x["tok_s"] for x in cc]
        s[side] = {"ttft_s": H.stats([x["ttft_s"] for x in sq]),
                   "e2e_s": H.stats([x["e2e_s"] for x in sq]),
                   "texts": sorted({x["text"] for x in sq}),
                   "tok_s_rounds": rounds,
                   "tok_s_median": statistics.median(rounds) if rounds else None,
                   "conc_ttft_s": H.stats([t for x in cc for t in x["ttft_s"]]),
                   "conc_errors": sum(len(x["errors"]) for x in cc)}
    p50 = {k: (v["ttft_s"] or {}).get("p50") for k, v in s.items()}
    tps = {k: v["tok_s_median"] for k, v in s.items()}
    r["summary"] = s
    r["ratios"] = {f"{x}_{rel}_{y}_{m}": v[x] / v[y] if v[x] is not None and v[y] else None
                   for m, v in (("ttft_p50", p50), ("tok_s", tps))
                   for x, rel, y in (("edge", "vs", "llama"), ("sdk", "vs", "llama"),
                                     ("edge", "over", "sdk"))}
    r["ratios"]["edge_minus_sdk_ttft_p50_s"] = (p50["edge"] - p50["sdk"]
                                                if None not in (p50["edge"], p50["sdk"]) else None)


def render(r: dict) -> str:
    s, R, a, f = r["summary"], r["ratios"], r["args"], H.fmt

    def ms(key: str, q: str) -> list[str]:
        return [f(s[k][key] and s[k][key][q] * 1e3) for k in SIDES]

    rows = [[f"chat TTFT p50, ms ({a['seq']} seq., max_tokens {a['seq_tokens']})",
             *ms("ttft_s", "p50"), f(R["edge_vs_llama_ttft_p50"], ".3f"),
             f(R["edge_over_sdk_ttft_p50"], ".3f")],
            ["chat TTFT p99, ms", *ms("ttft_s", "p99"), "", ""],
            ["end-to-end p50, ms", *ms("e2e_s", "p50"), "", ""],
            [f"aggregate tok/s, {a['conc']} streams x {a['conc_tokens']} tok "
             f"(median of {a['rounds']})", *(f(s[k]["tok_s_median"]) for k in SIDES),
             f(R["edge_vs_llama_tok_s"], ".2f"), f(R["edge_over_sdk_tok_s"], ".2f")],
            [f"TTFT p50 under {a['conc']} streams, ms", *ms("conc_ttft_s", "p50"), "", ""]]
    E, L, S = (s[k] for k in SIDES)
    return "\n".join([
        f"### HTTP edge: zerolayer-http vs llama-server vs the SDK ({r['date']})", "",
        f"Machine: {r['machine'].get('cpu_model')}, {r['machine'].get('cpus')} CPUs; model "
        f"`{Path(r['model']).name}`, {a['threads']} threads each; llama-server "
        f"{shlex.join(['-np', str(a['parallel']), *r['llama_extra']])}; zerolayer {r['git']}.",
        "", H.md_table(["metric", "zerolayer-http", "llama-server", "direct SDK", "edge/llama",
                        "edge/SDK"], rows), "",
        f"- Edge overhead over the SDK: TTFT p50 "
        f"+{f((R['edge_minus_sdk_ttft_p50_s'] or 0) * 1e3, '.2f')} ms "
        f"(x{f(R['edge_over_sdk_ttft_p50'], '.3f')}); tok/s x{f(R['edge_over_sdk_tok_s'], '.3f')}.",
        f"- Errors in the concurrent rounds: edge {E['conc_errors']}, llama {L['conc_errors']}, "
        f"SDK {S['conc_errors']}.",
        f"- Greedy answers (sequential): edge {E['texts']!r}; llama {L['texts']!r}; "
        f"SDK {S['texts']!r}.",
        f"- Run took {r['duration_s']:.0f} s. Command: `{r['command']}`"])


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
    ap.add_argument("--lock-wait", type=float, default=3600, help=f"wait this long for {H.LOCK_PATH}")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny counts, not for publishing")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.quick:
        a.seq, a.warmup, a.conc, a.conc_tokens, a.rounds = 3, 1, 2, 8, 1
    r = run(a)
    print(render(r))
    print(f"\nJSON: {r['json_path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
