#!/usr/bin/env python
"""PING round trips, TTFT and a garbage flood over zerolayerd's XDP and UDP paths, beside
their no-protocol floors and an HTTP /health, on the veth testbed; method: bench/README.md.

    sudo .venv/bin/python bench/bench_xdp.py [--quick] [--only ping|ttft|flood] [--out PATH]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = REPO / ".venv" / "bin" / "python"
BENCH_PY = REPO / ".venv-bench" / "bin" / "python"
PORT, METRICS_PORT, HTTP_PORT = 7433, 9433, 8080
QUESTION = "What is the capital of France?"
WARM = 300
FLOOD_INTERVAL_S = 0.5  # one request every 0.5 s: the daemon is mostly idle between them
# PING phase: every server pinned to CPU 0, the client thread to CPU 1. Unpinned, the
# scheduler often wakes the client on the CPU where the busy-polling server spins (the reply's
# softirq runs there), and a round trip then costs 2x, in runs that differ only by chance.
SERVER_CPU, CLIENT_CPU = 0, 1

sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from _harness import (  # noqa: E402
    CLK_TCK,
    ZeroLayerDaemon,
    cpu_model,
    http_get_timed,
    log,
    proc_jiffies,
    results_path,
    run_meta,
    stats,
    take_lock,
    terminate,
    zl_stream_chat,
)

from netns import SRV_IF, SRV_V4, in_netns, xdp_testbed  # noqa: E402  (the tests' testbed)


def proc_cpu_s(pid: int) -> float:
    return proc_jiffies(pid) / CLK_TCK


class Daemon(ZeroLayerDaemon):
    """zerolayerd in namespace `ns` on PORT of every address (ns None: on 127.0.0.1, a free
    port), ready when it returns; with `cpu`, pinned there (taskset, --cpu-cpus) with one
    model thread. `kw`: ZeroLayerDaemon's metrics_port (default METRICS_PORT) and entry."""

    def __init__(self, ns: str | None, tmp: Path, ingress: str, busy: bool, cpu: int | None = None,
                 extra: list[str] = (), model: str | None = None, **kw):
        self.ns = ns
        pin = [] if cpu is None else ["taskset", "-c", str(cpu)]
        where = ["0.0.0.0", "--network-interface", SRV_IF] if ns else ["127.0.0.1"]
        super().__init__(str(PY), model, None if cpu is None else 1, None, tmp,
                         tmp / f"zerolayerd-{ingress}-{uuid.uuid4().hex[:6]}.log",
                         ["--network-host", *where, "--network-ingress", ingress,
                          "--network-busy-poll", str(busy).lower(),
                          *([] if cpu is None else ["--cpu-cpus", str(cpu)]), *extra],
                         prefix=[*(["ip", "netns", "exec", ns] if ns else []), *pin],
                         port=PORT if ns else None,
                         metrics_port=kw.pop("metrics_port", METRICS_PORT), **kw)
        try:
            self.wait_ready(300)
        except BaseException:
            self.stop()
            raise

    def counts(self) -> dict[str, float]:
        """The XDP program's packets by reason, the AF_XDP ring's drops, the datagrams read."""
        text = in_netns(self.ns, lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).read().decode())
        out = {}
        for k, _, v in (line.rpartition(" ") for line in text.splitlines()):
            if k.startswith("zerolayer_xdp_packets_total{"):
                out[k.split('reason="')[1].split('"')[0]] = float(v)
            elif k in ("zerolayer_xsk_rx_dropped_total", "zerolayer_ingress_datagrams_total"):
                out[k] = float(v)
        return out


# each path's floor in Python, no protocol: `ring` the AF_XDP rings alone, else a
# busy-polling UDP socket alone; ends after 120 s if not stopped
ECHO = r"""
import socket, sys, time
end = time.monotonic() + 120
if sys.argv[1] == "ring":
    from zerolayer.daemon.carriers.xdp_io import XdpIO, XdpSettings
    io = XdpIO.open(XdpSettings(sys.argv[2], (int(sys.argv[3]),)))
    print("ready", flush=True)
    while time.monotonic() < end:
        b = io.recv_batch()
        if b:
            io.send_batch(b)
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", int(sys.argv[3])))
    s.setblocking(False)
    print("ready", flush=True)
    while time.monotonic() < end:
        try:
            d, a = s.recvfrom(4096)
        except BlockingIOError:
            continue
        s.sendto(d, a)
"""

