#!/usr/bin/env python
"""The daemon's own CPU work per PING, on a running zerolayerd, over UDP and over AF_XDP.

    flock-free: the script takes /tmp/zl-bench.lock itself.
    sudo .venv/bin/python bench/bench_datagram_work.py [--carriers udp,xdp] [--pings 3000]

A real daemon (the bundled model unless --model, one model thread, I/O and model on CPU 0, not
busy-polling so that its CPU time is its work) is started through this script's --serve mode,
which wraps three of the I/O loop's phases with the thread's CPU clock
(CLOCK_THREAD_CPUTIME_ID; the wrappers' own cost is measured at start and subtracted):
- recv: `Carriers.recv` calls that returned datagrams (recvmmsg, or the AF_XDP RX ring and
  frame parsing), per datagram;
- receive to reply queued: `Front.receive` (ingress parse, key, XDP tag, HMAC, timestamp
  and nonce, the PONG built and signed, returned for the send list), per datagram;
- send: `Daemon._flush` (sendto / sendmmsg, or the reply frame written into a UMEM TX frame
  and the kick), per datagram.
Besides, the I/O thread's whole CPU time (/proc/PID/task/PID/schedstat, ns) over the PINGs
minus the same thread's CPU over an idle window as long, per PING: everything the daemon's
I/O thread spends for one PING, the select() wake-up and the loop's turn included.

The client: a blocking socket in its own process, on CPU 1, pre-signed PINGs carrying the XDP
tag (as the SDK sends them), one at a time, --gap-us apart; --warm PINGs first, not counted.
UDP over loopback; AF_XDP on the veth testbed (scripts/xdp-testbed.sh, root). Each carrier in
--blocks blocks, alternating (A B B A). Prints a markdown table and writes JSON under
bench/results/.
"""
from __future__ import annotations

import argparse
import datetime as _dt
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
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import REPO, RESULTS, ZeroLayerDaemon, cpu_model, git_head, take_lock  # noqa: E402

PY = REPO / ".venv" / "bin" / "python"
TESTBED = REPO / "scripts" / "xdp-testbed.sh"
SRV_IF, SRV_V4 = "zl-s", "10.201.0.1"
SERVER_CPU, CLIENT_CPU = 0, 1


# ------------------------------------------------------------------ --serve: the timed daemon

def serve(stats_path: str, argv: list[str]) -> int:
    """Run zerolayerd with its I/O phases timed; SIGUSR1 writes a snapshot to stats_path."""
    from zerolayer.daemon import carriers, front, server

    clock = time.thread_time_ns
    tot = {"recv_ns": 0, "recv_datagrams": 0, "feed_ns": 0, "feed_datagrams": 0,
           "flush_ns": 0, "flush_frames": 0}
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
        n = len(self.out)
        t = clock()
        flush(self)
        if n:
            tot["flush_ns"] += clock() - t - pair_ns
            tot["flush_frames"] += n

    carriers.Carriers.recv = timed_recv
    front.Front.receive = timed_receive
    server.Daemon._flush = timed_flush

    # Every collector pause, any thread: (generation, ms, monotonic end), for the tails.
    import gc
    pauses: list[tuple[int, float, float]] = []
    started = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            end = time.perf_counter()
            pauses.append((info["generation"], (end - started[0]) * 1e3, end))
    gc.callbacks.append(on_gc)

    def snapshot(*_):
        with open(f"/proc/self/task/{os.getpid()}/schedstat") as f:
            io_ns = int(f.read().split()[0])
        Path(stats_path).write_text(json.dumps({**tot, "io_thread_ns": io_ns,
                                                "pair_ns": pair_ns, "gc_pauses": pauses,
                                                "gc_objects": len(gc.get_objects()),
                                                "gc_counts": gc.get_count(),
                                                "gc_frozen": gc.get_freeze_count()}))
    signal.signal(signal.SIGUSR1, snapshot)
    return server.main(argv)


# ------------------------------------------------------------------ the client

def tagged_pings(key_id: int, secret: bytes, n: int) -> list[bytes]:
    from zerolayer.protocol import wire
    from zerolayer.protocol.wire import MsgType
    now = time.time_ns() // 1000
    return [wire.encode_control(MsgType.PING, key_id, secret, secrets.token_bytes(16), now,
                                secrets.token_bytes(32), xdp_tag=True) for _ in range(n)]


def pinger(host: str, port: int, datagrams: list[bytes], gap_us: float) -> list[float]:
    os.sched_setaffinity(0, {CLIENT_CPU})
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, port))
    s.settimeout(2.0)
    out = []
    lost = 0
    for d in datagrams:
        t = time.perf_counter_ns()
        s.send(d)
        try:
            s.recv(4096)
            out.append((time.perf_counter_ns() - t) / 1e3)
        except TimeoutError:
            lost += 1
        end = t + gap_us * 1000
        while time.perf_counter_ns() < end:
            time.sleep(max(0.0, (end - time.perf_counter_ns()) / 1e9 - 50e-6))
    s.close()
    if lost:
        print(f"lost {lost}", file=sys.stderr)
    return out


