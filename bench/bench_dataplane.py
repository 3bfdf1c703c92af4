#!/usr/bin/env python
"""zerolayerd vs llama.cpp's native `llama-server`, in one run, on the same GGUF, 2 threads each.

    .venv/bin/python bench/bench_dataplane.py [--quick] [--baseline-repo PATH] [--out PATH]

llama-server is llama.cpp's own C++ server (bench/setup_llamacpp.sh builds it into
.bench-llamacpp/bin), run with continuous batching over N parallel slots:
`llama-server -m MODEL -np N -c 2048*N -t 2 -tb 2 --host 127.0.0.1 --port P`, N = 8 for the
8-stream metrics and N = 16 for the 16-stream ones and for the probes under load (those need a
free slot beside the 8 loading streams, or a probe would queue for a whole 200-token stream).
The two llama-server instances never run at the same time: each is started for its block and
stopped after it. zerolayerd (`--engine-max-running 16`, 2 model threads) stays up all run and
is idle while llama-server is measured. Only one server ever has requests in flight.

Metrics (each side in turn; with --rounds > 1 the order alternates A B / B A per round):
1. PING round trip, idle and while 8 streams x 200 tokens decode. Ours: Client.ping() timed
   around the call (fresh UDP socket, signed PING, signed PONG). Theirs: GET /health on one
   keep-alive http.client connection. Under load the pings are spaced --ping-gap-ms apart.
2. TTFT of the chat question "What is the capital of France?", greedy: sequential on an idle
   server (max_tokens 16, run to completion), and for new requests while 8 streams decode
   (the stream is closed after the first chunk). TTFT = just before the request is sent ->
   first non-empty content chunk. Theirs: POST /v1/chat/completions, stream=true.
3. CANCEL under load: ours starts a stream, and after its first chunk times s.cancel() until
   it returns (the daemon's DONE "cancelled"). llama-server has no cancel in its protocol;
   closing the connection is all a client can do, so the ratio is n/a. As an extra, the time
   from that close until /slots shows the request's slot free is recorded (polling /slots,
   which the server answers between decode steps).
4. Aggregate tok/s, 8 and 16 concurrent streams x --tokens (200) tokens, distinct prompts
   ("Write a long story about TOPIC."), greedy; completion TOKENS (ours: usage from DONE;
   theirs: usage of the final SSE chunk, "stream_options": {"include_usage": true}, else
   timings.predicted_n) / wall time from a common start line to the last stream's end.
5. Datagrams lost in the kernel (ours only; llama-server has no UDP path): --flood-rate
   datagrams/s (half signed PINGs from zerolayer.protocol.wire.encode_control, half garbage) for
   --flood-s seconds while 8 streams decode. lost = datagrams sent to the daemon (the flood,
   plus every datagram the SDK sent, counted by wrapping the SDK's send) - the delta of the
   daemon's zerolayer_ingress_datagrams_total. Also the delta of Udp RcvbufErrors in
   /proc/net/snmp (system-wide).
6. --baseline-repo PATH: metric 4 again against a zerolayerd started from another checkout
   (imported through a temp dir of symlinks zerolayer/{daemon,gpu,bpf} -> PATH/..., put on
   PYTHONPATH), alternating with this checkout's daemon; ratio new/baseline.

The load for metrics 1-3 and 5 comes from a separate process (this script, --loadgen), so its
threads never hold the probe thread's GIL; it keeps 8 streams decoding (a finished stream is
replaced at once) until told to stop. The whole measurement holds an exclusive flock on
/tmp/zl-bench.lock, so other benchmark runs that take it wait. All traffic goes to 127.0.0.1.
Results: JSON under bench/results/ (gitignored) with every sample, and a markdown table on stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import http.client
import json
import os
import platform
import random
import secrets
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
    RESULTS,
    CpuWatch,
    NativeLlamaServer,
    ZeroLayerDaemon,
    chat_body,
    default_model,
    free_port,
    git_head,
    http_get_timed,
    http_stream_chat,
    log,
    machine_info,
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
FLOOD_VALID = 0.5         # share of signed PINGs in the datagram flood
LOAD_TIME_LIMIT_S = 600.0  # the load generator stops itself after this long


def story(i: int, tag: str = "") -> str:
    return f"{tag}Write a long story about {TOPICS[i % len(TOPICS)]}."


# ================================================================ small helpers


def udp_snmp() -> dict:
    """The Udp: counters of /proc/net/snmp (system-wide)."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:])}


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


class SendCounter:
    """Counts every datagram the SDK sends over UDP in this process: wraps the UDP channel's
    send (client/udp_transport.py), the one every Client(address) opens per call."""

    def __init__(self):
        from zerolayer.client import udp_transport
        self.n = 0
        self._lock = threading.Lock()
        orig = udp_transport.UdpChannel.send
        self.ok = True

        def counted(ch, dg, _orig=orig):
            with self._lock:
                self.n += 1
            return _orig(ch, dg)
        udp_transport.UdpChannel.send = counted  # type: ignore[method-assign]