HEALTH_APP = r"""
from fastapi import FastAPI
app = FastAPI()

@app.get("/health")
def health():
    return {"status": "ok"}
"""

FLOOD = r"""
import signal, socket, sys, time
from zerolayer.daemon.carriers.udp_io import BatchedUDP
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
s.connect((sys.argv[1], int(sys.argv[2])))
u = BatchedUDP(s, batch=64)
# a valid-looking header (magic corrupted): what a scanner or a broken client sends
dg = b"XXXX" + bytes([1, 4]) + (80).to_bytes(2, "little") + (112).to_bytes(2, "little") + bytes(102)
items = [(dg, (sys.argv[1], int(sys.argv[2])))] * 64
t0 = time.monotonic()
end = t0 + float(sys.argv[3])
n = 0
while not stop and time.monotonic() < end:
    n += u.send_batch(items)
print(f"sent {n} {time.monotonic() - t0:.3f}", flush=True)
"""


def start_proc(ns: str, cmd: list[str], ready: str | None, tmp: Path, name: str):
    path = tmp / f"{name}.log"
    p = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=open(path, "w"),
                         stderr=subprocess.STDOUT, cwd=tmp)
    end = time.monotonic() + 60
    while ready is not None and ready not in path.read_text():
        if p.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"{name} failed:\n{path.read_text()}")
        time.sleep(0.05)
    return p


# ---------------------------------------------------------------------------- clients

def signed_pings(key_id: int, secret: bytes, n: int, xdp_tag: bool = False) -> list[bytes]:
    from zerolayer.protocol import wire
    now = time.time_ns() // 1000
    return [wire.encode_control(wire.MsgType.PING, key_id, secret, secrets.token_bytes(16), now,
                                secrets.token_bytes(32), xdp_tag=xdp_tag) for _ in range(n)]


def udp_rtts(ns: str, datagrams: list[bytes], spin: bool = False) -> list[float]:
    """Round trips (µs) of `datagrams` to SRV_V4, one at a time, less the first WARM. spin:
    the client polls its socket instead of sleeping in recv(). On a VM a vCPU that slept costs
    an IPI and a VM exit to wake (~15 µs here), and it sleeps only when the reply takes more
    than a few µs: so the sleeping client adds a step to every server slower than that."""
    def run():
        os.sched_setaffinity(0, {CLIENT_CPU})  # this thread only
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect((SRV_V4, PORT))
        s.settimeout(2.0)
        if spin:
            s.setblocking(False)
        out = []
        for d in datagrams:
            t = time.perf_counter_ns()
            s.send(d)
            while spin:
                try:
                    s.recv(4096)
                    break
                except BlockingIOError:
                    if time.perf_counter_ns() - t > 2_000_000_000:
                        raise TimeoutError("no reply in 2 s") from None
            else:
                s.recv(4096)
            out.append((time.perf_counter_ns() - t) / 1e3)
        s.close()
        return out[WARM:]
    return in_netns(ns, run)


def http_rtts(ns: str, host: str, n: int, warm: int) -> list[float]:
    """Round trips (µs) of GET /health on one keep-alive connection, less the first `warm`."""
    def run():
        os.sched_setaffinity(0, {CLIENT_CPU})
        c = http.client.HTTPConnection(host, HTTP_PORT, timeout=5)
        out = [http_get_timed(c, "/health") * 1e6 for _ in range(n + warm)]
        c.close()
        return out[warm:]
    return in_netns(ns, run)


def ttfts(ns: str, d: Daemon, n: int, interval: float = 0.0) -> list[float]:
    """TTFT (ms) of n chat questions, one after another; with `interval`, each starts
    `interval` seconds after the previous one started (a fixed request rate)."""
    def run():
        c, out, start = d.client(30, (SRV_V4, PORT)), [], time.perf_counter()
        for i in range(n):
            if interval:
                time.sleep(max(0.0, start + i * interval - time.perf_counter()))
            if (ttft := zl_stream_chat(c, QUESTION, 16)["ttft_s"]) is not None:
                out.append(ttft * 1e3)
        return out
    return in_netns(ns, run)


# ---------------------------------------------------------------------------- the phases