def run_pinger(ns: str | None, host: str, port: int, key_id: int, secret: bytes, n: int,
               gap_us: float) -> list[float]:
    """The pinger in its own process (its CPU is not the daemon's), in namespace ns."""
    spec = json.dumps({"host": host, "port": port, "key_id": key_id, "secret": secret.hex(),
                       "n": n, "gap_us": gap_us})
    cmd = [str(PY), __file__, "--pinger", spec]
    if ns:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def pinger_main(spec: str) -> int:
    s = json.loads(spec)
    pings = tagged_pings(s["key_id"], bytes.fromhex(s["secret"]), s["n"])
    print(json.dumps(pinger(s["host"], s["port"], pings, s["gap_us"])))
    return 0


# ------------------------------------------------------------------ one block

def snapshot(proc: subprocess.Popen, path: Path) -> dict:
    path.unlink(missing_ok=True)
    os.kill(proc.pid, signal.SIGUSR1)
    end = time.monotonic() + 10
    while not path.exists() or not path.read_text():
        if time.monotonic() > end:
            raise RuntimeError("no snapshot from the daemon")
        time.sleep(0.01)
    time.sleep(0.01)
    return json.loads(path.read_text())


def block(carrier: str, a, tmp: Path, ns: str | None) -> dict:
    stats = tmp / f"stats-{uuid.uuid4().hex[:6]}.json"
    host = SRV_V4 if ns else "127.0.0.1"
    d = ZeroLayerDaemon(
        str(PY), a.model or None, 1, None, tmp, tmp / f"zerolayerd-{carrier}-{uuid.uuid4().hex[:6]}.log",
        ["--network-host", "0.0.0.0" if ns else host, "--network-ingress", carrier,
         "--network-busy-poll", "false", "--cpu-cpus", str(SERVER_CPU),
         *(["--network-interface", SRV_IF] if ns else []), *a.zl_extra.split()],
        prefix=[*(["ip", "netns", "exec", ns] if ns else []), "taskset", "-c", str(SERVER_CPU)],
        port=7433 if ns else None, metrics_port=0, entry=[__file__, "--serve", str(stats), "--"])
    proc, port, key_id, secret = d.proc, d.port, d.key_id, d.secret
    try:
        d.wait_ready(300)
        run_pinger(ns, host, port, key_id, secret, a.warm, a.gap_us)
        s0 = snapshot(proc, stats)
        t0 = time.monotonic()
        rtts = run_pinger(ns, host, port, key_id, secret, a.pings, a.gap_us)
        window = time.monotonic() - t0
        s1 = snapshot(proc, stats)
        time.sleep(window)   # the idle baseline: housekeeping, the metrics, the same length
        s2 = snapshot(proc, stats)
    finally:
        d.stop()
    n = s1["feed_datagrams"] - s0["feed_datagrams"]
    idle = s2["io_thread_ns"] - s1["io_thread_ns"]
    return {
        "carrier": carrier, "pings": n, "replies": len(rtts),
        "recv_us": (s1["recv_ns"] - s0["recv_ns"]) / 1e3 / max(1, s1["recv_datagrams"]
                                                               - s0["recv_datagrams"]),
        "feed_us": (s1["feed_ns"] - s0["feed_ns"]) / 1e3 / max(1, n),
        "send_us": (s1["flush_ns"] - s0["flush_ns"]) / 1e3 / max(1, s1["flush_frames"]
                                                                 - s0["flush_frames"]),
        "io_thread_us": (s1["io_thread_ns"] - s0["io_thread_ns"] - idle) / 1e3 / max(1, n),
        "idle_io_thread_ms_per_s": idle / 1e6 / window,
        "rtt_p50_us": statistics.median(rtts) if rtts else None,
        "pair_ns": s0["pair_ns"], "loadavg": os.getloadavg()[0],
    }


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        return serve(sys.argv[2], sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:])
    if len(sys.argv) > 2 and sys.argv[1] == "--pinger":
        return pinger_main(sys.argv[2])
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
    name = f"zlw{uuid.uuid4().hex[:6]}"
    rows: list[dict] = []
    try:
        if "xdp" in carriers:
            subprocess.run(["bash", str(TESTBED), "up", name], check=True,
                           stdout=subprocess.DEVNULL)
        order = [c for b in range(a.blocks) for c in (carriers if b % 2 == 0 else carriers[::-1])]
        for c in order:
            r = block(c, a, tmp, f"{name}-srv" if c == "xdp" else None)
            print(json.dumps(r), file=sys.stderr, flush=True)
            rows.append(r)
    finally:
        if "xdp" in carriers:
            subprocess.run(["bash", str(TESTBED), "down", name], check=False)
        lock.close()
    res = {"rows": rows, "meta": {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "git": git_head(),
        "command": " ".join(shlex.quote(x) for x in sys.argv), "kernel": platform.release(),
        "cpu_model": cpu_model()}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(a.out) if a.out else RESULTS / f"datagram-work-{time.strftime('%Y%m%d-%H%M%S')}.json"
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
