#!/usr/bin/env python
"""Legitimate service under a junk flood: zerolayerd's UDP and XDP ingress, and llama-server
under an HTTP flood of wrong-API-key requests at the same rates.

    sudo .venv/bin/python bench/bench_flood.py                       # the full matrix
    sudo .venv/bin/python bench/bench_flood.py --paths xdp --classes wrong_mac \\
        --sources spoofed --rates 100000                             # one row (~2 min)
    .venv/bin/python bench/bench_flood.py --render bench/results/flood-….json

Testbed (_flood_testbed.py): the server in NAME-srv, legitimate clients in NAME-cli, the sender
in NAME-fld, joined by a bridge; all removed at the end, also on error or Ctrl-C.

Junk (_flood_packets.py), sent by netsniff-ng's trafgen from a configuration the bench writes
out of real wire-format datagrams: malformed (bad magic / version / length, in turn), an
unknown key id, a stale timestamp (correctly signed), a well-formed INVOKE with a wrong MAC,
and replays of one valid INVOKE; each from the sender's one address or from spoofed sources
(10.203.0.0/16, rewritten per packet by trafgen). Rates: trafgen paced at each --rates value
(packets/s), and "max", the sender's ceiling. On veth the receiver's kernel work runs on the
sender's CPU, so the achieved rate is reported beside the asked one. llama-server gets wrk
with a wrong `Authorization: Bearer` key at the same request rates (TCP: one source only).

Per row, while the flood runs (after 1 s to settle):
- PING: --pings sequential probes from the client namespace, one datagram and one wait
  (--ping-wait-s) each: zerolayerd's `Client.probe` (the SDK's ping that counts every loss, no retry),
  llama-server's GET /health on a keep-alive connection; p50/p99 and how many got no answer;
- then --streams concurrent chat streams of --stream-tokens tokens: TTFT p50/p99, aggregate
  completion tok/s, and streams that needed a retry (the SDK re-sends an unanswered INVOKE)
  or failed;
- the server's CPU time over the window (/proc/PID/stat) as a share of one core;
- zerolayerd: the delta of every counter of its Prometheus metrics, among them the kernel's
  drops by reason (zerolayer_xdp_packets_total{reason}: whatever reasons the loaded program
  exposes), the AF_XDP ring's overflow drops, the namespace's UDP socket-buffer overflows
  (/proc/net/snmp), and the datagrams that reached user space
  (zerolayer_ingress_datagrams_total);
- the sender's own count and time (trafgen's, wrk's), and the packets the server's veth
  received per second over the window (its rx counter: the rate that arrived).
A row without a flood ("none") per path comes first. The server is pinned to --server-cpu
with one model thread, alone there, as on an isolated core; the sender to --sender-cpu at
nice 19, and the legitimate streams to --client-cpu (default: the sender's, where they run
before it). The PINGs run first, alone, from --ping-cpu (default: the server's, idle then), so
that they time the server and the path, not a pinger starved by the flood's kernel work: on
veth the kernel's receive work, an XDP drop included, runs on the sender's CPU.

Holds /tmp/zl-bench.lock like the other benches. JSON under bench/results/flood-*.json
(gitignored), a markdown table on stdout.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import http.client
import json
import os
import secrets
import shlex
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import _flood_packets as packets  # noqa: E402
import _flood_senders as senders  # noqa: E402
from _flood_testbed import (  # noqa: E402
    FLD_IF,
    FLD_V4,
    SRV_IF,
    SRV_V4,
    Testbed,
    flood_testbed,
    link_stats,
)
from _harness import (  # noqa: E402
    LLAMA_BIN,
    RESULTS,
    NativeLlamaServer,
    chat_body,
    git_head,
    http_get_timed,
    http_stream_chat,
    llama_server_that_serves,
    log,
    machine_info,
    sh,
    stats,
    take_lock,
    top_processes,
    zl_stream_chat,
)
from bench_dataplane import STREAM_OPTS, scrape, story  # noqa: E402
from bench_xdp import METRICS_PORT, PORT, Daemon, proc_cpu_s  # noqa: E402

from netns import in_netns  # noqa: E402  (tests/, put on the path by bench_xdp)

HTTP_PORT = 8080
PATHS = ("udp", "xdp", "llama")
SETTLE_S = 1.0


# ---------------------------------------------------------------------------- the servers

class ZlTarget:
    """zerolayerd with one ingress, its key, and its clients (run in the client namespace)."""

    def __init__(self, bed: Testbed, tmp: Path, ingress: str, cpu: int, extra: list[str]):
        self.bed = bed
        self.d = Daemon(bed.srv, tmp, ingress, busy=False, taskset=str(cpu),
                        extra=["--model-threads", "1", "--cpu-cpus", str(cpu), *extra])
        self.pid = self.d.proc.pid

    def counters(self) -> dict[str, float]:
        """The daemon's metrics and the server namespace's UDP counters (socket-buffer
        overflows are the UDP path's kernel drops)."""
        return in_netns(self.bed.srv, lambda: {**scrape(METRICS_PORT), **udp_counters()})

    def client(self):
        from zerolayer.client import Client
        return Client((SRV_V4, PORT), self.d.key_id, self.d.secret, timeout=30)

    def pings(self, n: int, wait_s: float) -> tuple[list[float], int]:
        from zerolayer.protocol.errors import ZerolayerError

        def run():
            c, rtts, lost = self.client(), [], 0
            for _ in range(n):
                try:
                    rtts.append(c.probe(wait_s)[0])
                except ZerolayerError:
                    lost += 1
            return rtts, lost
        return in_netns(self.bed.cli, run)

    def stream(self, i: int, tokens: int) -> dict:
        r = zl_stream_chat(self.client(), story(i), tokens)
        return {"ttft_s": r["ttft_s"], "tokens": r["usage"]["completion_tokens"],
                "retried": r["attempts"] > 1}

    def stop(self) -> None:
        self.d.stop()


class LlamaTarget:
    """llama.cpp's llama-server (built by bench/setup_llamacpp.sh) with an API key, on the
    server namespace's veth address, one thread, one slot per legitimate stream."""

    def __init__(self, bed: Testbed, tmp: Path, cpu: int, model: str, slots: int):
        self.bed = bed
        self.key = secrets.token_hex(16)
        self.s, self.fallback = llama_server_that_serves(
            lambda extra: NativeLlamaServer(
                str(LLAMA_BIN / "llama-server"), model, 1, slots, HTTP_PORT,
                tmp / "llama-server.log", extra=["--host", "0.0.0.0", "--api-key", self.key, *extra],
                prefix=["ip", "netns", "exec", bed.srv, "taskset", "-c", str(cpu)]),
            lambda srv: in_netns(bed.srv, srv.wait_ready))
        self.pid = self.s.pid

    def counters(self) -> dict[str, float]:
        return {}

    def pings(self, n: int, wait_s: float) -> tuple[list[float], int]:
        def run():
            conn, rtts, lost = None, [], 0
            for _ in range(n):
                for attempt in (0, 1):      # a connection the server closed: reconnect once
                    try:
                        if conn is None:
                            conn = http.client.HTTPConnection(SRV_V4, HTTP_PORT,
                                                              timeout=wait_s)
                            conn.connect()    # outside the timing, as the SDK's socket
                        rtts.append(http_get_timed(conn, "/health"))
                        break
                    except (OSError, http.client.HTTPException, RuntimeError):
                        conn.close() if conn else None
                        conn = None
                        if attempt:
                            lost += 1
            return rtts, lost
        return in_netns(self.bed.cli, run)

    def stream(self, i: int, tokens: int) -> dict:
        conn = http.client.HTTPConnection(SRV_V4, HTTP_PORT, timeout=60)
        conn.connect()
        try:
            r = http_stream_chat(conn, chat_body(story(i), tokens, extra=STREAM_OPTS),
                                 headers={"Authorization": f"Bearer {self.key}"})
        finally:
            conn.close()
        return {"ttft_s": r["ttft_s"], "tokens": (r["usage"] or {}).get("completion_tokens", 0),
                "retried": False}

    def stop(self) -> None:
        self.s.stop()


def streams(target, bed: Testbed, n: int, tokens: int) -> dict:
    """n concurrent streams from the client namespace (threads made there stay in it)."""
    def run():
        out: list[dict] = []
        start = threading.Barrier(n)

        def one(i: int) -> None:
            start.wait()
            try:
                r = target.stream(i, tokens)
            except Exception as e:  # noqa: BLE001  (a failed stream is a result)
                r = {"error": repr(e)}
            r["end"] = time.perf_counter()
            out.append(r)
        t0 = time.perf_counter()
        ths = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        return t0, out
    t0, out = in_netns(bed.cli, run)
    ok = [r for r in out if "error" not in r]
    wall = max((r["end"] for r in out), default=t0) - t0
    return {"ttft_ms": stats([r["ttft_s"] * 1e3 for r in ok if r["ttft_s"] is not None]),
            "tok_s": sum(r["tokens"] for r in ok) / wall if wall > 0 else None,
            "tokens": sum(r["tokens"] for r in ok), "wall_s": wall,
            "retried": sum(r["retried"] for r in ok), "failed": len(out) - len(ok),
            "errors": [r["error"] for r in out if "error" in r][:3]}


# ---------------------------------------------------------------------------- one row

def udp_counters() -> dict[str, float]:
    """The calling thread's namespace's Udp: counters (/proc/thread-self: /proc/self/net
    would show the namespace of the process's first thread)."""
    with open("/proc/thread-self/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    return {f"{UDP_SNMP}{k}": float(v) for k, v in zip(rows[0][1:], rows[1][1:])}


UDP_SNMP = "kernel_udp:"
KERNEL_SERIES = {"zerolayer_xsk_rx_dropped_total": "xsk_ring_full",
                 f"{UDP_SNMP}RcvbufErrors": "udp_rcvbuf_full", f"{UDP_SNMP}InErrors": "udp_in_errors"}


def kernel_reasons(delta: dict[str, float]) -> dict[str, float]:
    """What the kernel did with the datagrams, by reason: every reason of
    zerolayer_xdp_packets_total{reason} the loaded XDP program reports (the daemon exports
    whichever its stats map holds), the AF_XDP ring's overflow drops, and the UDP socket's."""
    out: dict[str, float] = {}
    for k, v in delta.items():
        if k.startswith("zerolayer_xdp_packets_total{") and 'reason="' in k:
            reason = k.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = out.get(reason, 0) + v
        elif k in KERNEL_SERIES:
            out[KERNEL_SERIES[k]] = v
    return out


def server_rx_packets(bed: Testbed) -> int:
    return link_stats(bed.srv, SRV_IF)["rx"]["packets"]


def on_cpu(cpu: int, fn):
    """fn() with this thread (and the threads it starts, as in_netns's) on `cpu`; -1: as is."""
    if cpu < 0:
        return fn()
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        return fn()
    finally:
        os.sched_setaffinity(0, old)


def measure(target, bed: Testbed, a) -> dict:
    rx0 = server_rx_packets(bed)
    c0, cpu0, t0 = target.counters(), proc_cpu_s(target.pid), time.monotonic()
    rtts, lost = on_cpu(a.ping_cpu, lambda: target.pings(a.pings, a.ping_wait_s))
    st = streams(target, bed, a.streams, a.stream_tokens)
    cpu1, t1 = proc_cpu_s(target.pid), time.monotonic()
    rx1 = server_rx_packets(bed)
    time.sleep(0.5)                 # zerolayerd copies the kernel's counters every 0.25 s
    c1 = target.counters()
    delta = {k: v - c0.get(k, 0.0) for k, v in c1.items()
             if (k.split("{")[0].endswith("_total") or k.startswith(UDP_SNMP))
             and v - c0.get(k, 0.0)}
    return {"ping_ms": stats([x * 1e3 for x in rtts]), "pings": a.pings, "pings_lost": lost,
            "streams": st, "server_cpu_share": (cpu1 - cpu0) / (t1 - t0), "window_s": t1 - t0,
            "server_rx_pps": (rx1 - rx0) / (t1 - t0),
            "kernel_by_reason": kernel_reasons(delta),
            "user_space_datagrams": delta.get("zerolayer_ingress_datagrams_total"),
            "counters": delta}


def start_sender(path: str, cls: str, spoof: bool, rate: str, target, bed: Testbed,
                 tmp: Path, a) -> senders.Sender:
    tag = f"{path}-{cls}-{'spoofed' if spoof else 'one'}-{rate}"
    if path == "llama":
        return senders.wrk(bed.fld, a.sender_cpu, f"http://{SRV_V4}:{HTTP_PORT}/v1/chat/completions",
                           "wrong-" + target.key, rate, a.flood_max_s, tmp, tmp / f"{tag}.log")
    ep = packets.Endpoints(bed.fld_mac, bed.srv_mac, socket.inet_aton(FLD_V4),
                           socket.inet_aton(SRV_V4), 40000, PORT)
    cfg = tmp / f"{tag}.cfg"
    # built now: the replayed INVOKE and the wrong-MAC one carry a fresh timestamp
    cfg.write_text(packets.trafgen_config(cls, ep, target.d.key_id, target.d.secret, spoof))
    return senders.trafgen(bed.fld, FLD_IF, a.sender_cpu, cfg, rate, a.flood_max_s,
                           tmp / f"{tag}.log")


def flood_row(path: str, cls: str, spoof: bool, rate: str, target, bed: Testbed, tmp: Path,
              a) -> dict:
    sender = start_sender(path, cls, spoof, rate, target, bed, tmp, a)
    try:
        time.sleep(SETTLE_S)
        if sender.proc.poll() is not None:
            raise RuntimeError(f"the sender exited at once:\n{sender.log.read_text()[-2000:]}")
        m = measure(target, bed, a)
        m["sender_outlived_window"] = sender.proc.poll() is None
    finally:
        out = sender.stop()
    res = senders.parse_wrk(out) if path == "llama" else senders.parse_trafgen(out)
    m["sender"] = {"sent": res.sent, "seconds": res.seconds, "rate": res.rate,
                   "output_tail": out[-600:]}
    return m


def run_path(path: str, bed: Testbed, tmp: Path, a, rows: list[dict]) -> None:
    log(f"{path}: starting the server")
    target = (LlamaTarget(bed, tmp, a.server_cpu, a.model, a.streams) if path == "llama"
              else ZlTarget(bed, tmp, path, a.server_cpu, a.zl_extra))
    try:
        target.pings(3, 2.0)                               # warm: first-call paths
        # warm: each stream's prompt once, so the no-flood row does not pay the prompt caches'
        # first fill that the rows after it skip
        streams(target, bed, a.streams, 4)
        plan = [("none", False, "0")]
        if path == "llama":
            plan += [("http_wrong_key", False, r) for r in a.rates]
        else:
            plan += [(c, s == "spoofed", r) for c in a.classes for s in a.sources
                     for r in a.rates]
        for cls, spoof, rate in plan:
            log(f"{path}: {cls}, {'spoofed' if spoof else 'one source'}, rate {rate}")
            if cls == "none":
                m = measure(target, bed, a)
            else:
                m = flood_row(path, cls, spoof, rate, target, bed, tmp, a)
            m.update(path=path, cls=cls, sources="spoofed" if spoof else "one", rate=rate)
            if path == "llama":
                m["server_flags_added"] = target.fallback     # --no-repack after a crash
            rows.append(m)
            log("  " + render_row(m))
    finally:
        target.stop()


# ---------------------------------------------------------------------------- output

def _n(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:.0f}"


def _ms(s: dict | None, key: str) -> str:
    return "–" if not s else f"{s[key]:.2f}"


def table_cells(m: dict) -> list[str]:
    st, snd = m["streams"], m.get("sender") or {}
    kern = ", ".join(f"{k} {_n(v)}" for k, v in sorted(m["kernel_by_reason"].items(),
                                                       key=lambda kv: -kv[1]))
    return [m["path"], m["cls"], m["sources"], "–" if m["rate"] == "0" else _n(
                float(m["rate"])) if m["rate"] != "max" else "max",
            _n(snd.get("rate")) if snd else "–", _n(m["server_rx_pps"]),
            f"{_ms(m['ping_ms'], 'p50')} / {_ms(m['ping_ms'], 'p99')}",
            f"{m['pings_lost']}/{m['pings']}",
            f"{_ms(st['ttft_ms'], 'p50')} / {_ms(st['ttft_ms'], 'p99')}",
            "–" if st["tok_s"] is None else f"{st['tok_s']:.1f}",
            f"{st['retried']}/{st['failed']}",
            f"{m['server_cpu_share']:.0%}",
            kern or "–", _n(m["user_space_datagrams"])]


HEADER = ["path", "junk", "sources", "asked pps", "sent pps", "server NIC rx pps",
          "PING p50 / p99 ms",
          "PINGs lost", "TTFT p50 / p99 ms", "tok/s", "streams retried / failed",
          "server CPU", "kernel counters by reason", "datagrams in user space"]


def render_row(m: dict) -> str:
    return " | ".join(f"{h}: {c}" for h, c in zip(HEADER, table_cells(m)))


def render(res: dict) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(table_cells(m)) + " |" for m in res["rows"]]
    meta = res["meta"]
    lines += ["", f"{meta['machine'].get('cpu_model')}, L3 {meta['machine'].get('l3_cache')}, "
              f"{meta['machine'].get('nproc')} CPUs; git {meta['git']}; {meta['date']}; "
              f"loadavg before {meta['loadavg_before']}, after {meta.get('loadavg_after')}"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", default=",".join(PATHS), help="of udp, xdp, llama")
    ap.add_argument("--classes", default=",".join(packets.CLASSES))
    ap.add_argument("--sources", default="one,spoofed", help="of one, spoofed")
    ap.add_argument("--rates", default="10000,100000,max",
                    help="packets (requests) per second; max = the sender's ceiling")
    ap.add_argument("--pings", type=int, default=100)
    ap.add_argument("--ping-wait-s", type=float, default=0.5,
                    help="a PING with no answer by then counts as lost")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--stream-tokens", type=int, default=32)
    ap.add_argument("--flood-max-s", type=float, default=120,
                    help="time bound of each flood (it is stopped when its row is measured)")
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--sender-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=None,
                    help="the legitimate clients' CPU (default: the sender's, where they run "
                         "before it: its nice is 19); -1: not pinned")
    ap.add_argument("--ping-cpu", type=int, default=None,
                    help="the pinger's CPU (default: the server's, idle while the PINGs run); "
                         "-1: not pinned")
    ap.add_argument("--model", help="GGUF for llama-server (default: the bundled model)")
    ap.add_argument("--zl-extra", default="", help="more zerolayerd flags, one string")
    ap.add_argument("--lock-wait", type=float, default=1800)
    ap.add_argument("--out")
    ap.add_argument("--render", help="print the table of an earlier run's JSON and exit")
    a = ap.parse_args(argv)
    a.paths = [p for p in a.paths.split(",") if p]
    a.classes = [c for c in a.classes.split(",") if c]
    a.sources = [s for s in a.sources.split(",") if s]
    a.rates = [r for r in a.rates.split(",") if r]
    a.zl_extra = shlex.split(a.zl_extra)
    if a.client_cpu is None:
        a.client_cpu = a.sender_cpu
    if a.ping_cpu is None:
        a.ping_cpu = a.server_cpu
    for v, allowed, what in ((a.paths, PATHS, "path"), (a.classes, packets.CLASSES, "class"),
                             (a.sources, ("one", "spoofed"), "sources")):
        bad = set(v) - set(allowed)
        if bad:
            ap.error(f"unknown {what} {sorted(bad)}; choose from {allowed}")
    for r in a.rates:
        if r != "max" and not r.isdigit():
            ap.error(f"rate {r!r} is neither a number nor max")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.render:
        print(render(json.loads(Path(a.render).read_text())))
        return 0
    if os.geteuid() != 0:
        print("needs root (namespaces, XDP, raw packets)", file=sys.stderr)
        return 2
    if "llama" in a.paths and not (LLAMA_BIN / "llama-server").exists():
        raise SystemExit(f"{LLAMA_BIN}/llama-server missing: run bash bench/setup_flood.sh")
    if a.model is None:
        from zerolayer.gpu.gguf_loader import default_model_path
        a.model = str(default_model_path())
    # SIGTERM unwinds like Ctrl-C, so the senders, servers and namespaces go in `finally`
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    lock, waited = take_lock(a.lock_wait, " ".join(sys.argv))
    res: dict = {"rows": [], "meta": {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(x) for x in sys.argv), "machine": machine_info(),
        "git": git_head(),
        "git_dirty": sh(f"git -C {REPO} status --porcelain -- bench daemon bpf"),
        "trafgen": sh("trafgen -v | head -1"), "wrk": sh("wrk -v 2>&1 | head -1"),
        "loadavg_before": os.getloadavg(), "top_before": top_processes(5),
        "lock_waited_s": round(waited, 1), "args": {k: v for k, v in vars(a).items()}}}
    if a.client_cpu >= 0:
        # (after machine_info, which counts the CPUs this process may use) this thread's
        # affinity, inherited by every client thread started after it
        os.sched_setaffinity(0, {a.client_cpu})
    tmp = Path(tempfile.mkdtemp(prefix="zl-bench-flood-"))
    try:
        with flood_testbed() as bed:
            res["meta"]["testbed"] = bed.name
            for path in a.paths:
                run_path(path, bed, tmp, a, res["rows"])
    finally:
        lock.close()
        res["meta"]["loadavg_after"] = os.getloadavg()
        res["meta"]["top_after"] = top_processes(5)
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = Path(a.out) if a.out else RESULTS / f"flood-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(json.dumps(res, indent=1, default=str))
        log(f"results: {out}")
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