# ================================================================ the two sides


class ZlSide:
    def __init__(self, daemon: ZeroLayerDaemon, name: str = "zl"):
        from zerolayer.client import Client
        self.name = name
        self.d = daemon
        self.client = Client(daemon.addr, daemon.key_id, daemon.secret, timeout=60)

    def loadgen_spec(self) -> dict:
        return {"side": "zl", "port": self.d.port, "key_id": self.d.key_id,
                "secret": self.d.secret.hex()}

    def pids(self) -> dict:
        return {self.name: self.d.pid}

    def ping(self) -> dict:
        t0 = time.perf_counter()
        inner = self.client.ping()
        return {"rtt_s": time.perf_counter() - t0, "sdk_rtt_s": inner}

    def ttft_full(self, content: str, max_tokens: int) -> dict:
        r = zl_stream_chat(self.client, content, max_tokens)
        r["completion_tokens"] = r["usage"]["completion_tokens"]
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

    def stream_tokens(self, content: str, max_tokens: int) -> dict:
        r = zl_stream_chat(self.client, content, max_tokens)
        return {"ttft_s": r["ttft_s"], "e2e_s": r["e2e_s"], "tokens": r["usage"]["completion_tokens"],
                "token_source": "usage", "chunks": r["content_chunks"],
                "finish_reason": r["finish_reason"]}

    def prep(self):
        return None