def ping_side(side: str, bed: tuple[str, str], tmp: Path, a) -> list[float]:
    srv, cli = bed
    on_server = ["taskset", "-c", str(SERVER_CPU)]
    if side in ("xdp", "udp"):
        d = Daemon(srv, tmp, side, busy=True, cpu=SERVER_CPU)
        try:
            return udp_rtts(cli, signed_pings(d.key_id, d.secret, a.pings + WARM), a.spin_client)
        finally:
            d.stop()
    if side in ("ring", "udp_echo"):
        p = start_proc(srv, [*on_server, str(PY), "-c", ECHO, side, SRV_IF, str(PORT)], "ready",
                       tmp, f"{side}-echo")
        try:
            return udp_rtts(cli, signed_pings(1, b"k" * 32, a.pings + WARM), a.spin_client)
        finally:
            terminate(p, 20)
    p = start_proc(srv, [*on_server, str(BENCH_PY), "-m", "uvicorn", "health_app:app", "--host",
                         "0.0.0.0", "--port", str(HTTP_PORT), "--log-level", "warning",
                         "--no-access-log"], None, tmp, "uvicorn")
    try:
        end = time.monotonic() + 30
        while True:
            try:
                http_rtts(srv, "127.0.0.1", 1, 0)
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)
        return http_rtts(*((cli, SRV_V4) if side == "http_veth" else (srv, "127.0.0.1")),
                         a.pings, WARM)
    finally:
        terminate(p, 20)


def flood_phase(bed: tuple[str, str], tmp: Path, ingress: str, n_req: int) -> dict:
    srv, cli = bed
    d = Daemon(srv, tmp, ingress, busy=False, cpu=0)
    out = {}
    try:
        ttfts(cli, d, 3)  # warm: prefix cache, first-request paths
        for label in ("quiet", "flood"):
            gen = None
            if label == "flood":
                gen = subprocess.Popen(["ip", "netns", "exec", cli, "taskset", "-c", "1", str(PY),
                                        "-c", FLOOD, SRV_V4, str(PORT), "600"],
                                       stdout=subprocess.PIPE, text=True)
                time.sleep(1.0)
            before, c0, t0 = d.counts(), proc_cpu_s(d.proc.pid), time.monotonic()
            tt = ttfts(cli, d, n_req, interval=FLOOD_INTERVAL_S)
            c1, t1 = proc_cpu_s(d.proc.pid), time.monotonic()
            time.sleep(0.5)  # the daemon copies kernel counters every 0.25 s
            delta = {k: v - before.get(k, 0) for k, v in d.counts().items()}
            sent = None
            if gen is not None:
                terminate(gen, 10)              # FLOOD prints its count on SIGTERM
                if outp := gen.stdout.read():
                    sent = int(outp.split()[1]) / float(outp.split()[2])
            r = out[label] = {"ttft_ms": tt, "ttft_p50_ms": stats(tt)["p50"],
                              "daemon_cpu_s": c1 - c0, "wall_s": t1 - t0,
                              "daemon_cpu_share": (c1 - c0) / (t1 - t0),
                              "counters": {k: v for k, v in delta.items() if v}, "flood_pps": sent}
            log(f"  {ingress} {label}: TTFT p50 {r['ttft_p50_ms']:.1f} ms, daemon CPU "
                f"{r['daemon_cpu_share']:.1%} over {t1 - t0:.1f} s, counters {r['counters']}, "
                f"flood {sent or 0:.0f} datagrams/s")
        return out
    finally:
        d.stop()


