#!/usr/bin/env python
"""PING round trips while 8 streams decode, from a plain blocking client in its own process,
against zerolayerd daemons that differ in one setting, interleaved. See bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import default_model, pct  # noqa: E402
from bench_dataplane import Child, LoadGen, ZlSide, start_zl  # noqa: E402

# ------------------------------------------------------------------ child: the pinger


def pinger_main(spec: dict) -> int:
    """Plain PINGs; with spec['sdk'], every other one is zerolayer.client's Client.ping() timed
    around the call (bench_dataplane's ZlSide.ping), so both methods see the same load."""
    from zerolayer.client import Client
    from zerolayer.client.retry_policy import authenticate
    from zerolayer.protocol.wire import Mac, MsgType, PongFrame, encode_control
    secret = bytes.fromhex(spec["secret"])
    mac = Mac(secret)
    client = Client(("127.0.0.1", spec["port"]), spec["key_id"], secret, timeout=10)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", spec["port"]))
    s.settimeout(2.0)
    rtts: list[float] = []
    sdk_rtts: list[float] = []
    lost = bad = 0
    for i in range(spec["pings"]):
        if spec.get("sdk") and i % 2:
            t0 = time.perf_counter()
            client.ping()
            sdk_rtts.append(time.perf_counter() - t0)
            time.sleep(spec["gap_ms"] / 1e3)
            continue
        rid = secrets.token_bytes(16)
        dg = encode_control(MsgType.PING, spec["key_id"], mac, rid, time.time_ns() // 1000,
                            secrets.token_bytes(32))
        t0 = time.perf_counter()
        s.send(dg)
        try:
            reply = s.recv(2048)
        except TimeoutError:
            lost += 1
            continue
        rtt = time.perf_counter() - t0
        if isinstance(authenticate(reply, mac, rid), PongFrame):
            rtts.append(rtt)
        else:
            bad += 1
        time.sleep(spec["gap_ms"] / 1e3)
    print(json.dumps({"rtts": rtts, "sdk_rtts": sdk_rtts, "lost": lost, "bad": bad}), flush=True)
    return 0


# ------------------------------------------------------------------ the parent


def one(a, name: str, extra: list[str], model: str, tmp: Path) -> dict:
    # a word env:NAME=VALUE among a variant's flags goes into the daemon's environment
    env = dict(w[4:].split("=", 1) for w in extra if w.startswith("env:"))
    flags = [w for w in extra if not w.startswith("env:")]
    zl = start_zl(model, a.threads, tmp / f"{name.replace(' ', '_')}-{time.monotonic_ns()}",
                  ["--engine-max-running", "16", *flags], env or None)
    try:
        side = ZlSide(zl)
        load = LoadGen(side, a.streams, a.tokens, 300)
        try:
            load.wait_ready()
            pinger = Child(__file__, "--pinger", {**side.loadgen_spec, "pings": a.pings, "gap_ms": a.gap_ms,
                                                   "sdk": a.sdk_too})
            pings = json.loads(pinger.line(60 + a.pings * (2 + a.gap_ms / 1e3)))
            pinger.proc.wait(10)
            summary = load.stop()
        finally:
            load.kill()
        said = [ln.strip() for ln in zl.log_path.read_text().splitlines() if "GIL switch interval" in ln]
        rtts, sdk = pings["rtts"], pings["sdk_rtts"]
        return {"variant": name, "flags": extra, "n": len(rtts), "lost": pings["lost"],
                "bad": pings["bad"], "p50_ms": pct(rtts, 50) * 1e3, "p99_ms": pct(rtts, 99) * 1e3,
                "mean_ms": statistics.fmean(rtts) * 1e3, "max_ms": max(rtts) * 1e3,
                "chunks_s": summary["chunks_s"], "load": summary, "daemon_said": said[:1],
                "loadavg": os.getloadavg(), **({"sdk_n": len(sdk), "sdk_p50_ms": pct(sdk, 50) * 1e3,
                                                "sdk_p99_ms": pct(sdk, 99) * 1e3} if sdk else {})}
    finally:
        zl.stop()


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--pinger":
        return pinger_main(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", required=True,
                    help="'NAME=daemon flags', two or more, run in turn each round; a flag "
                         "env:NAME=VALUE sets the daemon's environment instead")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pings", type=int, default=300)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="")
    ap.add_argument("--sdk-too", action="store_true",
                    help="every other PING is Client.ping() timed around the call instead")
    a = ap.parse_args()
    variants = [(v.split("=", 1)[0], shlex.split(v.split("=", 1)[1] if "=" in v else ""))
                for v in a.variant]
    model = a.model or default_model()
    rows = []
    with tempfile.TemporaryDirectory(prefix="zl-probe-ping-") as tmp:
        for rnd in range(a.rounds):
            for name, extra in variants:
                r = one(a, name, extra, model, Path(tmp))
                r["round"] = rnd
                rows.append(r)
                print(json.dumps(r), flush=True)
    print("\n| variant | round | n | lost | p50 ms | p99 ms | max ms | 8-stream chunks/s | load avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['round']} | {r['n']} | {r['lost']} | {r['p50_ms']:.3f} | "
              f"{r['p99_ms']:.3f} | {r['max_ms']:.2f} | {r['chunks_s']:.1f} | "
              f"{r['loadavg'][0]:.2f} |")
        if "sdk_n" in r:
            print(f"| {r['variant']}, Client.ping() | {r['round']} | {r['sdk_n']} | - | "
                  f"{r['sdk_p50_ms']:.3f} | {r['sdk_p99_ms']:.3f} | - | - | - |")
    print("\nmedians over rounds:")
    for name, _ in variants:
        mine = [r for r in rows if r["variant"] == name]
        print(f"- {name}: p50 {statistics.median(r['p50_ms'] for r in mine):.3f} ms, "
              f"p99 {statistics.median(r['p99_ms'] for r in mine):.3f} ms, "
              f"chunks/s {statistics.median(r['chunks_s'] for r in mine):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
