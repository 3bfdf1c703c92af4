#!/usr/bin/env python
"""Same-host carriers side by side, one daemon, one run: shared-memory rings vs UDP loopback,
PING round trip and chat TTFT; see bench/README.md ("bench_shm.py").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from zerolayer.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

QUESTION = "What is the capital of France?"
WARM_PINGS = 200  # untimed PINGs per carrier before the measurement


def ping_us(c: Client) -> float:
    t0 = time.perf_counter()
    c.ping()
    return (time.perf_counter() - t0) * 1e6


def ttft_ms(c: Client, max_tokens: int) -> float:
    ttft = H.zl_stream_chat(c, QUESTION, max_tokens)["ttft_s"]
    assert ttft is not None, "no text"
    return ttft * 1e3


def alternated(clients: dict[str, Client], n: int, fn) -> dict[str, list[float]]:
    """n samples of fn(client) per carrier, the order of the carriers reversed every other."""
    out: dict[str, list[float]] = {k: [] for k in clients}
    for i in range(n):
        for k in list(clients)[::1 if i % 2 == 0 else -1]:
            out[k].append(fn(clients[k]))
    return out


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
    with H.bench_lock(" ".join(sys.argv)) as lock_wait:
        tmp = Path(tempfile.mkdtemp(prefix="zl-bench-shm-"))
        shm = f"shm://{tmp / 'shm.sock'}"
        d = H.ZeroLayerDaemon(sys.executable, None, None, None, tmp, tmp / "zerolayerd.log",
                            extra=["--shm-socket", str(tmp / "shm.sock"), "--shm-mode", "0600",
                                   *(arg for x in a.daemon_arg for arg in x.split("=", 1))])
        r: dict = {"bench": "shm", **H.run_meta(), "args": vars(a), "server": d.cmd,
                   "lock": {"path": H.LOCK_PATH, "waited_s": round(lock_wait, 1)},
                   "machine": H.machine_info()}
        try:
            d.wait_ready(600)
            clients = {"udp": d.client(), "shm": d.client(addr=shm)}
            if a.busy_poll_us:
                clients["shm_busy"] = d.client(addr=f"{shm}?busy_poll_us={a.busy_poll_us}")
            H.log(f"warming: {WARM_PINGS} pings each, 2 questions each")
            alternated(clients, WARM_PINGS, ping_us)
            alternated(clients, 2, lambda c: ttft_ms(c, a.ttft_tokens))
            H.log(f"PING: {a.pings} per carrier, alternated")
            pings = alternated(clients, a.pings, ping_us)
            H.log(f"TTFT: {a.ttft} per carrier, alternated")
            ttfts = alternated(clients, a.ttft, lambda c: ttft_ms(c, a.ttft_tokens))
            for c in clients.values():
                c.close()
        finally:
            rc = r["server_rc"] = d.stop()
            r["server_log_tail"] = "".join(d.log_path.read_text().splitlines(True)[-20:])
    r["ping_us"] = {n: {"p50": H.pct(v, 50), "p99": H.pct(v, 99), "samples": v} for n, v in pings.items()}
    r["ttft_ms"] = {n: {"median": statistics.median(v), "samples": v} for n, v in ttfts.items()}
    out = H.results_path(a.out, "shm")
    out.write_text(json.dumps(r, indent=1))
    p, t = r["ping_us"], r["ttft_ms"]
    cols = [n for n in ("shm", "shm_busy") if n in p]
    head = ["metric", "UDP loopback", "shm", "shm/UDP", "shm busy-poll", "busy/UDP"]
    print(H.md_table(head[:2 + 2 * len(cols)], [
        [label, f"{src['udp'][k]:.1f}",
         *(x for n in cols for x in (f"{src[n][k]:.1f}", f"{src[n][k] / src['udp'][k]:.2f}"))]
        for label, src, k in (("PING p50 (µs)", p, "p50"), ("PING p99 (µs)", p, "p99"),
                              (f"TTFT median, {a.ttft_tokens}-token chat (ms)", t, "median"))]))
    print(f"\nresults: {out}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