LABELS = {"xdp": "zerolayerd over AF_XDP", "udp": "zerolayerd over UDP",
          "ring": "AF_XDP rings alone (echo, no protocol)",
          "udp_echo": "UDP socket alone (echo, no protocol)",
          "http_veth": "uvicorn+FastAPI GET /health over veth",
          "http_lo": "uvicorn+FastAPI GET /health over loopback"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pings", type=int, default=3000)
    ap.add_argument("--ttft", type=int, default=30)
    ap.add_argument("--flood-requests", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["ping", "ttft", "flood"], help="run one part")
    ap.add_argument("--spin-client", action="store_true",
                    help="PING clients poll their socket instead of sleeping in recv()")
    ap.add_argument("--sides", default=",".join(LABELS),
                    help="PING sides to run, comma-separated (ratios need xdp, udp, http_veth)")
    ap.add_argument("--lock-wait", type=float, default=3600,
                    help="wait this long for the benches' lock (/tmp/zl-bench.lock)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.quick:
        a.pings, a.ttft, a.flood_requests = 500, 6, 6
    if os.geteuid() != 0:
        print("needs root (namespaces, XDP)", file=sys.stderr)
        return 2
    run = {part: a.only in (None, part) for part in ("ping", "ttft", "flood")}
    sides = a.sides.split(",") if run["ping"] else []
    lock, lock_wait = take_lock(a.lock_wait, " ".join(sys.argv))
    tmp = Path(tempfile.mkdtemp(prefix="zl-bench-xdp-"))
    (tmp / "health_app.py").write_text(HEALTH_APP)
    samples: dict[str, list[float]] = {s: [] for s in sides}
    tt: dict[str, list[float]] = {"xdp": [], "udp": []} if run["ttft"] else {}
    f: dict[str, dict] = {}
    try:
        if any(x.startswith("http") for x in sides):
            # the HTTP peer runs in its own environment, built on first use
            subprocess.run(["bash", str(REPO / "scripts" / "bench-venv.sh"), "http"], check=True)
        with xdp_testbed() as bed:
            for side in sides + sides[::-1]:
                log(f"ping: {side}")
                samples[side] += ping_side(side, bed, tmp, a)
            for side in ("xdp", "udp", "udp", "xdp") if tt else ():
                log(f"ttft: {side}")
                d = Daemon(bed[0], tmp, side, busy=True)
                try:
                    ttfts(bed[1], d, 3)  # warm: the prefix cache holds the question after one run
                    tt[side] += ttfts(bed[1], d, a.ttft // 2)
                finally:
                    d.stop()
            for side in ("xdp", "udp") if run["flood"] else ():
                log(f"flood: {side}")
                f[side] = flood_phase(bed, tmp, side, a.flood_requests)
    finally:
        lock.close()

    p = {s: stats(v) for s, v in samples.items()}
    t = {s: stats(v) for s, v in tt.items()}
    r = {f"ping_p50_{num}_over_{den}": p[num]["p50"] / p[den]["p50"]
         for num, den in (("xdp", "udp"), ("xdp", "ring"), ("udp", "udp_echo"), ("xdp", "http_veth"))
         if num in p and den in p}
    if t:
        r["ttft_p50_xdp_over_udp"] = t["xdp"]["p50"] / t["udp"]["p50"]
    for s, v in f.items():
        r[f"flood_{s}_ttft_rise"] = v["flood"]["ttft_p50_ms"] / v["quiet"]["ttft_p50_ms"]
        r[f"flood_{s}_cpu_rise"] = (v["flood"]["daemon_cpu_share"]
                                    / max(v["quiet"]["daemon_cpu_share"], 1e-9))
    res = {"ping_us": p, "ttft_ms": t, "flood": f, "ratios": r, "meta": run_meta(
        machine=platform.platform(), cpus=os.cpu_count(), cpu_model=cpu_model(),
        kernel=platform.release(), quick=a.quick, only=a.only, spin_client=a.spin_client,
        lock_waited_s=round(lock_wait, 1), loadavg=os.getloadavg())}
    out = results_path(a.out, "xdp")
    out.write_text(json.dumps(res, indent=1))
    print(f"\nresults: {out}\n")
    if p:
        print("| PING round trip | p50 µs | p99 µs |\n|---|---|---|")
    for s, lab in LABELS.items():
        if s in p:
            print(f"| {lab} | {p[s]['p50']:.1f} | {p[s]['p99']:.1f} |")
    if t:
        print(f"\nTTFT p50: AF_XDP {t['xdp']['p50']:.1f} ms, UDP {t['udp']['p50']:.1f} ms")
    for s, v in f.items():
        q, fl = v["quiet"], v["flood"]
        print(f"flood {s}: TTFT p50 {q['ttft_p50_ms']:.1f} -> {fl['ttft_p50_ms']:.1f} ms, daemon CPU "
              f"{q['daemon_cpu_share']:.1%} -> {fl['daemon_cpu_share']:.1%}, counters under flood "
              f"{fl['counters']}, generator {fl['flood_pps'] or 0:.0f} datagrams/s")
    print("\nratios:", json.dumps({k: round(v, 3) for k, v in r.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
