#!/usr/bin/env python
"""Memory soak: zerolayerd under mixed valid and hostile traffic; is its RSS flat?

    .venv/bin/python bench/soak.py [--duration-s 600] [--warmup-s 180] [--rate 4000]
                                   [--overload-x 10] [--calibrate-s 30]

The load, the daemon's settings and the verdict: bench/README.md ("soak.py"). Every buffer
has a bound (docs/OPERATIONS.md "Memory bounds"); this checks their sum holds in practice.
The load generator is a separate process (--loadgen), so its threads never hold the
sampler's GIL.
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
from _harness import ZeroLayerDaemon, default_model, git_head, log, machine_info, results_path, take_lock  # noqa: E402
from _overload import OpenLoop, measure_capacity  # noqa: E402

CALIBRATION_CLIENTS = 16  # the daemon's default max_running: every batch slot busy
WAIT_QUEUE_FULL = "zerolayer_overloaded_total:wait_queue"
TOPICS = ["the sea", "a lighthouse", "bread", "a violin", "the moon", "a fox", "rain", "glass"]


# ---- the load generator (runs in its own process: --loadgen) ----------------------------

def _hostile_datagrams(key_id: int, secret: bytes):
    """An endless rotation of hostile datagrams, each kind built fresh where it must be."""
    from zerolayer.protocol import wire
    from zerolayer.protocol.wire import MsgType, PayloadKind, SamplingParams

    def now_us() -> int:
        return time.time_ns() // 1000

    def ping(kid: int = key_id, sec: bytes = secret, back_us: int = 0) -> list[bytes]:
        return [wire.encode_control(MsgType.PING, kid, sec, secrets.token_bytes(16),
                                    now_us() - back_us, secrets.token_bytes(32))]

    def invoke(body: bytes, *frag: int) -> list[bytes]:
        return wire.encode_invoke(key_id, secret, secrets.token_bytes(16), now_us(),
                                  secrets.token_bytes(32), body, *frag)

    captured = ping()[0]
    # signed, valid, and refused by the engine without running the model: the prompt's ~25
    # tokens are known only once tokenized, past the 1 + max_tokens that ingress can rule
    # out (a larger max_tokens would be refused there, before any cache entry); the
    # CONTEXT_OVERFLOW is stored under its request id, a result-cache entry for the TTL
    overflow_body = wire.encode_invoke_body(SamplingParams(max_tokens=2040), PayloadKind.PROMPT,
                                            b"Hello there, " * 8)
    two_frag_body = wire.encode_invoke_body(SamplingParams(max_tokens=8), PayloadKind.PROMPT,
                                            b"x" * 600)
    too_many_payload = (wire.CHAT_MSG_HDR.pack(2, 1) + b"x") * (wire.MAX_CHAT_MESSAGES + 1)
    too_many_body = wire.encode_invoke_body(SamplingParams(max_tokens=8), PayloadKind.CHAT,
                                            too_many_payload)
    kinds = [
        lambda: [os.urandom(random.randint(1, 1400))],               # garbage
        lambda: [b"ZLYR\x01\x04" + os.urandom(106)],                 # request-shaped garbage
        lambda: ping(kid=key_id + 1000),                             # unknown key
        lambda: ping(sec=secrets.token_bytes(32)),                   # forged tag
        lambda: ping(back_us=3_600_000_000),                         # stale timestamp
        lambda: [captured],                                          # replayed
    ] + 4 * [  # the kinds that make the daemon keep something: most of the mix
        ping,                                                        # the nonce cache
        lambda: invoke(overflow_body),                               # the result cache
        lambda: invoke(two_frag_body, 512)[:1],                      # a reassembly slot
    ]
    n = 0
    while True:
        n += 1
        if n % 4000 == 0:  # 838 datagrams, ~1/6 of the mix
            yield from invoke(too_many_body)
        yield from kinds[n % len(kinds)]()


def loadgen(a: dict) -> None:
    """a: the parent's settings for the load (--loadgen JSON)."""
    from zerolayer.client import Client
    from zerolayer.protocol.errors import ZerolayerError
    from zerolayer.protocol.wire import ChatMessage
    addr = ("127.0.0.1", a["port"])
    secret = bytes.fromhex(a["secret"])
    stop = threading.Event()
    counts = {"valid_ok": 0, "valid_err": 0, "hostile_sent": 0}

    def valid(i: int) -> None:
        c = Client(addr, a["key_id"], secret, timeout=60)
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
        gen = _hostile_datagrams(a["key_id"], secret)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            t0 = time.monotonic()
            while not stop.is_set():
                due = int((time.monotonic() - t0) * a["rate"]) - counts["hostile_sent"]
                for _ in range(min(due, 500)):
                    s.sendto(next(gen), addr)
                    counts["hostile_sent"] += 1
                time.sleep(0.005)

    threads = [threading.Thread(target=valid, args=(i,), daemon=True) for i in range(a["clients"])]
    threads.append(threading.Thread(target=hostile, daemon=True))
    for t in threads:
        t.start()
    over = OpenLoop(addr, a["key_id"], secret, a["overload_rate"]) if a["overload_rate"] else None
    if over is not None:
        over.start()
    end = time.monotonic() + a["duration_s"]
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
    ap.add_argument("--model", default="")
    ap.add_argument("--out", default="", help="JSON path (the PNG goes beside it)")
    ap.add_argument("--loadgen", help=argparse.SUPPRESS)  # JSON: this process is the load
    a = ap.parse_args()
    if a.loadgen:
        loadgen(json.loads(a.loadgen))
        return 0
    a.overload_rate = 0.0

    out = results_path(a.out, "soak")
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
        cfg = {"port": d.port, "key_id": d.key_id, "secret": d.secret.hex(), "rate": a.rate,
               "clients": a.clients, "duration_s": a.duration_s + 60,
               "overload_rate": a.overload_rate}
        gen = subprocess.Popen([sys.executable, __file__, "--loadgen", json.dumps(cfg)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               bufsize=1)  # line-buffered: each tick reaches it at once
        t0 = time.monotonic()
        while (t := time.monotonic() - t0) < a.duration_s:
            d._check_alive()
            samples.append({"t": round(t, 1), "rss": rss_bytes(d.pid), "m": scrape(d.metrics_port)})
            s = samples[-1]
            log(f"t={t:5.0f}s RSS {s['rss'] / 1e6:6.1f} MB  "
                + " ".join(f"{k}={v / 1e6:.1f}" for k, v in s["m"].items()
                           if not k.startswith(("limit:", "zerolayer_"))))
            gen.stdin.write("tick\n")
            time.sleep(max(0.0, a.sample_s - (time.monotonic() - t0 - t)))
        gen.stdin.write("stop\n")
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
    print(table(samples, buffers) + "\n")
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