@contextlib.contextmanager
def pinger_priority(runtime_us: int):
    """This thread under SCHED_DEADLINE (runtime_us of each ms) for the block, then normal
    scheduling again; nothing when runtime_us is 0."""
    if not runtime_us:
        yield
        return
    from zerolayer.daemon.sched_deadline import set_deadline
    set_deadline(runtime_us, 1000)
    try:
        yield
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


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
        self.s = server
        self.port = server.port
        self.ping_conn = self._conn(10)
        self.slots_conn = self._conn(30)
        self.reconnects = 0

    def _conn(self, timeout: float) -> http.client.HTTPConnection:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.connect()
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    def close(self) -> None:
        for c in (self.ping_conn, self.slots_conn):
            c.close()

    def loadgen_spec(self) -> dict:
        return {"side": "llama", "port": self.port}

    def pids(self) -> dict:
        return {"llama": self.s.pid}

    def ping(self) -> dict:
        """GET /health on the keep-alive connection. The server closes a keep-alive connection
        after 100 requests or 5 s idle (cpp-httplib's defaults): the reconnect is made before
        the clock starts, and a request that finds the connection closed is redone."""
        for attempt in range(2):
            if self.ping_conn.sock is None:
                self.ping_conn.connect()
            try:
                return {"rtt_s": http_get_timed(self.ping_conn, "/health"), "retried": attempt}
            except (http.client.HTTPException, ConnectionError):
                self.ping_conn.close()
                self.reconnects += 1
        raise RuntimeError("GET /health failed twice")

    def ttft_full(self, content: str, max_tokens: int) -> dict:
        # llama-server closes the connection after a streamed response, so every stream gets
        # a fresh one, connected before the clock starts (no TCP handshake in the TTFT)
        conn = self._conn(300)
        try:
            r = http_stream_chat(conn, chat_body(content, max_tokens, extra=STREAM_OPTS))
        finally:
            conn.close()
        r["completion_tokens"] = r["tokens"]
        return r

    def _slots(self) -> list[dict]:
        for attempt in range(2):
            if self.slots_conn.sock is None:
                self.slots_conn.connect()
            try:
                self.slots_conn.request("GET", "/slots")
                r = self.slots_conn.getresponse()
                data = r.read()
                break
            except (http.client.HTTPException, ConnectionError):
                self.slots_conn.close()
                self.reconnects += 1
                if attempt:
                    raise
        if r.status != 200:
            raise RuntimeError(f"/slots: HTTP {r.status}: {data[:200]!r}")
        return json.loads(data)

    def probe(self, content: str, max_tokens: int, cancel: bool) -> dict:
        conn = self._conn(60)
        # /slots shows no prompt text outside its debug mode, but it shows each slot's sampling
        # parameters: a unique seed (inert under greedy decoding) tells our slot apart
        self.probe_seed = getattr(self, "probe_seed", 7_000_000) + 1
        seed = self.probe_seed
        out = http_stream_chat(conn, chat_body(content, max_tokens,
                                               extra={**STREAM_OPTS, "seed": seed}), first_only=True)
        res = {"ttft_s": out["ttft_s"]}
        if not cancel:
            hard_close(conn)
            return res
        slot = None
        for s in self._slots():
            if s.get("is_processing") and (s.get("params") or {}).get("seed") == seed:
                slot = s
                break
        t1 = time.perf_counter()
        hard_close(conn)
        res["close_s"] = time.perf_counter() - t1
        res["slot_free_s"] = None
        if slot is None:
            res["slot"] = "not found"
            return res
        res["slot"] = slot["id"]
        polls = 0
        while time.perf_counter() - t1 < 10 and polls < 5000:
            polls += 1
            cur = next((s for s in self._slots() if s["id"] == slot["id"]), None)
            if cur is None or not cur.get("is_processing") or cur.get("id_task") != slot.get("id_task"):
                res["slot_free_s"] = time.perf_counter() - t1
                break
        res["slot_polls"] = polls
        return res

    def prep(self):
        return self._conn(600)

    def stream_tokens_on(self, conn, content: str, max_tokens: int) -> dict:
        r = http_stream_chat(conn, chat_body(content, max_tokens, extra=STREAM_OPTS))
        conn.close()
        return {"chunks": r["content_chunks"], **{k: r[k] for k in (
            "ttft_s", "e2e_s", "tokens", "token_source", "finish_reason", "usage", "timings")}}


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
    counter = None
    if spec["side"] == "zl":
        from zerolayer.client import Client
        from zerolayer.protocol.wire import ChatMessage
        counter = SendCounter()
        client = Client(("127.0.0.1", spec["port"]), spec["key_id"], bytes.fromhex(spec["secret"]),
                        timeout=60)

    def one_zl(i: int, k: int) -> None:
        with client.stream(messages=[ChatMessage("user", story(i + k * n, f"[load {i}.{k}] "))],
                           max_tokens=mt, temperature=0.0) as s:
            for chunk in s:
                if chunk:
                    started[i].set()
                    with lock:
                        tot["chunks"] += 1
                if stop.is_set():
                    s.cancel()
                    with lock:
                        tot["stopped"] += 1
                    break
        if s.result is not None:
            with lock:
                tot["tokens"] += s.result.usage.completion_tokens
                tot["finished"] += s.result.finish_reason != "cancelled"

    def one_llama(i: int, k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", spec["port"], timeout=120)
        body = chat_body(story(i + k * n, f"[load {i}.{k}] "), mt, extra=STREAM_OPTS)
        conn.request("POST", "/v1/chat/completions", body=body, headers=HEADERS)
        r = conn.getresponse()
        done = True
        for ev in sse_events(r):
            if ev.get("usage"):
                with lock:
                    tot["tokens"] += ev["usage"].get("completion_tokens", 0)
            if any((c.get("delta") or {}).get("content") for c in ev.get("choices", ())):
                started[i].set()
                with lock:
                    tot["chunks"] += 1
            if stop.is_set():
                done = False
                with lock:
                    tot["stopped"] += 1
                break
        hard_close(conn)
        with lock:
            tot["finished"] += done

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
    tot["sdk_datagrams"] = counter.n if counter and counter.ok else None
    tot["hung_threads"] = sum(t.is_alive() for t in threads)
    print(json.dumps(tot), flush=True)
    return 0


class LoadGen:
    def __init__(self, side, streams: int, max_tokens: int, time_limit: float):
        spec = {**side.loadgen_spec(), "streams": streams, "max_tokens": max_tokens,
                "time_limit": time_limit}
        self.spec = spec
        self.proc = subprocess.Popen([sys.executable, __file__, "--loadgen", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.t0 = time.perf_counter()

    def _line(self, timeout: float) -> str:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise RuntimeError(f"load generator silent for {timeout} s")
        return self.proc.stdout.readline().strip()

    def wait_ready(self, timeout: float = 150) -> int:
        line = self._line(timeout)
        if not line.startswith("ready"):
            raise RuntimeError(f"load generator: {line!r}")
        self.ready_s = time.perf_counter() - self.t0
        return int(line.split()[1])

    def stop(self) -> dict:
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
            summary = json.loads(self._line(90) or "{}")
        except (OSError, RuntimeError, ValueError) as e:
            summary = {"error": repr(e)}
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        summary["duration_s"] = time.perf_counter() - self.t0
        return summary

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ================================================================ the benchmark


class Bench:
    def __init__(self, a):
        self.a = a
        self.blocks: list[dict] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="zl-bench-dataplane-"))
        self.zl_side = self.bside = None

    # -- a block: CPU split of the machine, samples kept --------------------------------------

    def block(self, kind: str, side, fn, extra_pids: dict | None = None, **meta) -> dict:
        pids = {}
        for other in (self.zl_side, self.bside):      # every server that is up, busy or idle
            if other is not None:
                pids.update(other.pids())
        pids.update(side.pids())
        pids.update(extra_pids or {})
        w = CpuWatch(pids)
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
                   lambda: [side.ttft_full(QUESTION, a.ttft_tokens) for _ in range(a.ttft_per_round)],
                   round=rnd)

    def concurrent(self, side, n: int, max_tokens: int, kind: str, rnd: int) -> dict:
        barrier = threading.Barrier(n + 1)
        results: list = [None] * n
        ends = [0.0] * n
        errors: list[str] = []

        def run(i):
            try:
                prep = side.prep()
                barrier.wait(120)
                if isinstance(side, ZlSide):
                    results[i] = side.stream_tokens(story(i, f"[{kind} r{rnd}] "), max_tokens)
                else:
                    results[i] = side.stream_tokens_on(prep, story(i, f"[{kind} r{rnd}] "),
                                                       max_tokens)
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
            pids = {"loadgen": lg.pid}

            def pings():
                out = []
                with pinger_priority(a.pinger_runtime_us):
                    for _ in range(a.pings_per_round):
                        out.append(side.ping())
                        time.sleep(a.ping_gap_ms / 1e3)
                return out

            def probes(cancel: bool, n: int):
                out = []
                for k in range(n):
                    if cancel:
                        content = story(k, f"(cancel probe r{rnd}.{k}) ")
                        out.append(side.probe(content, a.load_tokens, cancel=True))
                    else:
                        out.append(side.probe(QUESTION, a.ttft_tokens, cancel=False))
                    time.sleep(PROBE_GAP_S)
                return out

            self.block("ping_load", side, pings, pids, round=rnd, load_active=active)
            self.block("ttft_load", side, lambda: probes(False, a.ttft_per_round), pids, round=rnd,
                       load_active=active)
            self.block("cancel_load", side, lambda: probes(True, a.cancel_per_round), pids,
                       round=rnd, load_active=active)
        finally:
            summary = lg.stop()
            self.blocks.append({"kind": "load_summary", "side": side.name, "round": rnd,
                                "samples": summary})
            log(f"  load summary: {summary}")

    # -- servers ----------------------------------------------------------------------------

    def start_zl(self, name: str, env: dict | None = None):
        d = self.tmp / name
        d.mkdir()
        zl = ZeroLayerDaemon(sys.executable, self.model, self.a.threads, 2048, d, d / "zerolayerd.log",
                             shlex.split(self.a.zl_extra), env=env)
        zl.wait_ready()
        log(f"  {name} ready in {zl.ready_s:.1f} s (pid {zl.pid})")
        return zl

    def warm_zl(self, side) -> None:
        for _ in range(3):
            side.ttft_full(QUESTION, self.a.ttft_tokens)
        self.concurrent(side, 16, 16, "warm", -1)
        self.blocks.pop()

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> dict:
        a = self.a
        RESULTS.mkdir(parents=True, exist_ok=True)
        out_path = Path(a.out) if a.out else RESULTS / f"dataplane-{time.strftime('%Y%m%d-%H%M%S')}.json"
        if not a.only_ours and not (LLAMA_BIN / "llama-server").exists():
            raise SystemExit(f"{LLAMA_BIN}/llama-server missing: run bash bench/setup_llamacpp.sh")
        command = shlex.join([sys.executable, *sys.argv])
        lock, lock_wait = take_lock(a.lock_wait, command)
        started = _dt.datetime.now().astimezone()
        r: dict = {"bench": "dataplane", "date": started.isoformat(timespec="seconds"),
                   "command": command, "args": vars(a),
                   "lock": {"path": LOCK_PATH, "waited_s": round(lock_wait, 1)},
                   "machine": machine_info(), "versions": versions(a)}
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
        self.sdk_counter = SendCounter()
        self.zl = self.base = None
        try:
            log("starting zerolayerd")
            self.zl = self.start_zl("zl")
            self.zl_side = ZlSide(self.zl)
            r["servers"] = {"zl": shlex.join(self.zl.cmd)}
            self.warm_zl(self.zl_side)
            for rnd in range(a.rounds):
                self.round(rnd)
            if a.flood_s > 0:
                log(f"flood: {a.flood_rate}/s for {a.flood_s} s while {a.load_streams} streams decode")
                r["flood"] = flood(self)
            if a.baseline_repo:
                self.against_baseline(r)
        finally:
            for d in (self.base, self.zl):
                if d is not None:
                    d.stop()
            r["server_logs_tail"] = {
                "zl": self.zl.log_path.read_text(errors="replace")[-2000:] if self.zl else None,
                "llama": self.llama.log_tail,
                "baseline": self.base.log_path.read_text(errors="replace")[-2000:] if self.base else None}
            lock.close()
            shutil.rmtree(self.tmp, ignore_errors=True)   # keys files and logs (tails kept above)
        r["servers"]["llama"] = sorted(set(self.llama.cmds))
        r["servers"]["llama_crashed"] = self.llama.crashes
        r["llama_keepalive_reconnects"] = self.llama.reconnects
        r["machine"]["uptime_after"] = sh("uptime")
        r["blocks"] = self.blocks
        r["finished"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        r["duration_s"] = round((_dt.datetime.now().astimezone() - started).total_seconds(), 1)
        out_path.write_text(json.dumps(r, indent=1, default=str))   # the samples, come what may
        summarise(r, a)
        out_path.write_text(json.dumps(r, indent=1, default=str))
        r["json_path"] = str(out_path)
        return r

    def round(self, rnd: int) -> None:
        """Idle and the first concurrency, then under load and the second; the side going
        first alternates from round to round."""
        a = self.a
        first_llama = rnd % 2 == 0
        log(f"round {rnd + 1}/{a.rounds}: idle + {a.conc[0]} streams")
        for who in (("llama", "zl") if first_llama else ("zl", "llama")):
            if who == "llama" and a.only_ours:
                continue
            if who == "llama":
                srv, side = self.llama.start(a.conc[0])
                try:
                    self.idle(side, rnd)
                    self.concurrent(side, a.conc[0], a.tokens, f"tok_s_{a.conc[0]}", rnd)
                finally:
                    self.llama.stop(srv, side)
            else:
                self.idle(self.zl_side, rnd)
                self.concurrent(self.zl_side, a.conc[0], a.tokens, f"tok_s_{a.conc[0]}", rnd)
        log(f"round {rnd + 1}/{a.rounds}: under load + {a.conc[1]} streams")
        for who in (("zl", "llama") if first_llama else ("llama", "zl")):
            if who == "llama" and a.only_ours:
                continue
            if who == "llama":
                srv, side = self.llama.start(a.load_slots)
                try:
                    self.under_load(side, rnd)
                    if a.load_slots != a.conc[1]:
                        self.llama.stop(srv, side)
                        srv, side = self.llama.start(a.conc[1])
                    self.concurrent(side, a.conc[1], a.tokens, f"tok_s_{a.conc[1]}", rnd)
                finally:
                    self.llama.stop(srv, side)
            else:
                self.under_load(self.zl_side, rnd)
                self.concurrent(self.zl_side, a.conc[1], a.tokens, f"tok_s_{a.conc[1]}", rnd)

    def against_baseline(self, r: dict) -> None:
        """tok/s of a zerolayerd from --baseline-repo against ours, interleaved."""
        a = self.a
        env, r["baseline"] = baseline_pkg(a.baseline_repo, self.tmp)
        log(f"baseline: zerolayerd from {r['baseline']['path']} ({r['baseline']['git']})")
        self.base = self.start_zl("baseline", env)
        r["servers"]["baseline"] = f"PYTHONPATH={env['PYTHONPATH']} " + shlex.join(self.base.cmd)
        bside = self.bside = ZlSide(self.base, "base")
        self.warm_zl(bside)
        for rnd in range(a.rounds):
            for n in a.conc:
                order = (bside, self.zl_side) if (rnd + (n == a.conc[1])) % 2 == 0 \
                    else (self.zl_side, bside)
                for side in order:
                    self.concurrent(side, n, a.tokens, f"base_tok_s_{n}", rnd)


def flood(b: Bench) -> dict:
    """Metric 5: datagrams to the daemon while 8 streams decode; lost in the kernel."""
    from zerolayer.protocol.wire import Mac, MsgType, encode_control
    a, d = b.a, b.zl
    n = int(a.flood_rate * a.flood_s)
    mac = Mac(d.secret)
    ts = time.time_ns() // 1000
    rng = random.Random(20240611)
    junk = [b"JUNK" + rng.randbytes(rng.randint(0, 1396)) for _ in range(512)]
    dgs = []
    n_valid = 0
    for i in range(n):
        if int((i + 1) * FLOOD_VALID) > int(i * FLOOD_VALID):
            dgs.append(encode_control(MsgType.PING, d.key_id, mac, secrets.token_bytes(16), ts,
                                      secrets.token_bytes(32)))
            n_valid += 1
        else:
            dgs.append(junk[i % len(junk)])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.connect(d.addr)
    sock.setblocking(False)
    pongs = 0

    def drain():
        nonlocal pongs
        for _ in range(100_000):
            try:
                sock.recv(2048)
                pongs += 1
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionRefusedError:
                continue

    key = "zerolayer_ingress_datagrams_total"
    m0 = scrape(d.metrics_port)
    snmp0 = udp_snmp()
    sdk0 = b.sdk_counter.n
    lg = LoadGen(b.zl_side, a.load_streams, a.load_tokens, a.flood_s + 120)
    res: dict = {"rate": a.flood_rate, "duration_s": a.flood_s, "planned": n,
                 "valid_planned": n_valid}
    try:
        res["load_active"] = lg.wait_ready()

        def go():
            sent = errs = 0
            max_lag = 0
            t0 = time.perf_counter()
            while sent < n and time.perf_counter() - t0 < a.flood_s + 10:
                due = min(n, int((time.perf_counter() - t0) * a.flood_rate) + 1)
                max_lag = max(max_lag, due - sent)
                while sent < due:
                    try:
                        sock.send(dgs[sent])
                    except (BlockingIOError, ConnectionRefusedError):
                        errs += 1
                    sent += 1
                drain()
                time.sleep(0.001)
            wall = time.perf_counter() - t0
            return {"sent": sent - errs, "send_errors": errs, "wall_s": wall,
                    "achieved_rate": (sent - errs) / wall, "max_lag_datagrams": max_lag}
        res.update(b.block("flood", b.zl_side, go, {"loadgen": lg.pid})["samples"])
    finally:
        res["load"] = lg.stop()
    # settle: every datagram queued has been read when the counter stops moving
    last, t_settle = None, time.monotonic()
    while time.monotonic() - t_settle < 15:
        drain()
        cur = scrape(d.metrics_port).get(key)
        if cur is not None and cur == last:
            break
        last = cur
        time.sleep(0.5)
    drain()
    m1 = scrape(d.metrics_port)
    snmp1 = udp_snmp()
    sock.close()
    res["pongs_received"] = pongs
    res["sdk_datagrams_bench"] = b.sdk_counter.n - sdk0 if b.sdk_counter.ok else None
    res["sdk_datagrams_loadgen"] = res["load"].get("sdk_datagrams")
    res["daemon_counter"] = key if key in m1 else None
    if key in m0 and key in m1:
        res["daemon_received"] = int(m1[key] - m0[key])
        if res["sdk_datagrams_loadgen"] is not None and res["sdk_datagrams_bench"] is not None:
            res["sent_total"] = res["sent"] + res["sdk_datagrams_loadgen"] + res["sdk_datagrams_bench"]
            res["lost"] = res["sent_total"] - res["daemon_received"]
    res["udp_snmp_delta"] = {k: snmp1[k] - snmp0.get(k, 0) for k in snmp1}
    res["rcvbuf_errors_delta"] = res["udp_snmp_delta"].get("RcvbufErrors")
    res["daemon_error_deltas"] = {k: m1[k] - m0.get(k, 0) for k in m1
                                  if k.startswith("zerolayer_request_errors_total")
                                  and m1[k] - m0.get(k, 0)}
    b.blocks[-1]["samples"] = res
    log(f"  flood: sent {res['sent']} (+SDK {res['sdk_datagrams_loadgen']}), daemon read "
        f"{res.get('daemon_received')}, lost {res.get('lost')}, RcvbufErrors "
        f"+{res['rcvbuf_errors_delta']}, pongs {pongs}/{n_valid}")
    return res


class LlamaPeer:
    """llama-server started for a block and stopped after it, with what the JSON records of
    its runs: the commands, the crashes, keep-alive reconnects and its log's tail."""

    def __init__(self, a, model: str, tmp: Path):
        self.a, self.model, self.tmp = a, model, tmp
        self.cmds: list[str] = []
        self.fallback: list[str] = []  # flags added after a crash (start)
        self.crashes: list[str] = []
        self.reconnects = 0
        self.log_tail: str | None = None

    def start(self, parallel: int):
        srv = NativeLlamaServer(str(LLAMA_BIN / "llama-server"), self.model, self.a.threads,
                                parallel, free_port(), self.tmp / f"llama-np{parallel}.log",
                                extra=self.fallback)
        try:
            try:
                srv.wait_ready()
            except RuntimeError as e:
                # llama.cpp 0c1e570's weight repacking for AMX dies of SIGSEGV on prompts
                # (its warm-up is one): the peer is then its fastest mode that serves,
                # --no-repack (a mode that crashes on prompts is no peer), and the JSON says so
                if "--no-repack" in self.fallback or "exited with status -11" not in str(e):
                    raise
                log("  llama-server crashed (SIGSEGV) with its default weight repacking; "
                    "measuring it with --no-repack from here on")
                self.fallback = ["--no-repack"]
                self.crashes.append(f"{shlex.join(srv.cmd)}: {str(e).splitlines()[0]}")
                srv.stop()
                return self.start(parallel)
            self.cmds.append(shlex.join(srv.cmd))
            side = LlamaSide(srv)
            # warm-up: the question twice, one short story
            side.ttft_full(QUESTION, self.a.ttft_tokens)
            side.ttft_full(QUESTION, self.a.ttft_tokens)
            side.ttft_full(story(0, "[warm] "), 16)
        except BaseException:
            srv.stop()
            self.log_tail = srv.log_path.read_text(errors="replace")[-3000:]
            raise
        log(f"  llama-server -np {parallel} ready in {srv.ready_s:.1f} s (pid {srv.pid})")
        return srv, side

    def stop(self, srv, side) -> None:
        if side.reconnects:
            log(f"  llama-server keep-alive reconnects: {side.reconnects}")
        self.reconnects += side.reconnects
        side.close()
        srv.stop()
        self.log_tail = srv.log_path.read_text(errors="replace")[-3000:]


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


def versions(a) -> dict:
    return {"python": platform.python_version(),
            "zerolayer_git": git_head(),
            "zerolayer_dirty_paths": sh(f"git -C {REPO} status --porcelain -- daemon gpu bpf"),
            "llama_server": sh(f"{LLAMA_BIN / 'llama-server'} --version 2>&1 | tail -n 2"),
            "llama_cpp_source": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp (bench/setup_llamacpp.sh)"}


# ================================================================ summary and table


def summarise(r: dict, a) -> None:
    def samples(kind, side):
        out = []
        for b in r["blocks"]:
            if b["kind"] == kind and b["side"] == side:
                out.extend(b["samples"] if isinstance(b["samples"], list) else [b["samples"]])
        return out

    s: dict = {}
    for side in ("zl", "llama", "base"):
        d: dict = {}
        for kind in ("ping_idle", "ping_load"):
            d[kind] = stats([x["rtt_s"] for x in samples(kind, side)])
        d["ttft_idle"] = stats([x["ttft_s"] for x in samples("ttft_idle", side)])
        d["ttft_load"] = stats([x["ttft_s"] for x in samples("ttft_load", side)])
        c = samples("cancel_load", side)
        d["cancel"] = stats([x.get("cancel_s") for x in c])
        d["cancel_finish"] = sorted({str(x.get("finish_reason")) for x in c if "cancel_s" in x})
        d["slot_free"] = stats([x.get("slot_free_s") for x in c])
        if side == "llama" and c:
            d["slot_free_missing"] = sum(1 for x in c if x.get("slot_free_s") is None)
        prompt_use = set()
        for x in samples("ttft_idle", side):
            u = x.get("usage") or {}
            details = u.get("prompt_tokens_details") or {}
            cached = u.get("cached_prompt_tokens", details.get("cached_tokens"))
            prompt_use.add((u.get("prompt_tokens"), cached))
        d["ttft_idle_prompt_and_cached_tokens"] = sorted(prompt_use, key=str)
        idle_texts = {x.get("text") for x in samples("ttft_idle", side)}
        d["idle_answers"] = sorted(t for t in idle_texts if t is not None)[:3]
        for n in a.conc:
            for prefix in ("tok_s", "base_tok_s"):
                rounds = samples(f"{prefix}_{n}", side)
                if rounds:
                    d[f"{prefix}_{n}"] = {
                        "rounds": [x["tok_s"] for x in rounds],
                        "median": statistics.median([x["tok_s"] for x in rounds if x["tok_s"]] or [0]),
                        "tokens": [x["tokens"] for x in rounds],
                        "wall_s": [x["wall_s"] for x in rounds],
                        "errors": sum(len(x["errors"]) for x in rounds),
                        "token_sources": sorted({t for x in rounds for t in x["token_sources"]})}
        d = {k: v for k, v in d.items() if v not in (None, [], {})}
        if d:
            s[side] = d
    # CPU time is counted in jiffies (10 ms): only blocks of >= 1 s say anything
    foreign = [b["cpu_share"]["foreign"] for b in r["blocks"]
               if "cpu_share" in b and b.get("wall_s", 0) >= 1.0]
    s["noise"] = {"foreign_share_max": max(foreign, default=None),
                  "foreign_share_median": statistics.median(foreign) if foreign else None,
                  "blocks_over_limit": sum(f > QUIET_LIMIT for f in foreign)}
    r["summary"] = s
    r["table"] = table_rows(r, a)


def _ratio(x, y):
    return None if x is None or y in (None, 0) else x / y


def table_rows(r: dict, a) -> list[dict]:
    s = r["summary"]
    Z, L, B = s.get("zl", {}), s.get("llama", {}), s.get("base", {})
    rows = []

    def g(d, k, q):
        return (d.get(k) or {}).get(q)

    def add(metric, ours, theirs, unit, target, met, ratio="auto"):
        if ratio == "auto":
            ratio = _ratio(ours, theirs) if isinstance(theirs, (int, float)) else None
        rows.append({"metric": metric, "ours": ours, "theirs": theirs, "unit": unit,
                     "ratio": ratio, "target": target, "met": met})

    n_ld = a.load_streams
    for q in ("p50", "p99"):
        z, l_ = g(Z, "ping_idle", q), g(L, "ping_idle", q)
        add(f"PING {q}, idle", z, l_, "ms", "", None)
    for q, lim in (("p50", 1e-3), ("p99", 5e-3)):
        z, l_ = g(Z, "ping_load", q), g(L, "ping_load", q)
        rt = _ratio(z, l_)
        add(f"PING {q}, {n_ld} streams decoding", z, l_, "ms",
            f"≤ {lim * 1e3:g} ms and ratio ≤ 1.0",
            None if z is None or rt is None else (z <= lim and rt <= 1.0))
    for k, label in (("ttft_idle", "TTFT p50, idle (sequential)"),
                     ("ttft_load", f"TTFT p50, new request while {n_ld} streams decode")):
        z, l_ = g(Z, k, "p50"), g(L, k, "p50")
        rt = _ratio(z, l_)
        add(label, z, l_, "ms", "ratio ≤ 0.75", None if rt is None else rt <= 0.75)
    for k, label in (("ttft_idle", "TTFT p99, idle"), ("ttft_load", f"TTFT p99, {n_ld} streams decoding")):
        add(label, g(Z, k, "p99"), g(L, k, "p99"), "ms", "", None)
    sf = L.get("slot_free")
    theirs_c = ("n/a: no protocol cancel" + (
        f" (close → slot free p50 {sf['p50'] * 1e3:.1f} / p99 {sf['p99'] * 1e3:.1f} ms)" if sf else ""))
    add(f"CANCEL p50, {n_ld} streams decoding", g(Z, "cancel", "p50"), theirs_c, "ms", "", None)
    z = g(Z, "cancel", "p99")
    add(f"CANCEL p99, {n_ld} streams decoding", z, theirs_c, "ms", "≤ 5 ms",
        None if z is None else z <= 5e-3)
    for n in a.conc:
        z, l_ = g(Z, f"tok_s_{n}", "median"), g(L, f"tok_s_{n}", "median")
        rt = _ratio(z, l_)
        add(f"aggregate tok/s, {n} streams × {a.tokens} tok (median of {a.rounds})", z, l_,
            "tok/s", "ratio ≥ 1.5", None if rt is None else rt >= 1.5)
    f = r.get("flood")
    if f:
        lost = f.get("lost")
        add(f"datagrams lost, {f['rate']}/s × {f['duration_s']} s while {n_ld} streams decode "
            f"(of {f.get('sent_total', f['sent'])} sent)", lost, "n/a: no UDP path", "datagrams",
            "0", None if lost is None else lost <= 0, ratio=None)
        rb = f.get("rcvbuf_errors_delta")
        add("Udp RcvbufErrors delta (system-wide)", rb, "n/a", "", "0",
            None if rb is None else rb == 0, ratio=None)
    if B and r.get("baseline"):
        for n in a.conc:
            z, b = g(Z, f"base_tok_s_{n}", "median"), g(B, f"base_tok_s_{n}", "median")
            rt = _ratio(z, b)
            add(f"aggregate tok/s, {n} streams: this checkout vs baseline "
                f"{r['baseline']['git']} (theirs column = baseline)", z, b, "tok/s",
                "ratio ≥ 0.95", None if rt is None else rt >= 0.95)
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
    if "idle_answers" in Z or "idle_answers" in L:
        lines.append(f"- Greedy answers to the question: ours {Z.get('idle_answers')}, theirs "
                     f"{L.get('idle_answers')}.")
    if "ttft_idle_prompt_and_cached_tokens" in Z or "ttft_idle_prompt_and_cached_tokens" in L:
        lines.append(f"- Idle TTFT, (prompt tokens, of which reused from an earlier request's KV): "
                     f"ours {Z.get('ttft_idle_prompt_and_cached_tokens')}, theirs "
                     f"{L.get('ttft_idle_prompt_and_cached_tokens')} (the same question every time).")
    f = r.get("flood")
    if f:
        lines.append(f"- Flood: {f['sent']} datagrams at {f.get('achieved_rate', 0):.0f}/s "
                     f"({f['valid_planned']} signed PINGs, rest garbage) + SDK "
                     f"{f.get('sdk_datagrams_loadgen')} (load) / {f.get('sdk_datagrams_bench')} "
                     f"(bench); daemon counted {f.get('daemon_received')}; PONGs back "
                     f"{f['pongs_received']}; load streams active {f.get('load_active')}; "
                     f"Udp deltas {f['udp_snmp_delta']}.")
    if r.get("baseline"):
        b = r["baseline"]
        lines.append(f"- Baseline: {b['path']} at {b['git']} ({b['subject']}).")
    n = s["noise"]
    if n["foreign_share_max"] is not None:
        lines.append(f"- Noise: other processes took at most {n['foreign_share_max']:.0%} of the "
                     f"machine during a block (median {n['foreign_share_median']:.0%}; "
                     f"{n['blocks_over_limit']} blocks over "
                     f"{r['args'].get('quiet_limit', QUIET_LIMIT):.0%}). "
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    ap.add_argument("--flood-rate", type=int, default=5000)
    ap.add_argument("--flood-s", type=float, default=20.0, help="0 = no flood")
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
        a.rounds, a.tokens, a.pings, a.ttft, a.cancels, a.flood_s, a.max_wait = 1, 32, 20, 3, 3, 3.0, 0
    if a.load_slots <= a.load_streams:
        ap.error("--load-slots must exceed --load-streams (a probe needs a free slot)")
    a.pings_per_round = max(1, a.pings // a.rounds)
    a.ttft_per_round = max(1, a.ttft // a.rounds)
    a.cancel_per_round = max(1, a.cancels // a.rounds)
    r = Bench(a).run()
    print(render(r))
    print(f"\nJSON: {r['json_path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
