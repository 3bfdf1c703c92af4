#!/usr/bin/env python
"""A fleet of three nodes under load, one SIGKILLed: what completed, was lost or re-ran, and
TTFT before, during and after; needs root. See bench/README.md ("bench_fleet.py").
"""
from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
import _harness as H  # noqa: E402

from daemon_proc import DaemonProc  # noqa: E402  (the tests' daemon and testbed helpers)
from netns import fleet_testbed, in_netns  # noqa: E402
from zerolayer.client import ChatMessage, Client  # noqa: E402
from zerolayer.client.fleet import rendezvous_order  # noqa: E402

QUESTION = [ChatMessage("user", "What is the capital of France?")]


def run(a: argparse.Namespace) -> tuple[float, list[dict]]:
    """(when node 3 was killed, in seconds since the load started; every request)."""
    secret = secrets.token_bytes(32)
    samples: list[dict] = []
    with fleet_testbed(3) as (cli, names, addrs), tempfile.TemporaryDirectory() as tmp:
        nodes = []
        for i, (ns, ip) in enumerate(zip(names, addrs)):
            (Path(tmp) / f"n{i}").mkdir()
            nodes.append(DaemonProc(Path(tmp) / f"n{i}", netns=ns, host=ip, port=7433,
                                    secret=secret, wait_ready=False))
        try:
            for n in nodes:
                n.wait_ready()
            node_addrs = [n.addr for n in nodes]
            client = Client(node_addrs, nodes[0].key_id, secret, timeout=60)
            for _ in range(3):                      # warm every node's prefix cache
                for n in nodes:
                    in_netns(cli, lambda n=n: Client(n.addr, n.key_id, secret).invoke(
                        messages=QUESTION, max_tokens=a.tokens))
            t0 = time.monotonic()
            kill_at = t0 + a.before
            end = kill_at + a.during + a.after
            inflight: dict[bytes, float] = {}     # request id -> when it was sent

            def loop() -> None:
                while time.monotonic() < end:
                    s = {"start": time.monotonic() - t0}
                    rid = secrets.token_bytes(16)
                    inflight[rid] = time.monotonic()
                    try:
                        r = client.invoke(messages=QUESTION, max_tokens=a.tokens, request_id=rid)
                        s.update(ok=True, ttft_s=r.ttft_s, restarts=r.restarts, node=r.node,
                                 attempts=r.attempts)
                    except Exception as e:  # noqa: BLE001 - a lost request, counted
                        s.update(ok=False, error=repr(e))
                    inflight.pop(rid, None)
                    s["end"] = time.monotonic() - t0
                    samples.append(s)

            ts = H.spawn(a.workers, lambda _: in_netns(cli, loop))
            time.sleep(max(0.0, kill_at - time.monotonic()))
            # Kill node 3 while it is serving: at the first moment after --before when a
            # request whose first node it is has been running for 0.3 s.
            while not any(rendezvous_order(r, node_addrs)[0] == node_addrs[2]
                          and time.monotonic() - t > 0.3 for r, t in list(inflight.items())):
                time.sleep(0.005)
            nodes[2].proc.kill()
            killed = time.monotonic() - t0
            for t in ts:
                t.join()
        finally:
            for n in nodes:
                n.stop()
    return killed, samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--before", type=float, default=20.0)
    ap.add_argument("--during", type=float, default=10.0)
    ap.add_argument("--after", type=float, default=20.0)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    with H.bench_lock(" ".join(sys.argv), 3600):
        k, samples = run(a)
    rows = {}
    for name, (lo, hi) in {"before": (0, k), "during": (k, k + a.during),
                           "after": (k + a.during, 1e9)}.items():
        ss = [s for s in samples if lo <= s["start"] < hi]
        ok = [s for s in ss if s["ok"]]
        ttft = H.stats([s["ttft_s"] * 1e3 for s in ok if s["ttft_s"]]) or {}
        rows[name] = {"started": len(ss), "completed": len(ok), "lost": len(ss) - len(ok),
                      "rerun": sum(1 for s in ok if s["restarts"]),
                      "ttft_p50_ms": ttft.get("p50"), "ttft_p99_ms": ttft.get("p99")}
    meta = H.run_meta()
    out = H.results_path(a.out, "fleet")
    out.write_text(json.dumps({**meta, "args": vars(a), "kill_at_s": k, "machine": H.machine_info(),
                               "phases": rows, "samples": samples}, indent=1))
    print(f"### Fleet: 3 nodes, node 3 SIGKILLed at {k:.1f} s ({meta['date']})\n")
    print(H.md_table(["phase", "started", "completed", "lost", "re-run on another node",
                    "TTFT p50 (ms)", "TTFT p99 (ms)"],
                   [[name, *list(r.values())[:4], H.fmt(r["ttft_p50_ms"]), H.fmt(r["ttft_p99_ms"])]
                    for name, r in rows.items()]))
    print(f"\nCommand: `{meta['command']}`; JSON: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
