#!/usr/bin/env python
"""Same-host carriers side by side: shared-memory rings vs UDP loopback, one daemon, one run.

    .venv/bin/python bench/bench_shm.py [--pings 2000] [--ttft 50] [--busy-poll-us 50] [--out PATH]

One zerolayerd (UDP on 127.0.0.1 and [shm] socket in a temp dir) serves both carriers; the
same SDK (zerolayer.client.Client) is used for each, so the difference is the carrier alone:
the same signed datagrams, HMAC checks, nonce cache and result cache on the daemon's side.

1. PING round trip: Client.ping() timed around the call (signed PING → signed PONG, no
   model), UDP and shm alternated sample by sample so drift hits both alike; p50, p99, and
   the ratio shm/UDP. With --busy-poll-us N > 0 a third column: the shm client spinning on
   its ring for up to N µs before it sleeps on the doorbell (saves the wake-up, costs CPU).
2. TTFT of the chat question "What is the capital of France?" (greedy, --ttft-tokens, run
   to completion so the daemon is idle before the next one), alternated likewise: just
   before the call → first non-empty chunk; medians and ratio.

Holds /tmp/zl-bench.lock (exclusive) like the other benchmarks. Results: JSON under
bench/results/ (gitignored) with every sample, and a markdown table on stdout.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from zerolayer.client import ChatMessage, Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    LOCK_PATH,
    RESULTS,
    ZeroLayerDaemon,
    bench_lock,
    log,
    machine_info,
    pct,
)

QUESTION = "What is the capital of France?"
WARM_PINGS = 200  # untimed PINGs per carrier before the measurement


def ping_us(c: Client) -> float:
    t0 = time.perf_counter()
    c.ping()
    return (time.perf_counter() - t0) * 1e6


def ttft_ms(c: Client, max_tokens: int) -> float:
    t0 = time.perf_counter()
    first = None
    with c.stream(messages=[ChatMessage("user", QUESTION)], max_tokens=max_tokens) as s:
        for piece in s:
            if piece and first is None:
                first = time.perf_counter()
    assert first is not None, "no text"
    return (first - t0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pings", type=int, default=2000, help="PINGs per carrier")
    ap.add_argument("--ttft", type=int, default=50, help="TTFT requests per carrier")
    ap.add_argument("--ttft-tokens", type=int, default=16)
    ap.add_argument("--busy-poll-us", type=int, default=0,
                    help="also measure an shm client spinning this long before sleeping")
    ap.add_argument("--daemon-arg", action="append", default=[],
                    help="extra zerolayerd flag (repeatable), e.g. --daemon-arg=--cpu-io-cpu=2")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    with bench_lock(" ".join(sys.argv)) as lock_wait:
        return measure(a, lock_wait)


def measure(a, lock_wait: float) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="zl-bench-shm-"))
    shm_path = str(tmp / "shm.sock")
    d = ZeroLayerDaemon(sys.executable, None, None, None, tmp, tmp / "zerolayerd.log",
                        extra=["--shm-socket", shm_path, "--shm-mode", "0600",
                               *(arg for x in a.daemon_arg for arg in x.split("=", 1))])
    r: dict = {"bench": "shm", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "command": sys.argv, "args": vars(a), "server": d.cmd,
               "lock": {"path": LOCK_PATH, "waited_s": round(lock_wait, 1)},
               "machine": machine_info()}
    try:
        d.wait_ready(600)
        clients = {"udp": d.client(), "shm": d.client(addr=f"shm://{shm_path}")}
        if a.busy_poll_us:
            clients["shm_busy"] = d.client(addr=f"shm://{shm_path}?busy_poll_us={a.busy_poll_us}")
        names = list(clients)
        log(f"warming: {WARM_PINGS} pings each, 2 questions each")
        for _ in range(WARM_PINGS):
            for n in names:
                ping_us(clients[n])
        for n in names:
            for _ in range(2):
                ttft_ms(clients[n], a.ttft_tokens)
        log(f"PING: {a.pings} per carrier, alternated")
        pings: dict[str, list[float]] = {n: [] for n in names}
        for i in range(a.pings):
            order = names if i % 2 == 0 else names[::-1]
            for n in order:
                pings[n].append(ping_us(clients[n]))
        log(f"TTFT: {a.ttft} per carrier, alternated")
        ttfts: dict[str, list[float]] = {n: [] for n in names}
        for i in range(a.ttft):
            order = names if i % 2 == 0 else names[::-1]
            for n in order:
                ttfts[n].append(ttft_ms(clients[n], a.ttft_tokens))
        for c in clients.values():
            c.close()
    finally:
        rc = d.stop()
        r["server_rc"] = rc
        r["server_log_tail"] = "".join(d.log_path.read_text().splitlines(True)[-20:])
    r["ping_us"] = {n: {"p50": pct(v, 50), "p99": pct(v, 99), "samples": v}
                    for n, v in pings.items()}
    r["ttft_ms"] = {n: {"median": statistics.median(v), "samples": v} for n, v in ttfts.items()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(a.out) if a.out else RESULTS / f"shm-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(r, indent=1))
    p, t = r["ping_us"], r["ttft_ms"]
    print("| metric | UDP loopback | shm | shm/UDP |" + (" shm busy-poll | busy/UDP |"
                                                        if "shm_busy" in p else ""))
    print("|---|---|---|---|" + ("---|---|" if "shm_busy" in p else ""))
    rows = [("PING p50 (µs)", p, "p50"), ("PING p99 (µs)", p, "p99"),
            (f"TTFT median, {a.ttft_tokens}-token chat (ms)", t, "median")]
    for label, src, k in rows:
        line = (f"| {label} | {src['udp'][k]:.1f} | {src['shm'][k]:.1f} | "
                f"{src['shm'][k] / src['udp'][k]:.2f} |")
        if "shm_busy" in src:
            line += f" {src['shm_busy'][k]:.1f} | {src['shm_busy'][k] / src['udp'][k]:.2f} |"
        print(line)
    print(f"\nresults: {out}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
