#!/usr/bin/env python
"""zerolayerd vs llama.cpp's native `llama-server` on the same GGUF, 2 threads each: PING, TTFT
and CANCEL idle and while 8 streams decode, aggregate tok/s of 8 and 16 streams. See bench/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import http.client
import json
import os
import platform
import select
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    HEADERS,
    LLAMA_BIN,
    LOCK_PATH,
    REPO,
    CpuWatch,
    NativeLlamaServer,
    ZeroLayerDaemon,
    chat_body,
    command_line,
    default_model,
    free_port,
    git_head,
    http_get_timed,
    http_stream_chat,
    llama_server_that_serves,
    log,
    machine_info,
    results_path,
    sh,
    sse_events,
    stats,
    take_lock,
    top_processes,
    zl_stream_chat,
)

QUESTION = "What is the capital of France?"
TOPICS = ["the sea", "volcanoes", "the moon", "bees", "rivers", "trains", "chess", "coffee",
          "mountains", "owls", "rain", "bridges", "the desert", "music", "autumn", "clocks",
          "lighthouses", "glaciers", "a lost key", "the first snow"]
STREAM_OPTS = {"stream_options": {"include_usage": True}}
QUIET_LIMIT = 0.10        # a block whose foreign CPU share is over this is counted as noisy
PROBE_GAP_S = 0.05        # between TTFT / cancel probes under load
LOAD_TIME_LIMIT_S = 600.0  # the load generator stops itself after this long


def story(i: int, tag: str = "") -> str:
    return f"{tag}Write a long story about {TOPICS[i % len(TOPICS)]}."


def scrape(port: int) -> dict[str, float]:
    """The daemon's Prometheus text: {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


# ================================================================ the two sides
# Each side: name, pids, loadgen_spec, ping(), probe(), and chat(content, max_tokens, conn),
# a whole stream; conn: what prep() made untimed, before the tok/s blocks' common start line.
STREAM_KEYS = ("ttft_s", "e2e_s", "tokens", "token_source", "finish_reason", "usage", "timings")


class ZlSide:
    def __init__(self, daemon: ZeroLayerDaemon, name: str = "zl"):
        self.name, self.pids = name, {name: daemon.pid}
        self.client = daemon.client(timeout=60)
        self.loadgen_spec = {"side": "zl", "port": daemon.port, "key_id": daemon.key_id,
                             "secret": daemon.secret.hex()}

    def ping(self) -> dict:
        t0 = time.perf_counter()
        inner = self.client.ping()
        return {"rtt_s": time.perf_counter() - t0, "sdk_rtt_s": inner}

    def prep(self):
        return None

    def chat(self, content: str, max_tokens: int, _conn=None) -> dict:
        r = zl_stream_chat(self.client, content, max_tokens)
        r["tokens"] = r["completion_tokens"] = r["usage"]["completion_tokens"]
        r["token_source"] = "usage"
        return r

    def probe(self, content: str, max_tokens: int, cancel: bool) -> dict:
        from zerolayer.protocol.wire import ChatMessage
        out: dict = {"ttft_s": None}
        t0 = time.perf_counter()
        s = self.client.stream(messages=[ChatMessage("user", content)], max_tokens=max_tokens,
                               temperature=0.0)
        try:
            for chunk in s:
                if chunk:
                    out["ttft_s"] = time.perf_counter() - t0
                    break
            if cancel:
                t1 = time.perf_counter()
                res = s.cancel()
                out["cancel_s"] = time.perf_counter() - t1
                out["finish_reason"] = res.finish_reason if res else None
                out["completion_tokens"] = res.usage.completion_tokens if res else None
        finally:
            s.close()       # an unfinished stream: one best-effort CANCEL, no wait
        return out


def hard_close(conn: http.client.HTTPConnection) -> None:
    """Close the TCP connection now (FIN), as a client that gives up on a stream does."""
    try:
        if conn.sock is not None:
            conn.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()


