#!/usr/bin/env python
"""Memory soak: zerolayerd under mixed valid and hostile traffic plus an overload sized to the
machine; is its RSS flat? The load, the settings and the verdict: bench/README.md ("soak.py").
"""
from __future__ import annotations

import argparse
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
from collections import Counter
from pathlib import Path

from zerolayer.client import ChatMessage, Client
from zerolayer.protocol import wire
from zerolayer.protocol.errors import ErrorCode, ZerolayerError
from zerolayer.protocol.wire import MsgType, PayloadKind, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

CALIBRATION_CLIENTS = 16  # the daemon's default max_running: every batch slot busy
WAIT_QUEUE_FULL = "zerolayer_overloaded_total:wait_queue"
TOPICS = ["the sea", "a lighthouse", "bread", "a violin", "the moon", "a fox", "rain", "glass"]
OVERLOAD_PROMPT, OVERLOAD_TOKENS = "Write about the sea.", 16


def now_us() -> int:
    return time.time_ns() // 1000


def paced(rate: float, stop: threading.Event, send, counts: Counter, key: str) -> None:
    """send() at `rate` per second on schedule, whatever the daemon answers (open loop),
    counting into counts[key], until `stop`."""
    t0 = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - t0) * rate) - counts[key]
        for _ in range(min(due, 500)):
            send()
            counts[key] += 1
        time.sleep(0.005)


# ---- the overload: relative to the machine, so the wait queue fills on a slow host too

def measure_capacity(addr, key_id: int, secret: bytes, seconds: float,
                     concurrency: int) -> float:
    """Requests of open_loop's kind finished per second, `concurrency` clients back to back."""
    done, stop = [0], threading.Event()

    def client(_: int) -> None:
        c = Client(addr, key_id, secret, timeout=60)
        while not stop.is_set():
            try:
                c.invoke(messages=[ChatMessage("user", OVERLOAD_PROMPT)],
                         max_tokens=OVERLOAD_TOKENS)
                done[0] += 1
            except ZerolayerError:
                pass
    threads = H.spawn(concurrency, client)
    time.sleep(seconds / 4)        # a ramp: the first requests pay for empty caches
    n0, t0 = done[0], time.monotonic()
    time.sleep(seconds * 3 / 4)
    rate = (done[0] - n0) / (time.monotonic() - t0)
    stop.set()
    for t in threads:
        t.join(120)
    return rate


def open_loop(addr, key_id: int, secret: bytes, rate: float, stop: threading.Event,
              counts: Counter, lease_s: float = 10.0) -> list[threading.Thread]:
    """Signed INVOKEs of measure_capacity's kind at `rate` per second, open loop (a slow daemon
    gets more queued, not fewer sent); each admitted one kept alive with keepalives until its
    DONE or ERROR, so it waits in the queue instead of losing its lease; every answer counted."""
    chat = wire.encode_chat([ChatMessage("user", OVERLOAD_PROMPT)])
    body = wire.encode_invoke_body(SamplingParams(max_tokens=OVERLOAD_TOKENS), PayloadKind.CHAT,
                                   chat)
    live: dict[bytes, float] = {}   # admitted, not ended: rid -> last keepalive
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(0.1)

    def send() -> None:
        for dg in wire.encode_invoke(key_id, secret, secrets.token_bytes(16), now_us(),
                                     secrets.token_bytes(32), body):
            sock.sendto(dg, addr)

    def read(_: int) -> None:
        while not stop.is_set():
            try:
                f = wire.decode_response(sock.recv(4096), secret)
            except (OSError, ValueError, ZerolayerError):
                continue
            if isinstance(f, wire.AckFrame) and f.state is wire.RunState.QUEUED:
                counts["admitted"] += 1
                live.setdefault(f.request_id, time.monotonic())
            elif isinstance(f, wire.DoneFrame):
                counts["done"] += 1
                live.pop(f.request_id, None)
            elif isinstance(f, wire.ErrorFrame):
                try:
                    code = ErrorCode(f.code).name
                except ValueError:
                    code = str(f.code)
                counts[f"refused:{code}" if f.seq == wire.NO_SEQ else f"failed:{code}"] += 1
                live.pop(f.request_id, None)

    def keepalives(_: int) -> None:
        while not stop.is_set():
            now = time.monotonic()
            for rid, last in list(live.items()):
                if now - last >= lease_s / 4:
                    sock.sendto(wire.encode_control(MsgType.RESEND, key_id, secret, rid, now_us(),
                                                    secrets.token_bytes(32), wire.NO_SEQ), addr)
                    live[rid] = now
            time.sleep(0.1)

    return [*H.spawn(1, lambda _: paced(rate, stop, send, counts, "sent")), *H.spawn(1, read),
            *H.spawn(1, keepalives)]


# ---- the load generator (runs in its own process, --loadgen, so its threads never hold the
# sampler's GIL)

