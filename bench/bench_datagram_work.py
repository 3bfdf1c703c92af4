#!/usr/bin/env python
"""The daemon's own CPU work per PING on a running zerolayerd, over UDP and over AF_XDP: its
I/O loop's phases timed per datagram, and the I/O thread's CPU per PING; see bench/README.md.

    sudo .venv/bin/python bench/bench_datagram_work.py [--carriers udp,xdp] [--pings 3000]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import cpu_model, results_path, run_meta, take_lock  # noqa: E402
from bench_xdp import CLIENT_CPU, PY, SERVER_CPU, Daemon, signed_pings  # noqa: E402

from netns import SRV_V4, xdp_testbed  # noqa: E402  (tests/, put on the path by bench_xdp)


def serve(stats_path: str, argv: list[str]) -> int:
    """Run zerolayerd with its I/O phases timed; SIGUSR1 writes a snapshot to stats_path."""
    from zerolayer.daemon import carriers, front, server

    clock = time.thread_time_ns
    tot = dict.fromkeys(("recv_ns", "recv_datagrams", "feed_ns", "feed_datagrams", "flush_ns",
                         "flush_frames"), 0)
    pairs = 20000   # the cost of one clock pair, subtracted from every timed span
    t0 = clock()
    for _ in range(pairs):
        clock()
        clock()
    pair_ns = (clock() - t0) / pairs
    recv, receive, flush = carriers.Carriers.recv, front.Front.receive, server.Daemon._flush

    def timed_recv(self, turn, busy):
        t = clock()
        out = recv(self, turn, busy)
        if out[0]:
            tot["recv_ns"] += clock() - t - pair_ns
            tot["recv_datagrams"] += len(out[0])
        return out

    def timed_receive(self, data, addr, now):
        t = clock()
        out = receive(self, data, addr, now)
        tot["feed_ns"] += clock() - t - pair_ns
        tot["feed_datagrams"] += 1
        return out

    def timed_flush(self):
        n, t = len(self.out), clock()
        flush(self)
        if n:
            tot["flush_ns"] += clock() - t - pair_ns
            tot["flush_frames"] += n

    carriers.Carriers.recv, front.Front.receive = timed_recv, timed_receive
    server.Daemon._flush = timed_flush

    def snapshot(*_):
        with open(f"/proc/self/task/{os.getpid()}/schedstat") as f:
            io_ns = int(f.read().split()[0])
        Path(stats_path).write_text(json.dumps({**tot, "io_thread_ns": io_ns, "pair_ns": pair_ns}))
    signal.signal(signal.SIGUSR1, snapshot)
    return server.main(argv)


def pinger(spec: str) -> int:
    """--pinger mode: the client, in its own process (its CPU is not the daemon's)."""
    a = json.loads(spec)
    datagrams = signed_pings(a["key_id"], bytes.fromhex(a["secret"]), a["n"], xdp_tag=True)
    os.sched_setaffinity(0, {CLIENT_CPU})
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((a["host"], a["port"]))
    s.settimeout(2.0)
    out, lost = [], 0
    for d in datagrams:
        t = time.perf_counter_ns()
        s.send(d)
        try:
            s.recv(4096)
            out.append((time.perf_counter_ns() - t) / 1e3)
        except TimeoutError:
            lost += 1
        end = t + a["gap_us"] * 1000
        while time.perf_counter_ns() < end:
            time.sleep(max(0.0, (end - time.perf_counter_ns()) / 1e9 - 50e-6))
    if lost:
        print(f"lost {lost}", file=sys.stderr)
    print(json.dumps(out))
    return 0


def block(carrier: str, a, tmp: Path, ns: str | None) -> dict:
    stats = tmp / f"stats-{uuid.uuid4().hex[:6]}.json"
    host = SRV_V4 if ns else "127.0.0.1"
    netns = ["ip", "netns", "exec", ns] if ns else []
    d = Daemon(ns, tmp, carrier, busy=False, cpu=SERVER_CPU, extra=a.zl_extra.split(),
               model=a.model or None, metrics_port=0, entry=[__file__, "--serve", str(stats), "--"])

    def ping(n: int) -> list[float]:
        spec = json.dumps({"host": host, "port": d.port, "key_id": d.key_id,
                           "secret": d.secret.hex(), "n": n, "gap_us": a.gap_us})
        out = subprocess.run([*netns, str(PY), __file__, "--pinger", spec], check=True,
                             capture_output=True, text=True, timeout=600)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def snapshot() -> dict:
        stats.unlink(missing_ok=True)
        os.kill(d.proc.pid, signal.SIGUSR1)
        end = time.monotonic() + 10
        while not stats.exists() or not stats.read_text():
            if time.monotonic() > end:
                raise RuntimeError("no snapshot from the daemon")
            time.sleep(0.01)
        time.sleep(0.01)
        return json.loads(stats.read_text())
    try:
        ping(a.warm)
        s0, t0 = snapshot(), time.monotonic()
        rtts = ping(a.pings)
        window = time.monotonic() - t0
        s1 = snapshot()
        time.sleep(window)   # the idle baseline: housekeeping, the metrics, the same length
        s2 = snapshot()
    finally:
        d.stop()
    diff = {k: s1[k] - s0[k] for k in s0 if k != "pair_ns"}
    n, idle = diff["feed_datagrams"], s2["io_thread_ns"] - s1["io_thread_ns"]
    return {
        "carrier": carrier, "pings": n, "replies": len(rtts),
        "recv_us": diff["recv_ns"] / 1e3 / max(1, diff["recv_datagrams"]),
        "feed_us": diff["feed_ns"] / 1e3 / max(1, n),
        "send_us": diff["flush_ns"] / 1e3 / max(1, diff["flush_frames"]),
        "io_thread_us": (diff["io_thread_ns"] - idle) / 1e3 / max(1, n),
        "idle_io_thread_ms_per_s": idle / 1e6 / window,
        "rtt_p50_us": statistics.median(rtts) if rtts else None,
        "pair_ns": s0["pair_ns"], "loadavg": os.getloadavg()[0],
    }


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        return serve(sys.argv[2], sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:])
    if len(sys.argv) > 2 and sys.argv[1] == "--pinger":
        return pinger(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--carriers", default="udp,xdp")
    ap.add_argument("--pings", type=int, default=3000)
    ap.add_argument("--warm", type=int, default=300)
    ap.add_argument("--gap-us", type=float, default=1000.0)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--model", default="")
    ap.add_argument("--zl-extra", default="")
    ap.add_argument("--lock-wait", type=float, default=3600)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    carriers = a.carriers.split(",")
    if "xdp" in carriers and os.geteuid() != 0:
        print("the xdp carrier needs root (namespaces, XDP)", file=sys.stderr)
        return 2
    lock, _ = take_lock(a.lock_wait, " ".join(sys.argv))
    tmp = Path(tempfile.mkdtemp(prefix="zl-dgwork-"))
    rows: list[dict] = []
    try:
        with xdp_testbed() if "xdp" in carriers else contextlib.nullcontext((None, None)) as bed:
            for b in range(a.blocks):
                for c in carriers if b % 2 == 0 else carriers[::-1]:
                    rows.append(block(c, a, tmp, bed[0] if c == "xdp" else None))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        lock.close()
    res = {"rows": rows, "meta": run_meta(kernel=platform.release(), cpu_model=cpu_model())}
    out = results_path(a.out or None, "datagram-work")
    out.write_text(json.dumps(res, indent=1))
    print(f"results: {out} (git {res['meta']['git']})")
    print("| carrier | PINGs | recv µs | receive to reply queued µs | send µs | I/O thread CPU "
          "per PING µs | RTT p50 µs | load avg |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['carrier']} | {r['pings']} | {r['recv_us']:.2f} | {r['feed_us']:.2f} | "
              f"{r['send_us']:.2f} | {r['io_thread_us']:.1f} | {r['rtt_p50_us']:.1f} | "
              f"{r['loadavg']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