class LlamaSide:
    name = "llama"

    def __init__(self, server: NativeLlamaServer):
        self.port, self.pids = server.port, {"llama": server.pid}
        self.loadgen_spec = {"side": "llama", "port": server.port}
        self.ping_conn, self.slots_conn = self._conn(10), self._conn(30)
        self.reconnects = 0
        self.probe_seed = 7_000_000

    def _conn(self, timeout: float) -> http.client.HTTPConnection:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.connect()
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    def close(self) -> None:
        for c in (self.ping_conn, self.slots_conn):
            c.close()

    def _keepalive(self, conn: http.client.HTTPConnection, fn):
        """(fn(conn), retries) on a keep-alive connection. The server closes one after 100
        requests or 5 s idle (cpp-httplib's defaults): the reconnect is made before fn starts
        its clock, and a request that finds the connection closed is redone once."""
        for attempt in range(2):
            if conn.sock is None:
                conn.connect()
            try:
                return fn(conn), attempt
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self.reconnects += 1
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def ping(self) -> dict:
        rtt, retried = self._keepalive(self.ping_conn, lambda c: http_get_timed(c, "/health"))
        return {"rtt_s": rtt, "retried": retried}

    def prep(self):
        return self._conn(600)

    def chat(self, content: str, max_tokens: int, conn=None) -> dict:
        # llama-server closes the connection after a streamed response, so every stream gets
        # a fresh one, connected before the clock starts (no TCP handshake in the TTFT)
        conn = conn or self._conn(300)
        try:
            r = http_stream_chat(conn, chat_body(content, max_tokens, extra=STREAM_OPTS))
        finally:
            conn.close()
        r["completion_tokens"] = r["tokens"]
        return r

    def _slots(self) -> list[dict]:
        def get(c):
            c.request("GET", "/slots")
            r = c.getresponse()
            return r.status, r.read()
        (status, data), _ = self._keepalive(self.slots_conn, get)
        if status != 200:
            raise RuntimeError(f"/slots: HTTP {status}: {data[:200]!r}")
        return json.loads(data)

    def probe(self, content: str, max_tokens: int, cancel: bool) -> dict:
        conn = self._conn(60)
        # /slots shows no prompt text outside its debug mode, but it shows each slot's sampling
        # parameters: a unique seed (inert under greedy decoding) tells our slot apart
        self.probe_seed += 1
        seed = self.probe_seed
        out = http_stream_chat(conn, chat_body(content, max_tokens,
                                               extra={**STREAM_OPTS, "seed": seed}), first_only=True)
        res = {"ttft_s": out["ttft_s"]}
        if not cancel:
            hard_close(conn)
            return res
        slot = next((s for s in self._slots()
                     if s.get("is_processing") and (s.get("params") or {}).get("seed") == seed), None)
        t1 = time.perf_counter()
        hard_close(conn)
        res.update(close_s=time.perf_counter() - t1, slot_free_s=None,
                   slot="not found" if slot is None else slot["id"])
        if slot is None:
            return res
        polls = 0
        while time.perf_counter() - t1 < 10 and polls < 5000:
            polls += 1
            cur = next((s for s in self._slots() if s["id"] == slot["id"]), None)
            if cur is None or not cur.get("is_processing") or cur.get("id_task") != slot.get("id_task"):
                res["slot_free_s"] = time.perf_counter() - t1
                break
        res["slot_polls"] = polls
        return res


def start_zl(model: str, threads: int, d: Path, extra: list[str], env: dict | None = None):
    """A zerolayerd (keys and log in the new folder d), once it serves."""
    d.mkdir()
    zl = ZeroLayerDaemon(sys.executable, model, threads, 2048, d, d / "zerolayerd.log", extra, env=env)
    try:
        zl.wait_ready()
    except BaseException:
        zl.stop()
        raise
    log(f"  {d.name} ready in {zl.ready_s:.1f} s (pid {zl.pid})")
    return zl


def log_tail(server, chars: int = 2000) -> str | None:
    return server.log_path.read_text(errors="replace")[-chars:] if server else None


# ================================================================ the load generator process