def _hostile_datagrams(key_id: int, secret: bytes):
    """An endless rotation of hostile datagrams, each kind built fresh where it must be."""

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
    addr = ("127.0.0.1", a["port"])
    secret = bytes.fromhex(a["secret"])
    stop = threading.Event()
    counts: Counter[str] = Counter(valid_ok=0, valid_err=0, hostile_sent=0)

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

    def hostile(_: int) -> None:
        gen = _hostile_datagrams(a["key_id"], secret)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            paced(a["rate"], stop, lambda: s.sendto(next(gen), addr), counts, "hostile_sent")

    H.spawn(a["clients"], valid)
    H.spawn(1, hostile)
    over: Counter[str] = Counter()
    over_threads = (open_loop(addr, a["key_id"], secret, a["overload_rate"], stop, over)
                    if a["overload_rate"] else [])
    end = time.monotonic() + a["duration_s"]
    while time.monotonic() < end and sys.stdin.readline() not in ("", "stop\n"):
        pass  # the parent writes a line per sample; EOF or "stop" ends the load
    stop.set()
    for t in over_threads:
        t.join(10)
    if over_threads:
        counts["overload"] = dict(over)
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


def plot(samples: list[dict], buffers: list[str], v: dict, warmup_s: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [s["t"] for s in samples]
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.plot(t, [s["rss"] / 1e6 for s in samples], lw=2.5, color="black", label="RSS")
    for b in buffers:
        ax.plot(t, [s["m"].get(b, 0) / 1e6 for s in samples], lw=1, label=b)
    ax.axvspan(0, warmup_s, color="0.9", label="warm-up")
    if "rss_at_warmup_end" in v:
        base = v["rss_at_warmup_end"] / 1e6
        ax.axhspan(base * 0.9, base * 1.1, color="green", alpha=0.08, label="±10 % band")
    ax.set(xlabel="seconds since the load started", ylabel="MB",
           title="zerolayerd memory under mixed valid and hostile traffic")
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

    out = H.results_path(a.out, "soak")
    meta = H.run_meta()  # the code that runs
    lock, _ = H.take_lock(float("inf"), " ".join(sys.argv))  # held until this process exits
    tmp = Path(tempfile.mkdtemp(prefix="zl-soak-"))
    d = H.ZeroLayerDaemon(sys.executable, a.model or H.default_model(), 2, 2048, tmp,
                          tmp / "zerolayerd.log",
                          extra=["--security-max-skew-s", "30", "--cache-ttl-s", "60"])
    samples: list[dict] = []
    try:
        d.wait_ready()
        if a.overload_x:
            capacity = measure_capacity(d.addr, d.key_id, d.secret, a.calibrate_s,
                                        CALIBRATION_CLIENTS)
            a.overload_rate = a.overload_x * capacity
            H.log(f"capacity {capacity:.1f} requests/s ({CALIBRATION_CLIENTS} clients, "
                  f"{a.calibrate_s:.0f} s); offering {a.overload_rate:.1f}/s open loop")
        rss0 = rss_bytes(d.pid)
        H.log(f"daemon ready (RSS {rss0 / 1e6:.0f} MB); load for {a.duration_s:.0f} s")
        cfg = {"port": d.port, "key_id": d.key_id, "secret": d.secret.hex(), "rate": a.rate,
               "clients": a.clients, "duration_s": a.duration_s + 60,
               "overload_rate": a.overload_rate}
        gen = subprocess.Popen([sys.executable, __file__, "--loadgen", json.dumps(cfg)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               bufsize=1)  # line-buffered: each tick reaches it at once
        t0 = time.monotonic()
        while (t := time.monotonic() - t0) < a.duration_s:
            d._check_alive()
            s = {"t": round(t, 1), "rss": rss_bytes(d.pid), "m": scrape(d.metrics_port)}
            samples.append(s)
            H.log(f"t={t:5.0f}s RSS {s['rss'] / 1e6:6.1f} MB  "
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
        plot(samples, buffers, v, a.warmup_s, png)
    except ImportError:  # the verdict and the JSON do not need it
        H.log("no plot: matplotlib is not installed (pip install -e '.[bench]')")
        png = None
    last = samples[-1]["m"]
    out.write_text(json.dumps({
        **meta, "machine": {**H.machine_info(), "python": platform.python_version()},
        "args": vars(a), "rss_before_load": rss0, "daemon_exit": code, "load": counts,
        "datagrams_received": last.get("zerolayer_ingress_datagrams_total"),
        "requests_finished": last.get("zerolayer_requests_total"),
        "limits": {k[6:]: v for k, v in last.items() if k.startswith("limit:")},
        "verdict": v, "samples": samples, "plot": str(png) if png else None}, indent=1))
    shown, next_t = [], 0.0                   # one row a minute, and the last
    for s in samples:
        if s["t"] >= next_t or s is samples[-1]:
            shown.append([f"{s['t']:.0f}", *(f"{x / 1e6:.1f}" for x in
                                             (s["rss"], *(s["m"].get(b, 0) for b in buffers)))])
            next_t = s["t"] + 60
    print(H.md_table(["t (s)", "RSS (MB)", *(f"{b} (MB)" for b in buffers)], shown) + "\n")
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
