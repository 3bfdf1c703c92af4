#!/usr/bin/env python
"""Memory soak: zerolayerd under mixed valid and hostile traffic; is its RSS flat?

    .venv/bin/python bench/soak.py [--duration-s 600] [--warmup-s 180] [--rate 4000]
                                   [--overload-x 10] [--calibrate-s 30]

Why: a UDP fuzz once took the daemon from 350 to 824 MB, and an overload kept it
growing. Every buffer now has a bound (docs/OPERATIONS.md "Memory bounds"); this checks the
sum of them holds in practice. A load generator (a separate process, so its threads never
hold the sampler's GIL) keeps, for the whole run:
- valid work: --clients SDK clients in a loop, each a short chat (max_tokens 16); every 5th
  repeats an earlier request id (served from the result cache), every 7th is cancelled after
  its first chunk;
- hostile datagrams at --rate per second, in a fixed rotation: random bytes; request-shaped
  random bytes; unknown key; forged tag; stale timestamp; a captured PING replayed; and,
  four times as often each, the kinds that make the daemon keep something: signed fresh
  PINGs (each fills the nonce cache), signed INVOKEs whose prompt, once tokenized, leaves
  no room for their max_tokens (CONTEXT_OVERFLOW from the engine, stored under a fresh
  request id: fills the result cache), the first fragment only of a
  two-fragment INVOKE (holds a reassembly slot until it times out); every 4000th, a chat of
  4,097 messages (838 datagrams, PAYLOAD_TOO_LARGE);
- overload relative to this machine (bench/_overload.py): before the load, 16 clients back
  to back for --calibrate-s measure the requests per second the daemon sustains here; the
  load then offers --overload-x times that (10 by default), open loop, each admitted request
  kept alive until it ends. A fixed rate would overload a fast host and not a slow one; this
  fills the wait queue (max_running + max_waiting) on either, so the OVERLOADED path and the
  memory of a full queue are part of every run.
The daemon runs with the default bounds, except that retention is shortened so the run
reaches steady state within the warm-up: `--security-max-skew-s 30` (nonces kept 60 s) and
`--cache-ttl-s 60` (finished results kept 60 s). Every --sample-s the sampler reads the
daemon's VmRSS from /proc and its zerolayer_memory_bytes{buffer} gauges.

Verdict: after the warm-up, RSS stays within ±10 % of its value at the end of the warm-up
(max and min over the rest of the run), and, with the overload on, the wait queue was full
at least once (zerolayer_overloaded_total{bound="wait_queue"} > 0): a soak that never
filled it did not test what it says. Output: a markdown table (one row per minute) on
stdout, a PNG plot of RSS and each buffer over time, and a JSON file with every sample,
under bench/results/ (gitignored) unless --out is given. Holds /tmp/zl-bench.lock; traffic
goes to 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import random
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    RESULTS,
    ZeroLayerDaemon,
    default_model,
    git_head,
    log,
    machine_info,
    take_lock,
)
from _overload import OpenLoop, measure_capacity  # noqa: E402

CALIBRATION_CLIENTS = 16  # the daemon's default max_running: every batch slot busy
TOPICS = ["the sea", "a lighthouse", "bread", "a violin", "the moon", "a fox", "rain", "glass"]


# ---- the load generator (runs in its own process: --loadgen) ----------------------------

def _hostile_datagrams(addr, key_id: int, secret: bytes):
    """An endless rotation of hostile datagrams, each kind built fresh where it must be."""
    from zerolayer.protocol import wire
    from zerolayer.protocol.wire import ChatMessage, MsgType, PayloadKind, SamplingParams

    def now_us() -> int:
        return time.time_ns() // 1000

    captured = wire.encode_control(MsgType.PING, key_id, secret, secrets.token_bytes(16),
                                   now_us(), secrets.token_bytes(32))
    # signed, valid, and refused by the engine without running the model: the prompt's ~25
    # tokens are known only once tokenized, past the 1 + max_tokens that ingress can rule
    # out (a larger max_tokens would be refused there, before any cache entry); the
    # CONTEXT_OVERFLOW is stored under its request id, a result-cache entry for the TTL
    overflow_body = wire.encode_invoke_body(SamplingParams(max_tokens=2040), PayloadKind.PROMPT,
                                            b"Hello there, " * 8)
    two_frag_body = wire.encode_invoke_body(SamplingParams(max_tokens=8), PayloadKind.PROMPT,
                                            b"x" * 600)
    too_many = [ChatMessage("user", "x")] * (wire.MAX_CHAT_MESSAGES + 1)
    too_many_payload = b"".join(wire.CHAT_MSG_HDR.pack(2, 1) + b"x" for _ in too_many)
    too_many_body = wire.encode_invoke_body(SamplingParams(max_tokens=8), PayloadKind.CHAT,
                                            too_many_payload)
    kinds = [
        lambda: [os.urandom(random.randint(1, 1400))],
        lambda: [b"ZLYR\x01\x04" + os.urandom(106)],
        lambda: [wire.encode_control(MsgType.PING, key_id + 1000, secret, secrets.token_bytes(16),
                                     now_us(), secrets.token_bytes(32))],
        lambda: [wire.encode_control(MsgType.PING, key_id, secrets.token_bytes(32),
                                     secrets.token_bytes(16), now_us(), secrets.token_bytes(32))],
        lambda: [wire.encode_control(MsgType.PING, key_id, secret, secrets.token_bytes(16),
                                     now_us() - 3_600_000_000, secrets.token_bytes(32))],
        lambda: [captured],
    ] + 4 * [  # the kinds that make the daemon keep something: most of the mix
        lambda: [wire.encode_control(MsgType.PING, key_id, secret, secrets.token_bytes(16),
                                     now_us(), secrets.token_bytes(32))],
        lambda: wire.encode_invoke(key_id, secret, secrets.token_bytes(16), now_us(),
                                   secrets.token_bytes(32), overflow_body),
        lambda: wire.encode_invoke(key_id, secret, secrets.token_bytes(16), now_us(),
                                   secrets.token_bytes(32), two_frag_body, 512)[:1],
    ]
    n = 0
    while True:
        n += 1
        if n % 4000 == 0:  # 838 datagrams, ~1/6 of the mix
            yield from wire.encode_invoke(key_id, secret, secrets.token_bytes(16), now_us(),
                                          secrets.token_bytes(32), too_many_body)
        yield from kinds[n % len(kinds)]()


def loadgen(a: argparse.Namespace) -> None:
    from zerolayer.client import Client
    from zerolayer.protocol.errors import ZerolayerError
    from zerolayer.protocol.wire import ChatMessage
    addr = ("127.0.0.1", a.port)
    secret = bytes.fromhex(a.secret)
    stop = threading.Event()
    counts = {"valid_ok": 0, "valid_err": 0, "hostile_sent": 0}

    def valid(i: int) -> None:
        c = Client(addr, a.key_id, secret, timeout=60)
        rids: list[bytes] = []
        n = 0
        while not stop.is_set():
            n += 1
            rid = random.choice(rids) if rids and n % 5 == 0 else secrets.token_bytes(16)
            rids = (rids + [rid])[-50:]
            msgs = [ChatMessage("user", f"Write about {TOPICS[(i + n) % len(TOPICS)]}.")]
            try:
                s = c.stream(messages=msgs, max_tokens=16, request_id=rid)
                for _ in s:
                    if n % 7 == 0:
                        s.cancel()
                        break
                counts["valid_ok"] += 1
            except ZerolayerError:
                counts["valid_err"] += 1

    def hostile() -> None:
        gen = _hostile_datagrams(addr, a.key_id, secret)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            t0 = time.monotonic()
            while not stop.is_set():
                due = int((time.monotonic() - t0) * a.rate) - counts["hostile_sent"]
                for _ in range(min(due, 500)):
                    s.sendto(next(gen), addr)
                    counts["hostile_sent"] += 1
                time.sleep(0.005)

    threads = [threading.Thread(target=valid, args=(i,), daemon=True) for i in range(a.clients)]
    threads.append(threading.Thread(target=hostile, daemon=True))
    for t in threads:
        t.start()
    over = OpenLoop(addr, a.key_id, secret, a.overload_rate) if a.overload_rate else None
    if over is not None:
        over.start()
    end = time.monotonic() + a.duration_s
    while time.monotonic() < end and sys.stdin.readline() not in ("", "stop\n"):
        pass  # the parent writes a line per sample; EOF or "stop" ends the load
    stop.set()
    if over is not None:
        counts["overload"] = over.close()
    print(json.dumps(counts), flush=True)


# ---- the sampler --------------------------------------------------------------------------

def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for name, label, value in re.findall(
            r'^(zerolayer_memory(?:_limit)?_bytes)\{buffer="(\w+)"\} (\S+)$', text, re.M):
        out[("limit:" if "limit" in name else "") + label] = float(value)
    for name in ("zerolayer_ingress_datagrams_total", "zerolayer_requests_total"):
        out[name] = sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    m = re.search(r'^zerolayer_overloaded_total\{bound="wait_queue"\} (\S+)$', text, re.M)
    out[WAIT_QUEUE_FULL] = float(m.group(1)) if m else 0.0
    return out


WAIT_QUEUE_FULL = "zerolayer_overloaded_total:wait_queue"


def verdict(samples: list[dict], warmup_s: float, overload: bool = False) -> dict:
    after = [s for s in samples if s["t"] >= warmup_s]
    if not after:
        return {"ok": False, "why": "no samples after the warm-up"}
    base = after[0]["rss"]
    hi, lo = max(s["rss"] for s in after), min(s["rss"] for s in after)
    dev = max(hi - base, base - lo) / base
    full = samples[-1]["m"].get(WAIT_QUEUE_FULL, 0.0)
    return {"ok": dev <= 0.10 and (full > 0 or not overload), "rss_at_warmup_end": base,
            "rss_max": hi, "rss_min": lo, "max_deviation": dev,
            "samples_after_warmup": len(after), "wait_queue_refusals": full}


def table(samples: list[dict], buffers: list[str]) -> str:
    head = "| t (s) | RSS (MB) | " + " | ".join(f"{b} (MB)" for b in buffers) + " |"
    rows = [head, "|" + "---|" * (2 + len(buffers))]
    last = -60.0
    for s in samples:
        if s["t"] - last >= 60 or s is samples[-1]:
            last = s["t"]
            rows.append(f"| {s['t']:.0f} | {s['rss'] / 1e6:.1f} | "
                        + " | ".join(f"{s['m'].get(b, 0) / 1e6:.1f}" for b in buffers) + " |")
    return "\n".join(rows)


def plot(samples: list[dict], buffers: list[str], warmup_s: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [s["t"] for s in samples]
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.plot(t, [s["rss"] / 1e6 for s in samples], lw=2.5, color="black", label="RSS")
    for b in buffers:
        ax.plot(t, [s["m"].get(b, 0) / 1e6 for s in samples], lw=1, label=b)
    ax.axvspan(0, warmup_s, color="0.9", label="warm-up")
    v = verdict(samples, warmup_s)
    if "rss_at_warmup_end" in v:
        base = v["rss_at_warmup_end"] / 1e6
        ax.axhspan(base * 0.9, base * 1.1, color="green", alpha=0.08, label="±10 % band")
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("MB")
    ax.set_title("zerolayerd memory under mixed valid and hostile traffic")
    ax.legend(fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration-s", type=float, default=600)
    ap.add_argument("--warmup-s", type=float, default=180)
    ap.add_argument("--sample-s", type=float, default=5)
    ap.add_argument("--rate", type=float, default=4000, help="hostile datagrams per second")
    ap.add_argument("--clients", type=int, default=4, help="valid SDK clients in a loop")
    ap.add_argument("--overload-x", type=float, default=10,
                    help="offer this many times the measured capacity, open loop (0: off)")
    ap.add_argument("--calibrate-s", type=float, default=30,
                    help="how long the capacity is measured before the load")
    ap.add_argument("--overload-rate", type=float, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--model", default="")
    ap.add_argument("--out", default="", help="JSON path (the PNG goes beside it)")
    ap.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--key-id", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--secret", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.loadgen:
        loadgen(a)
        return 0

    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(a.out) if a.out else RESULTS / f"soak-{stamp}.json"
    git = git_head()  # the code that runs
    lock, _ = take_lock(float("inf"), " ".join(sys.argv))  # held until this process exits
    model = a.model or default_model()
    tmp = Path(tempfile.mkdtemp(prefix="zl-soak-"))
    d = ZeroLayerDaemon(sys.executable, model, 2, 2048, tmp, tmp / "zerolayerd.log",
                        extra=["--security-max-skew-s", "30", "--cache-ttl-s", "60"])
    samples: list[dict] = []
    try:
        d.wait_ready()
        if a.overload_x:
            capacity = measure_capacity(("127.0.0.1", d.port), d.key_id, d.secret,
                                        a.calibrate_s, CALIBRATION_CLIENTS)
            a.overload_rate = a.overload_x * capacity
            log(f"capacity {capacity:.1f} requests/s ({CALIBRATION_CLIENTS} clients, "
                f"{a.calibrate_s:.0f} s); offering {a.overload_rate:.1f}/s open loop")
        rss0 = rss_bytes(d.pid)
        log(f"daemon ready (RSS {rss0 / 1e6:.0f} MB); load for {a.duration_s:.0f} s")
        gen = subprocess.Popen(
            [sys.executable, __file__, "--loadgen", "--port", str(d.port), "--key-id",
             str(d.key_id), "--secret", d.secret.hex(), "--rate", str(a.rate), "--clients",
             str(a.clients), "--duration-s", str(a.duration_s + 60),
             "--overload-rate", str(a.overload_rate)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        while (t := time.monotonic() - t0) < a.duration_s:
            d._check_alive()
            samples.append({"t": round(t, 1), "rss": rss_bytes(d.pid), "m": scrape(d.metrics_port)})
            s = samples[-1]
            log(f"t={t:5.0f}s RSS {s['rss'] / 1e6:6.1f} MB  "
                + " ".join(f"{k}={v / 1e6:.1f}" for k, v in s["m"].items()
                           if not k.startswith(("limit:", "zerolayer_"))))
            gen.stdin.write("tick\n")
            gen.stdin.flush()
            time.sleep(max(0.0, a.sample_s - (time.monotonic() - t0 - t)))
        gen.stdin.write("stop\n")
        gen.stdin.flush()
        counts = json.loads(gen.stdout.readline() or "{}")
        gen.wait(120)
    finally:
        code = d.stop()
    buffers = sorted(k for k in samples[-1]["m"] if not k.startswith(("limit:", "zerolayer_")))
    v = verdict(samples, a.warmup_s, overload=bool(a.overload_rate))
    png: Path | None = out.with_suffix(".png")
    try:
        plot(samples, buffers, a.warmup_s, png)
    except ImportError:  # the verdict and the JSON do not need it
        log("no plot: matplotlib is not installed (pip install -e '.[bench]')")
        png = None
    last = samples[-1]["m"]
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {**machine_info(), "python": platform.python_version()},
        "git": git,
        "args": vars(a), "rss_before_load": rss0, "daemon_exit": code, "load": counts,
        "datagrams_received": last.get("zerolayer_ingress_datagrams_total"),
        "requests_finished": last.get("zerolayer_requests_total"),
        "limits": {k[6:]: v for k, v in last.items() if k.startswith("limit:")},
        "verdict": v, "samples": samples, "plot": str(png) if png else None,
    }
    out.write_text(json.dumps(result, indent=1))
    print(table(samples, buffers))
    print()
    print(f"RSS before the load {rss0 / 1e6:.0f} MB; at the end of the {a.warmup_s:.0f} s "
          f"warm-up {v.get('rss_at_warmup_end', 0) / 1e6:.0f} MB; after it min "
          f"{v.get('rss_min', 0) / 1e6:.0f} / max {v.get('rss_max', 0) / 1e6:.0f} MB, largest "
          f"deviation {v.get('max_deviation', 0):.1%}: {'FLAT' if v['ok'] else 'NOT FLAT'} "
          f"(±10 %); wait queue full {v.get('wait_queue_refusals', 0):.0f} times"
          f"{'' if a.overload_rate else ' (overload off)'}. Load: {counts}; daemon exit {code}.")
    print(f"JSON {out}, plot {png}")
    return 0 if v["ok"] and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