def loadgen_main(spec: dict) -> int:
    """Keeps spec['streams'] streams decoding until 'stop' on stdin (or EOF, or time_limit).
    Prints 'ready N' once every stream produced a first chunk, then a JSON summary (chunks_s:
    the text chunks all streams received from ready to stop, per second; about one a token)."""
    n, mt, limit = spec["streams"], spec["max_tokens"], spec["time_limit"]
    stop = threading.Event()
    started = [threading.Event() for _ in range(n)]
    lock = threading.Lock()
    tot = {"tokens": 0, "finished": 0, "stopped": 0, "errors": [], "chunks": 0}

    def count(**d) -> None:
        with lock:
            for k, v in d.items():
                tot[k] += v

    if spec["side"] == "zl":
        from zerolayer.client import Client
        from zerolayer.protocol.wire import ChatMessage
        client = Client(("127.0.0.1", spec["port"]), spec["key_id"], bytes.fromhex(spec["secret"]),
                        timeout=60)

    def one_zl(i: int, k: int) -> None:
        with client.stream(messages=[ChatMessage("user", story(i + k * n, f"[load {i}.{k}] "))],
                           max_tokens=mt, temperature=0.0) as s:
            for chunk in s:
                if chunk:
                    started[i].set()
                    count(chunks=1)
                if stop.is_set():
                    s.cancel()
                    count(stopped=1)
                    break
        if s.result is not None:
            count(tokens=s.result.usage.completion_tokens,
                  finished=s.result.finish_reason != "cancelled")

    def one_llama(i: int, k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", spec["port"], timeout=120)
        body = chat_body(story(i + k * n, f"[load {i}.{k}] "), mt, extra=STREAM_OPTS)
        conn.request("POST", "/v1/chat/completions", body=body, headers=HEADERS)
        done = True
        for ev in sse_events(conn.getresponse()):
            if ev.get("usage"):
                count(tokens=ev["usage"].get("completion_tokens", 0))
            if any((c.get("delta") or {}).get("content") for c in ev.get("choices", ())):
                started[i].set()
                count(chunks=1)
            if stop.is_set():
                done = False
                count(stopped=1)
                break
        hard_close(conn)
        count(finished=done)

    one = one_zl if spec["side"] == "zl" else one_llama
    t_end = time.monotonic() + limit

    def worker(i: int) -> None:
        k = 0
        while not stop.is_set() and time.monotonic() < t_end and k < 10_000:
            try:
                one(i, k)
            except Exception as e:  # noqa: BLE001 - reported
                with lock:
                    tot["errors"].append(f"{i}.{k}: {e!r}"[:300])
                time.sleep(0.05)
            k += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + min(120, limit)
    for e in started:
        e.wait(max(0.0, deadline - time.monotonic()))
    with lock:
        chunks0 = tot["chunks"]
    t_ready = time.perf_counter()
    print(f"ready {sum(e.is_set() for e in started)}", flush=True)

    def watch_stdin():
        sys.stdin.readline()     # "stop", or EOF when the parent died
        stop.set()
    threading.Thread(target=watch_stdin, daemon=True).start()
    stop.wait(max(0.0, t_end - time.monotonic()))
    stop.set()
    for t in threads:
        t.join(60)
    tot["chunks_s"] = (tot["chunks"] - chunks0) / (time.perf_counter() - t_ready)
    tot["hung_threads"] = sum(t.is_alive() for t in threads)
    print(json.dumps(tot), flush=True)
    return 0


class Child:
    """`python SCRIPT MODE JSON` in a child process, answering on stdout line by line."""

    def __init__(self, script: str, mode: str, spec: dict):
        self.proc = subprocess.Popen([sys.executable, script, mode, json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid, self.t0 = self.proc.pid, time.perf_counter()

    def line(self, timeout: float) -> str:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise RuntimeError(f"{self.proc.args[2]} child silent for {timeout} s")
        return self.proc.stdout.readline().strip()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class LoadGen(Child):
    def __init__(self, side, streams: int, max_tokens: int, time_limit: float):
        super().__init__(__file__, "--loadgen", {**side.loadgen_spec, "streams": streams,
                                                 "max_tokens": max_tokens, "time_limit": time_limit})

    def wait_ready(self, timeout: float = 150) -> int:
        line = self.line(timeout)
        if not line.startswith("ready"):
            raise RuntimeError(f"load generator: {line!r}")
        self.ready_s = time.perf_counter() - self.t0
        return int(line.split()[1])

    def stop(self) -> dict:
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
            summary = json.loads(self.line(90) or "{}")
        except (OSError, RuntimeError, ValueError) as e:
            summary = {"error": repr(e)}
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
        summary["duration_s"] = time.perf_counter() - self.t0
        return summary


# ================================================================ the benchmark


class Bench:
    def __init__(self, a):
        self.a = a
        self.blocks: list[dict] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="zl-bench-dataplane-"))
        self.zl_side = self.bside = None

    def block(self, kind: str, side, fn, extra_pids: dict | None = None, **meta) -> dict:
        """fn()'s samples, kept with the CPU split of the machine while it ran."""
        # every server that is up, busy or idle
        w = CpuWatch({k: v for o in (self.zl_side, self.bside, side) if o for k, v in o.pids.items()}
                     | (extra_pids or {}))
        a = w.snap()
        t0 = time.perf_counter()
        samples = fn()
        wall = time.perf_counter() - t0
        cpu = {k: round(v, 4) for k, v in w.delta(a, w.snap()).items()}
        b = {"kind": kind, "side": side.name, "wall_s": round(wall, 3), "cpu_share": cpu,
             "samples": samples, **meta}
        self.blocks.append(b)
        log(f"  {kind:<11} {side.name:<5} {wall:6.1f} s; cpu: "
            + " ".join(f"{k} {v:.0%}" for k, v in cpu.items()))
        return b

    # -- measurements ---------------------------------------------------------------------------

    def idle(self, side, rnd: int) -> None:
        a = self.a
        self.block("ping_idle", side, lambda: [side.ping() for _ in range(a.pings_per_round)],
                   round=rnd)
        self.block("ttft_idle", side,
                   lambda: [side.chat(QUESTION, a.ttft_tokens) for _ in range(a.ttft_per_round)],
                   round=rnd)

    def concurrent(self, side, n: int, max_tokens: int, kind: str, rnd: int) -> dict:
        barrier = threading.Barrier(n + 1)
        results: list = [None] * n
        ends = [0.0] * n
        errors: list[str] = []

        def run(i):
            try:
                conn = side.prep()
                barrier.wait(120)
                r = side.chat(story(i, f"[{kind} r{rnd}] "), max_tokens, conn)
                results[i] = {"chunks": r["content_chunks"], **{k: r[k] for k in STREAM_KEYS if k in r}}
            except Exception as e:  # noqa: BLE001 - recorded
                errors.append(f"{i}: {e!r}"[:300])
            ends[i] = time.perf_counter()

        def go():
            threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            barrier.wait(120)
            t0 = time.perf_counter()
            for t in threads:
                t.join(900)
            wall = max(ends) - t0
            toks = sum(r["tokens"] for r in results if r)
            return {"streams": n, "max_tokens": max_tokens, "wall_s": wall, "tokens": toks,
                    "tok_s": toks / wall if wall > 0 else None, "errors": errors,
                    "token_sources": sorted({r["token_source"] for r in results if r}),
                    "per_stream": results}
        b = self.block(kind, side, go, round=rnd)
        s = b["samples"]
        log(f"    {side.name}: {s['tokens']} tokens / {s['wall_s']:.2f} s = {s['tok_s'] or 0:.1f} "
            f"tok/s (errors {len(s['errors'])})")
        return b

    def under_load(self, side, rnd: int) -> None:
        a = self.a
        lg = LoadGen(side, a.load_streams, a.load_tokens, LOAD_TIME_LIMIT_S)
        try:
            active = lg.wait_ready()
            log(f"  load: {active}/{a.load_streams} streams decoding after {lg.ready_s:.1f} s")

            def pings():
                out = []
                if a.pinger_runtime_us:   # this thread under SCHED_DEADLINE for the block
                    from zerolayer.daemon.sched_deadline import set_deadline
                    set_deadline(a.pinger_runtime_us, 1000)
                try:
                    for _ in range(a.pings_per_round):
                        out.append(side.ping())
                        time.sleep(a.ping_gap_ms / 1e3)
                finally:
                    if a.pinger_runtime_us:
                        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
                return out

            def probes(cancel: bool):
                out = []
                for k in range(a.cancel_per_round if cancel else a.ttft_per_round):
                    out.append(side.probe(story(k, f"(cancel probe r{rnd}.{k}) "), a.load_tokens, True)
                               if cancel else side.probe(QUESTION, a.ttft_tokens, False))
                    time.sleep(PROBE_GAP_S)
                return out

            for kind, fn in (("ping_load", pings), ("ttft_load", lambda: probes(False)),
                             ("cancel_load", lambda: probes(True))):
                self.block(kind, side, fn, {"loadgen": lg.pid}, round=rnd, load_active=active)
        finally:
            summary = lg.stop()
            self.blocks.append({"kind": "load_summary", "side": side.name, "round": rnd,
                                "samples": summary})
            log(f"  load summary: {summary}")

    def warm_zl(self, side) -> None:
        for _ in range(3):
            side.chat(QUESTION, self.a.ttft_tokens)
        self.concurrent(side, 16, 16, "warm", -1)
        self.blocks.pop()

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> dict:
        a = self.a
        out_path = results_path(a.out, "dataplane")
        if not a.only_ours and not (LLAMA_BIN / "llama-server").exists():
            raise SystemExit(f"{LLAMA_BIN}/llama-server missing: run bash bench/setup_llamacpp.sh")
        command = command_line()
        lock, lock_wait = take_lock(a.lock_wait, command)
        started = _dt.datetime.now().astimezone()
        r: dict = {"bench": "dataplane", "date": started.isoformat(timespec="seconds"),
                   "command": command, "args": vars(a),
                   "lock": {"path": LOCK_PATH, "waited_s": round(lock_wait, 1)},
                   "machine": machine_info(), "versions": versions()}
        r["machine"]["uptime_before"] = sh("uptime")
        log(f"uptime: {r['machine']['uptime_before']}")
        r["preflight"] = CpuWatch({}).wait_quiet(QUIET_LIMIT, a.max_wait, poll=10, window=3.0)
        r["preflight"]["top"] = top_processes(4)
        if not r["preflight"]["quiet"]:
            log(f"WARNING: other processes use {r['preflight']['foreign_share']:.0%} of the "
                "machine; measuring anyway (results noisy)")
        self.model = a.model or default_model()
        r["model"] = {"path": self.model, "bytes": os.path.getsize(self.model)}
        self.llama = LlamaPeer(a, self.model, self.tmp)
        self.zl = self.base = None
        try:
            log("starting zerolayerd")
            self.zl = start_zl(self.model, a.threads, self.tmp / "zl", shlex.split(a.zl_extra))
            self.zl_side = ZlSide(self.zl)
            r["servers"] = {"zl": shlex.join(self.zl.cmd)}
            self.warm_zl(self.zl_side)
            for rnd in range(a.rounds):
                self.round(rnd)
            if a.baseline_repo:
                self.against_baseline(r)
        finally:
            for d in (self.base, self.zl):
                if d is not None:
                    d.stop()
            r["server_logs_tail"] = {"zl": log_tail(self.zl), "llama": self.llama.log_tail,
                                     "baseline": log_tail(self.base)}
            lock.close()
            shutil.rmtree(self.tmp, ignore_errors=True)   # keys files and logs (tails kept above)
        r["servers"]["llama"] = sorted(set(self.llama.cmds))
        r["servers"]["llama_crashed"] = self.llama.crashes
        r["llama_keepalive_reconnects"] = self.llama.reconnects
        r["machine"]["uptime_after"] = sh("uptime")
        r["blocks"] = self.blocks
        finished = _dt.datetime.now().astimezone()
        r["finished"] = finished.isoformat(timespec="seconds")
        r["duration_s"] = round((finished - started).total_seconds(), 1)
        out_path.write_text(json.dumps(r, indent=1, default=str))   # the samples, come what may
        summarise(r, a)
        out_path.write_text(json.dumps(r, indent=1, default=str))
        r["json_path"] = str(out_path)
        return r

    def round(self, rnd: int) -> None:
        """Idle and the first concurrency, then under load and the second; llama-server goes
        first in the first half of even rounds and in the second half of odd ones. Its probes
        under load need --load-slots (a free slot beside the load), its tok/s blocks as many
        slots as streams: a server of another -np is started for those."""
        a = self.a
        for h, (probes, slots) in enumerate(((self.idle, a.conc[0]), (self.under_load, a.load_slots))):
            n = a.conc[h]
            log(f"round {rnd + 1}/{a.rounds}: {'under load' if h else 'idle'} + {n} streams")
            for who in (("llama", "zl") if (rnd + h) % 2 == 0 else ("zl", "llama")):
                if who == "zl":
                    probes(self.zl_side, rnd)
                    self.concurrent(self.zl_side, n, a.tokens, f"tok_s_{n}", rnd)
                    continue
                if a.only_ours:
                    continue
                with self.llama.serving(slots) as side:
                    probes(side, rnd)
                    if slots == n:
                        self.concurrent(side, n, a.tokens, f"tok_s_{n}", rnd)
                if slots != n:
                    with self.llama.serving(n) as side:
                        self.concurrent(side, n, a.tokens, f"tok_s_{n}", rnd)

    def against_baseline(self, r: dict) -> None:
        """tok/s of a zerolayerd from --baseline-repo against ours, interleaved."""
        a = self.a
        env, r["baseline"] = baseline_pkg(a.baseline_repo, self.tmp)
        log(f"baseline: zerolayerd from {r['baseline']['path']} ({r['baseline']['git']})")
        self.base = start_zl(self.model, a.threads, self.tmp / "baseline", shlex.split(a.zl_extra), env)
        r["servers"]["baseline"] = f"PYTHONPATH={env['PYTHONPATH']} " + shlex.join(self.base.cmd)
        bside = self.bside = ZlSide(self.base, "base")
        self.warm_zl(bside)
        for rnd in range(a.rounds):
            for n in a.conc:
                order = (bside, self.zl_side) if (rnd + (n == a.conc[1])) % 2 == 0 \
                    else (self.zl_side, bside)
                for side in order:
                    self.concurrent(side, n, a.tokens, f"base_tok_s_{n}", rnd)


class LlamaPeer:
    """llama-server started for a block and stopped after it, with what the JSON records of
    its runs: the commands, the crashes, keep-alive reconnects and its log's tail."""

    def __init__(self, a, model: str, tmp: Path):
        self.a, self.model, self.tmp = a, model, tmp
        self.cmds: list[str] = []
        self.fallback: list[str] = []  # the flags a crash of the default needed: kept from then on
        self.crashes: list[str] = []
        self.reconnects = 0
        self.log_tail: str | None = None

    @contextlib.contextmanager
    def serving(self, parallel: int):
        """A warmed-up LlamaSide on a fresh `-np parallel` server, stopped on exit."""
        servers: list[NativeLlamaServer] = []

        def start(extra: list[str]) -> NativeLlamaServer:
            servers.append(NativeLlamaServer(str(LLAMA_BIN / "llama-server"), self.model, self.a.threads,
                                             parallel, free_port(), self.tmp / f"llama-np{parallel}.log",
                                             extra=self.fallback or extra))
            return servers[-1]
        side = None
        try:
            srv, extra = llama_server_that_serves(start, lambda s: s.wait_ready())
            if extra and not self.fallback:
                self.fallback = extra
                crashed = servers[0]
                self.crashes.append(f"{shlex.join(crashed.cmd)}: {crashed.name} exited with status "
                                    f"{crashed.proc.returncode} before it was ready")
            self.cmds.append(shlex.join(srv.cmd))
            side = LlamaSide(srv)
            for content, max_tokens in ((QUESTION, self.a.ttft_tokens), (QUESTION, self.a.ttft_tokens),
                                        (story(0, "[warm] "), 16)):
                side.chat(content, max_tokens)
            log(f"  llama-server -np {parallel} ready in {srv.ready_s:.1f} s (pid {srv.pid})")
            yield side
        finally:
            if side is not None:
                if side.reconnects:
                    log(f"  llama-server keep-alive reconnects: {side.reconnects}")
                self.reconnects += side.reconnects
                side.close()
            if servers:
                servers[-1].stop()
                self.log_tail = log_tail(servers[-1], 3000)


def baseline_pkg(repo: str, tmp: Path) -> tuple[dict, dict]:
    """A package dir whose zerolayer/ is the checkout `repo`'s, and the env that imports it."""
    base = Path(repo).resolve()
    pkg = tmp / "baseline-pkg" / "zerolayer"
    pkg.mkdir(parents=True)
    for room in ("daemon", "gpu", "bpf"):
        if not (base / room).is_dir():
            raise SystemExit(f"--baseline-repo {base}: no {room}/")
        (pkg / room).symlink_to(base / room)
    for room in ("client", "protocol"):   # the baseline's own wire, where it has them
        if (base / room).is_dir():
            (pkg / room).symlink_to(base / room)
    env = {"PYTHONPATH": str(pkg.parent)}
    where = subprocess.run(
        [sys.executable, "-c", "import os, zerolayer.daemon.server as s, zerolayer.gpu.model as m;"
         " print(os.path.realpath(s.__file__)); print(os.path.realpath(m.__file__))"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    files = where.stdout.split()
    if where.returncode or not files or not all(f.startswith(str(base)) for f in files):
        raise SystemExit(f"baseline checkout not imported from {base}: {where.stdout!r} "
                         f"{where.stderr[-500:]!r}")
    info = {"path": str(base), "git": git_head(base),
            "subject": sh(f"git -C {base} log -1 --format=%s"), "imports": files}
    return env, info


def versions() -> dict:
    return {"python": platform.python_version(),
            "zerolayer_git": git_head(),
            "zerolayer_dirty_paths": sh(f"git -C {REPO} status --porcelain -- daemon gpu bpf"),
            "llama_server": sh(f"{LLAMA_BIN / 'llama-server'} --version 2>&1 | tail -n 2"),
            "llama_cpp_source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp (bench/setup_llamacpp.sh)"}


# ================================================================ summary and table


def summarise(r: dict, a) -> None:
    def samples(kind, side):   # a block's samples are a list, or one dict (the tok/s blocks)
        return [x for b in r["blocks"] if b["kind"] == kind and b["side"] == side
                for x in (b["samples"] if isinstance(b["samples"], list) else [b["samples"]])]

    s: dict = {}
    for side in ("zl", "llama", "base"):
        d: dict = {kind: stats([x[field] for x in samples(kind, side)]) for kind, field in (
            ("ping_idle", "rtt_s"), ("ping_load", "rtt_s"), ("ttft_idle", "ttft_s"), ("ttft_load", "ttft_s"))}
        c = samples("cancel_load", side)
        d["cancel"] = stats([x.get("cancel_s") for x in c])
        d["cancel_finish"] = sorted({str(x.get("finish_reason")) for x in c if "cancel_s" in x})
        d["slot_free"] = stats([x.get("slot_free_s") for x in c])
        if side == "llama" and c:
            d["slot_free_missing"] = sum(1 for x in c if x.get("slot_free_s") is None)
        usage = [x.get("usage") or {} for x in samples("ttft_idle", side)]
        d["ttft_idle_prompt_and_cached_tokens"] = sorted({(u.get("prompt_tokens"), u.get(
            "cached_prompt_tokens", (u.get("prompt_tokens_details") or {}).get("cached_tokens")))
            for u in usage}, key=str)
        texts = {x.get("text") for x in samples("ttft_idle", side)}
        d["idle_answers"] = sorted(t for t in texts if t is not None)[:3]
        for n in a.conc:
            for kind in (f"tok_s_{n}", f"base_tok_s_{n}"):
                if rounds := samples(kind, side):
                    d[kind] = {
                        "rounds": [x["tok_s"] for x in rounds],
                        "median": statistics.median([x["tok_s"] for x in rounds if x["tok_s"]] or [0]),
                        "tokens": [x["tokens"] for x in rounds],
                        "wall_s": [x["wall_s"] for x in rounds],
                        "errors": sum(len(x["errors"]) for x in rounds),
                        "token_sources": sorted({t for x in rounds for t in x["token_sources"]})}
        if d := {k: v for k, v in d.items() if v not in (None, [], {})}:
            s[side] = d
    # CPU time is counted in jiffies (10 ms): only blocks of >= 1 s say anything
    foreign = [b["cpu_share"]["foreign"] for b in r["blocks"]
               if "cpu_share" in b and b.get("wall_s", 0) >= 1.0]
    s["noise"] = {"foreign_share_max": max(foreign, default=None),
                  "foreign_share_median": statistics.median(foreign) if foreign else None,
                  "blocks_over_limit": sum(f > QUIET_LIMIT for f in foreign)}
    r["summary"] = s
    r["table"] = table_rows(r, a)


def table_rows(r: dict, a) -> list[dict]:
    """The table's rows: ours, theirs (a number, or a string saying why there is none), the
    ratio ours / theirs where both are numbers, the target, and met: ok(ours, ratio), None
    where a value it needs is missing."""
    s = r["summary"]
    Z, L, B = (s.get(k, {}) for k in ("zl", "llama", "base"))
    rows = []

    def add(metric, key, q, unit, target="", ok=None, theirs=None, peer=L):
        z = (Z.get(key) or {}).get(q)
        t = (peer.get(key) or {}).get(q) if theirs is None else theirs
        rt = None if not isinstance(t, (int, float)) or z is None or t == 0 else z / t
        met = None if ok is None or z is None or (rt is None and not isinstance(t, str)) else ok(z, rt)
        rows.append({"metric": metric, "ours": z, "theirs": t, "unit": unit, "ratio": rt,
                     "target": target, "met": met})

    n_ld = a.load_streams
    for q in ("p50", "p99"):
        add(f"PING {q}, idle", "ping_idle", q, "ms")
    for q, lim in (("p50", 1e-3), ("p99", 5e-3)):
        add(f"PING {q}, {n_ld} streams decoding", "ping_load", q, "ms",
            f"≤ {lim * 1e3:g} ms and ratio ≤ 1.0", lambda z, rt, lim=lim: z <= lim and rt <= 1.0)
    for key, label in (("ttft_idle", "TTFT p50, idle (sequential)"),
                       ("ttft_load", f"TTFT p50, new request while {n_ld} streams decode")):
        add(label, key, "p50", "ms", "ratio ≤ 0.75", lambda z, rt: rt <= 0.75)
    add("TTFT p99, idle", "ttft_idle", "p99", "ms")
    add(f"TTFT p99, {n_ld} streams decoding", "ttft_load", "p99", "ms")
    sf = L.get("slot_free")
    theirs_c = ("n/a: no protocol cancel" + (
        f" (close → slot free p50 {sf['p50'] * 1e3:.1f} / p99 {sf['p99'] * 1e3:.1f} ms)" if sf else ""))
    add(f"CANCEL p50, {n_ld} streams decoding", "cancel", "p50", "ms", theirs=theirs_c)
    add(f"CANCEL p99, {n_ld} streams decoding", "cancel", "p99", "ms", "≤ 5 ms", lambda z, rt: z <= 5e-3,
        theirs=theirs_c)
    for n in a.conc:
        add(f"aggregate tok/s, {n} streams × {a.tokens} tok (median of {a.rounds})", f"tok_s_{n}",
            "median", "tok/s", "ratio ≥ 1.5", lambda z, rt: rt >= 1.5)
    if B and r.get("baseline"):
        for n in a.conc:
            add(f"aggregate tok/s, {n} streams: this checkout vs baseline {r['baseline']['git']} "
                "(theirs column = baseline)", f"base_tok_s_{n}", "median", "tok/s", "ratio ≥ 0.95",
                lambda z, rt: rt >= 0.95, peer=B)
    return rows


def fmt(v, unit) -> str:
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if unit == "ms":
        x = v * 1e3
        return f"{x:.3f} ms" if x < 1 else f"{x:.2f} ms" if x < 100 else f"{x:.0f} ms"
    if unit == "tok/s":
        return f"{v:.1f} tok/s"
    return f"{v:g}" if isinstance(v, float) else str(v)


def render(r: dict) -> str:
    m, v, s = r["machine"], r["versions"], r["summary"]
    lines = [f"### Data plane: zerolayerd vs llama.cpp llama-server ({r['date']})", "",
             f"Machine: {m['cpu_model']}, nproc {m['nproc']} ({m['hypervisor'] or 'bare metal'}), "
             f"kernel {m['kernel']}. Model `{Path(r['model']['path']).name}`, 2 threads each. "
             f"zerolayer {v['zerolayer_git']}{' (dirty daemon/gpu)' if v['zerolayer_dirty_paths'] else ''}; "
             f"llama-server `{v['llama_server'].splitlines()[0] if v['llama_server'] else '?'}`.", "",
             "| metric | ours | llama-server | ratio | target | met? |", "|---|---|---|---|---|---|"]
    for row in r["table"]:
        met = "" if row["met"] is None and not row["target"] else \
            ("n/a" if row["met"] is None else ("**yes**" if row["met"] else "**no**"))
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}"
        lines.append(f"| {row['metric']} | {fmt(row['ours'], row['unit'])} | "
                     f"{fmt(row['theirs'], row['unit'])} | {ratio} | {row['target']} | {met} |")
    Z, L = s.get("zl", {}), s.get("llama", {})
    lines.append("")
    if Z.get("cancel_finish"):
        lines.append(f"- Cancel: ours finish reasons {Z['cancel_finish']}" + (
            f"; theirs: the client closes the connection (no cancel in the protocol), then "
            f"polls /slots until the request's slot is free; not seen freeing within 10 s: "
            f"{L['slot_free_missing']} of {r['args']['cancels']}." if "slot_free_missing" in L
            else "."))
    toks = [f"{side} {n}: {d[f'tok_s_{n}']['tokens']} tokens via {d[f'tok_s_{n}']['token_sources']}"
            f" (errors {d[f'tok_s_{n}']['errors']})"
            for side, d in (("ours", Z), ("theirs", L)) for n in r["args"]["conc"]
            if f"tok_s_{n}" in d]
    if toks:
        lines.append("- Tokens per round: " + "; ".join(toks) + ".")
    for k, what, tail in (
            ("idle_answers", "Greedy answers to the question", ""),
            ("ttft_idle_prompt_and_cached_tokens", "Idle TTFT, (prompt tokens, of which reused from "
             "an earlier request's KV)", " (the same question every time)")):
        if k in Z or k in L:
            lines.append(f"- {what}: ours {Z.get(k)}, theirs {L.get(k)}{tail}.")
    if r.get("baseline"):
        b = r["baseline"]
        lines.append(f"- Baseline: {b['path']} at {b['git']} ({b['subject']}).")
    n = s["noise"]
    if n["foreign_share_max"] is not None:
        lines.append(f"- Noise: other processes took at most {n['foreign_share_max']:.0%} of the "
                     f"machine during a block (median {n['foreign_share_median']:.0%}; "
                     f"{n['blocks_over_limit']} blocks over {QUIET_LIMIT:.0%}). "
                     f"Preflight: {r['preflight']['foreign_share']:.0%} busy after "
                     f"{r['preflight']['waited_s']:.0f} s.")
    lines += [f"- Load: before `{r['machine']['uptime_before']}`; after "
              f"`{r['machine']['uptime_after']}`. Run took {r['duration_s']:.0f} s.",
              f"- zerolayerd: `{r['servers']['zl']}`",
              *[f"- llama-server: `{c}`" for c in r["servers"]["llama"]],
              f"- Command: `{r['command']}`"]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--loadgen":
        return loadgen_main(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="", help="GGUF (default: the bundled SmolLM2-135M Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the side order alternates")
    ap.add_argument("--tokens", type=int, default=200, help="max_tokens of the streams")
    ap.add_argument("--conc", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16],
                    help="the two concurrency levels, e.g. 8,16")
    ap.add_argument("--load-streams", type=int, default=8, help="streams decoding under load")
    ap.add_argument("--load-tokens", type=int, default=200,
                    help="max_tokens of each load stream (a finished one is replaced at once)")
    ap.add_argument("--load-slots", type=int, default=16,
                    help="llama-server -np for the probes under load (> --load-streams)")
    ap.add_argument("--pings", type=int, default=300, help="pings per side, idle and under load each")
    ap.add_argument("--ping-gap-ms", type=float, default=5.0, help="between pings under load")
    ap.add_argument("--pinger-runtime-us", type=int, default=0,
                    help="the pinger under load runs with SCHED_DEADLINE, this many µs a ms "
                         "(root): as a client on a host of its own would, never waiting for a "
                         "CPU behind either server's compute threads; the same for both sides")
    ap.add_argument("--ttft", type=int, default=30, help="TTFT requests per side, idle and under load each")
    ap.add_argument("--ttft-tokens", type=int, default=16)
    ap.add_argument("--cancels", type=int, default=30, help="cancel probes per side")
    ap.add_argument("--flood-s", type=float, default=0.0,
                    help="ignored: the datagram flood moved to bench/bench_flood.py")
    ap.add_argument("--baseline-repo", default="", help="also measure tok/s of a zerolayerd "
                    "from this checkout (e.g. a git worktree of the old commit)")
    ap.add_argument("--zl-extra", default="--engine-max-running 16", help="zerolayerd flags")
    ap.add_argument("--max-wait", type=float, default=600,
                    help="preflight: wait this long for other processes to go quiet, then measure")
    ap.add_argument("--lock-wait", type=float, default=7200, help=f"wait this long for {LOCK_PATH}")
    ap.add_argument("--only-ours", action="store_true",
                    help="skip llama-server (a check of this side alone; no ratios)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny counts, not for publishing")
    ap.add_argument("--out", default="")
    ap.add_argument("--render", default="", metavar="JSON",
                    help="only print the table of an earlier run's JSON (summary recomputed)")
    a = ap.parse_args()
    if a.render:
        r = json.loads(Path(a.render).read_text())
        summarise(r, argparse.Namespace(**r["args"]))
        print(render(r))
        return 0
    if a.quick:
        a.rounds, a.tokens, a.pings, a.ttft, a.cancels, a.max_wait = 1, 32, 20, 3, 3, 0
    if a.load_slots <= a.load_streams:
        ap.error("--load-slots must exceed --load-streams (a probe needs a free slot)")
    a.pings_per_round, a.ttft_per_round, a.cancel_per_round = (
        max(1, x // a.rounds) for x in (a.pings, a.ttft, a.cancels))
    r = Bench(a).run()
    print(render(r))
    print(f"\nJSON: {r['json_path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
