#!/usr/bin/env python
"""Legitimate service under a junk flood: zerolayerd's UDP and XDP ingress, and llama-server
under wrong-API-key HTTP requests at the same rates. Setup (`sudo bash bench/setup_flood.sh`),
testbed, junk classes, what a row measures and where each side runs: bench/README.md.

    sudo .venv/bin/python bench/bench_flood.py                       # the full matrix
    sudo .venv/bin/python bench/bench_flood.py --paths xdp --classes wrong_mac \\
        --sources spoofed --rates 100000                             # one row (~2 min)
    .venv/bin/python bench/bench_flood.py --render bench/results/flood-….json
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import secrets
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import namedtuple
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _harness import (  # noqa: E402
    LLAMA_BIN,
    NativeLlamaServer,
    chat_body,
    http_get_timed,
    http_stream_chat,
    llama_server_that_serves,
    log,
    machine_info,
    results_path,
    run_meta,
    sh,
    stats,
    take_lock,
    top_processes,
    zl_stream_chat,
)
from bench_dataplane import STREAM_OPTS, scrape, story  # noqa: E402
from bench_xdp import HTTP_PORT, METRICS_PORT, PORT, Daemon, proc_cpu_s  # noqa: E402

from netns import CLI_IF, CLI_V4, SRV_IF, SRV_V4, in_netns  # noqa: E402  (tests/, on the path by bench_xdp)
from zerolayer.client.invoke_body import build_invoke_body  # noqa: E402
from zerolayer.protocol import wire, xdp_tag  # noqa: E402
from zerolayer.protocol.wire import ChatMessage, MsgType  # noqa: E402

PATHS = ("udp", "xdp", "llama")

# ---------------------------------------------------------------------------- the testbed

FLD_IF, FLD_V4 = "fl-f", "10.201.0.3"
Testbed = namedtuple("Testbed", "name srv cli fld srv_mac fld_mac")  # srv, cli, fld: namespaces


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def _link(ns: str, ifname: str) -> dict:
    (info,) = json.loads(_ip("-n", ns, "-j", "-s", "link", "show", ifname))
    return info


def link_stats(ns: str, ifname: str) -> dict:
    """The interface's kernel counters (rx/tx packets, bytes, dropped)."""
    return _link(ns, ifname)["stats64"]


@contextlib.contextmanager
def flood_testbed(prefix: str = "zlf"):
    """NAME-srv (veth SRV_IF, SRV_V4: the server), NAME-cli (bridge br0, CLI_V4, joining CLI_IF
    and fl-c: the clients), NAME-fld (veth FLD_IF, FLD_V4: the sender), so that the sender's
    packets reach the server's interface through the bridge as the clients' do. Nothing is made
    in the caller's namespace; deleting the three (always) removes every device."""
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    srv, cli, fld = f"{name}-srv", f"{name}-cli", f"{name}-fld"
    try:
        for ns in (srv, cli, fld):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        # one queue each way, as scripts/xdp-testbed.sh: the daemon binds an AF_XDP socket
        # per RX queue, and a veth made without the numbers gets one per possible CPU
        one = ("numtxqueues", "1", "numrxqueues", "1")
        _ip("-n", srv, "link", "add", SRV_IF, *one, "type", "veth", "peer", "name", CLI_IF,
            "netns", cli, *one)
        _ip("-n", fld, "link", "add", FLD_IF, "type", "veth", "peer", "name", "fl-c", "netns", cli)
        _ip("-n", cli, "link", "add", "br0", "type", "bridge")
        for port in (CLI_IF, "fl-c"):
            _ip("-n", cli, "link", "set", port, "master", "br0", "up")
        for ns, dev, addr in ((srv, SRV_IF, SRV_V4), (cli, "br0", CLI_V4), (fld, FLD_IF, FLD_V4)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        # replies to spoofed sources leave by the default route and are dropped in the
        # sender's namespace (it does not forward), as a router drops them on the way to nobody
        _ip("-n", srv, "route", "add", "default", "via", FLD_V4)
        # spoofed sources must reach the socket on the UDP path as they would on a host
        # without strict reverse-path filtering (the XDP program sees them before any of this)
        subprocess.run(["ip", "netns", "exec", srv, "sysctl", "-qw",
                        "net.ipv4.conf.all.rp_filter=0", f"net.ipv4.conf.{SRV_IF}.rp_filter=0"],
                       check=True)
        mac = [bytes.fromhex(_link(ns, i)["address"].replace(":", ""))
               for ns, i in ((srv, SRV_IF), (fld, FLD_IF))]
        yield Testbed(name, srv, cli, fld, *mac)
    finally:
        for ns in (srv, cli, fld):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


# ---------------------------------------------------------------------------- the junk

FLAGS_OFF = 10  # the common header's flags (docs/PROTOCOL.md §3)
CLASSES = ("malformed", "unknown_key", "stale_timestamp", "wrong_mac", "forged_tag", "replay")
# spoofed sources, outside every testbed subnet: what the server sends back (an unsigned ERROR
# on the UDP path) goes to its default route, the sender's namespace, which drops it, and never
# waits on ARP
SPOOF_NET = (10, 203)
UNKNOWN_KEY_ID = 0xDEAD
STALE_S = 3600          # far outside the daemon's ±300 s skew window
IP_OFF, UDP_OFF, UDP_LEN = 14, 34, 8   # after Ethernet; IPv4 without options; UDP's header

Endpoints = namedtuple("Endpoints", "src_mac dst_mac src_ip dst_ip sport dport")


def _invoke(key_id: int, secret: bytes, ts_us: int) -> bytes:
    """One single-fragment chat INVOKE for one token: a real request, as the SDK builds it."""
    body = build_invoke_body(None, [ChatMessage("user", "Say hi.")], None, max_tokens=1,
                             temperature=0.0, top_k=0, top_p=1.0, seed=None, stop=())
    (dg,) = wire.encode_invoke(key_id, secret, secrets.token_bytes(wire.REQUEST_ID_LEN), ts_us,
                               secrets.token_bytes(wire.NONCE_LEN), body)
    return dg


def datagrams(cls: str, key_id: int, secret: bytes) -> list[bytes]:
    """The datagrams of one junk class, signed (where signed) with the daemon's real key;
    trafgen cycles through them (malformed: bad magic, version, length in turn)."""
    now = time.time_ns() // 1000
    if cls == "malformed":
        ping = wire.encode_control(MsgType.PING, key_id, secret,
                                   secrets.token_bytes(wire.REQUEST_ID_LEN), now,
                                   secrets.token_bytes(wire.NONCE_LEN))
        return [b"XXXX" + ping[4:], ping[:4] + bytes([wire.VERSION + 1]) + ping[5:],
                ping[:8] + struct.pack("<H", len(ping) + 16) + ping[10:]]
    if cls == "unknown_key":
        return [_invoke(UNKNOWN_KEY_ID, secrets.token_bytes(32), now)]
    if cls == "stale_timestamp":
        return [_invoke(key_id, secret, now - STALE_S * 1_000_000)]
    if cls not in CLASSES:
        raise ValueError(f"unknown junk class {cls!r}")
    dg = bytearray(_invoke(key_id, secret, now))
    if cls == "forged_tag":
        struct.pack_into("<H", dg, FLAGS_OFF, struct.unpack_from("<H", dg, FLAGS_OFF)[0] | wire.XDP_TAG)
        dg[xdp_tag.OFFSET:xdp_tag.OFFSET + xdp_tag.LEN] = secrets.token_bytes(xdp_tag.LEN)
    if cls in ("wrong_mac", "forged_tag"):
        dg[-wire.TAG_LEN:] = secrets.token_bytes(wire.TAG_LEN)
    # replay: one valid request, captured: the first copy is served, every later one a replay
    return [bytes(dg)]


def ip_checksum(hdr: bytes) -> int:
    s = sum(struct.unpack(f"!{len(hdr) // 2}H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def frame(ep: Endpoints, payload: bytes) -> bytes:
    """Ethernet + IPv4 (checksummed, TTL 64, DF) + UDP (checksum 0: none, legal over IPv4, so
    no per-packet UDP checksum work) + payload."""
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, UDP_OFF - IP_OFF + UDP_LEN + len(payload),
                               0, 0x4000, 64, 17, 0, ep.src_ip, ep.dst_ip))
    ip[10:12] = struct.pack("!H", ip_checksum(bytes(ip)))
    udp = struct.pack("!HHHH", ep.sport, ep.dport, UDP_LEN + len(payload), 0)
    return ep.dst_mac + ep.src_mac + b"\x08\x00" + bytes(ip) + udp + payload


def _hex(b: bytes) -> str:
    return ", ".join(f"0x{x:02x}" for x in b)


def trafgen_packet(fr: bytes, spoof: bool) -> str:
    """One `{ ... }` packet of trafgen's configuration language. With spoof, the source's two
    low bytes are a random byte and a run-time counter (many sources, none repeated soon), and
    the IPv4 checksum is trafgen's csumip over the header, computed after those fields."""
    if not spoof:
        return "{\n  " + _hex(fr) + "\n}\n"
    src = _hex(bytes(SPOOF_NET)) + ", drnd(1), dinc(0, 255, 1)"
    return ("{\n  " + _hex(fr[:IP_OFF + 10]) + ",\n  csumip(%d, %d),\n  " % (IP_OFF, UDP_OFF - 1)
            + src + ",\n  " + _hex(fr[IP_OFF + 16:]) + "\n}\n")


def trafgen_config(cls: str, ep: Endpoints, key_id: int, secret: bytes, spoof: bool) -> str:
    head = f"/* zerolayer junk class {cls}, {'spoofed sources' if spoof else 'one source'} */\n"
    return head + "".join(trafgen_packet(frame(ep, d), spoof) for d in datagrams(cls, key_id, secret))


# ---------------------------------------------------------------------------- the senders

# per rate, how many packets at most: the rate times the time bound (a ceiling run is bounded
# by this many per second, far above what one sender core reaches on veth)
CEILING_PPS_BOUND = 5_000_000

WRK_SCRIPT = r"""
-- requests with a wrong API key; each connection waits `gap_ms` between its requests (wrk
-- paces per connection), and the thread stops after `limit` responses
wrk.method = "POST"
wrk.body = '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(key)s"
local gap_ms, limit, n = %(gap_ms)s, %(limit)d, 0
if gap_ms > 0 then
  function delay() return gap_ms end
end
function response(status, headers, body)
  n = n + 1
  if n >= limit then wrk.thread:stop() end
end
"""

# sent: packets (trafgen) or requests completed (wrk); seconds: the sender's own time sending
SenderResult = namedtuple("SenderResult", "sent seconds")


class Sender:
    """A generator in `ns` on `cpu` at nice 19 (the clients beside it run first), stopped by
    stop() with SIGINT (it prints its own count) or after `bound_s`."""

    def __init__(self, ns: str, cpu: int, cmd: list[str], bound_s: float, log: Path):
        self.log = log
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, "timeout", "-s", "INT", "-k", "5", f"{bound_s:.0f}",
             "taskset", "-c", str(cpu), "nice", "-n", "19", *cmd],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)   # to `ip netns exec`, which exec'd timeout
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:      # gone meanwhile
        return ""


def workers_of(root: int, name: str) -> list[int]:
    """The processes called `name` below `root` whose parent is called `name` too: a
    generator's forked workers, not the generator itself."""
    out, todo = [], [root]
    while todo:
        parent = todo.pop()
        tasks = os.listdir(f"/proc/{parent}/task") if os.path.isdir(f"/proc/{parent}") else []
        kids = [int(k) for t in tasks for k in _read(f"/proc/{parent}/task/{t}/children").split()]
        if _read(f"/proc/{parent}/comm").strip() == name:
            out += [k for k in kids if _read(f"/proc/{k}/comm").strip() == name]
        todo += kids
    return out


def pin_workers(root: subprocess.Popen, name: str, workers: int, cpu: int) -> None:
    """Wait until `workers` workers (workers_of) run below `root`; then keep them on `cpu` for
    0.3 s (a worker pins itself right after its fork: a pin set before that would be undone).
    A generator that has already ended needs nothing."""
    deadline = time.monotonic() + 10
    while len(mine := workers_of(root.pid, name)) < workers:
        if root.poll() is not None:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(mine)} of {workers} {name} workers to pin to CPU {cpu} "
                               "within 10 s")
        time.sleep(0.01)
    until = time.monotonic() + 0.3
    while time.monotonic() < until:
        for p in mine:
            with contextlib.suppress(OSError):       # exited meanwhile
                os.sched_setaffinity(p, {cpu})
        time.sleep(0.01)


def trafgen(ns: str, dev: str, cpu: int, config: Path, rate: str, bound_s: float,
            log: Path, count: int | None = None) -> Sender:
    """trafgen, one worker, leaving socket memory and IRQ affinity alone (bench/README.md),
    paced or at full speed (max); `count`: packets at most (default: the rate times bound_s)."""
    pps = None if rate == "max" else int(rate)
    count = int((pps or CEILING_PPS_BOUND) * bound_s) if count is None else count
    cmd = ["trafgen", "-o", dev, "-i", str(config), "-P", "1", "-n", str(count),
           "--no-sock-mem", "--notouch-irq", *(["-b", f"{pps}pps"] if pps else [])]
    s = Sender(ns, cpu, cmd, bound_s, log)
    pin_workers(s.proc, "trafgen", 1, cpu)   # it pins its worker to CPU 0 whatever its taskset
    return s


def parse_trafgen(out: str) -> SenderResult:
    """trafgen's exit summary: 'N packets outgoing' and 'S sec, U usec on CPUk (...)'."""
    sent = re.search(r"(\d+) packets outgoing", out)
    took = re.search(r"(\d+) sec,\s+(\d+) usec on CPU", out)
    return SenderResult(int(sent.group(1)) if sent else 0,
                        int(took.group(1)) + int(took.group(2)) / 1e6 if took else 0.0)


def wrk(ns: str, cpu: int, url: str, api_key: str, rate: str, bound_s: float, tmp: Path,
        log: Path, connections: int = 64) -> Sender:
    pps = None if rate == "max" else int(rate)
    script = tmp / "wrong_key.lua"
    script.write_text(WRK_SCRIPT % {"key": api_key, "gap_ms": f"{connections * 1000 / pps if pps else 0:.3f}",
                                    "limit": int((pps or CEILING_PPS_BOUND) * bound_s)})
    return Sender(ns, cpu, ["wrk", "-t1", f"-c{connections}", f"-d{bound_s:.0f}s", "--timeout", "2s",
                            "-s", str(script), url], bound_s + 5, log)


def parse_wrk(out: str) -> SenderResult:
    """wrk's summary: 'N requests in T.TTs' (responses of any status)."""
    m = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)", out)
    if not m:
        return SenderResult(0, 0.0)
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(3)]
    return SenderResult(int(m.group(1)), float(m.group(2)) * scale)


# ---------------------------------------------------------------------------- the servers

class ZlTarget:
    """zerolayerd with one ingress, its key, and its clients (run in the client namespace)."""

    def __init__(self, bed: Testbed, tmp: Path, ingress: str, cpu: int, extra: list[str]):
        self.bed = bed
        self.d = Daemon(bed.srv, tmp, ingress, busy=False, cpu=cpu, extra=extra)
        self.pid, self.stop = self.d.proc.pid, self.d.stop

    def counters(self) -> dict[str, float]:
        """The daemon's metrics and the server namespace's UDP counters (socket-buffer
        overflows are the UDP path's kernel drops)."""
        return in_netns(self.bed.srv, lambda: {**scrape(METRICS_PORT), **udp_counters()})

    def pings(self, n: int, wait_s: float, cpu: int) -> tuple[list[float], int]:
        from zerolayer.protocol.errors import ZerolayerError

        def run():
            pin(cpu)
            c, rtts, lost = self.d.client(30, (SRV_V4, PORT)), [], 0
            for _ in range(n):
                try:
                    rtts.append(c.probe(wait_s)[0])
                except ZerolayerError:
                    lost += 1
            return rtts, lost
        return in_netns(self.bed.cli, run)

    def stream(self, i: int, tokens: int) -> dict:
        r = zl_stream_chat(self.d.client(30, (SRV_V4, PORT)), story(i), tokens)
        return {"ttft_s": r["ttft_s"], "tokens": r["usage"]["completion_tokens"],
                "retried": r["attempts"] > 1}


class LlamaTarget:
    """llama-server (bench/setup_llamacpp.sh) with an API key, on the server namespace's veth
    address, one thread, one slot per legitimate stream."""

    def __init__(self, bed: Testbed, tmp: Path, cpu: int, model: str, slots: int):
        self.bed, self.key = bed, secrets.token_hex(16)
        self.s, self.fallback = llama_server_that_serves(
            lambda extra: NativeLlamaServer(
                str(LLAMA_BIN / "llama-server"), model, 1, slots, HTTP_PORT,
                tmp / "llama-server.log", extra=["--host", "0.0.0.0", "--api-key", self.key, *extra],
                prefix=["ip", "netns", "exec", bed.srv, "taskset", "-c", str(cpu)]),
            lambda srv: in_netns(bed.srv, srv.wait_ready))
        self.pid, self.stop = self.s.pid, self.s.stop

    def counters(self) -> dict[str, float]:
        return {}

    def pings(self, n: int, wait_s: float, cpu: int) -> tuple[list[float], int]:
        def run():
            pin(cpu)
            conn, rtts, lost = None, [], 0
            for _ in range(n):
                for attempt in (0, 1):      # a connection the server closed: reconnect once
                    try:
                        if conn is None:
                            conn = http.client.HTTPConnection(SRV_V4, HTTP_PORT, timeout=wait_s)
                            conn.connect()    # outside the timing, as the SDK's socket
                        rtts.append(http_get_timed(conn, "/health"))
                        break
                    except (OSError, http.client.HTTPException, RuntimeError):
                        conn.close() if conn else None
                        conn = None
                        lost += attempt     # the second failure loses the PING
            return rtts, lost
        return in_netns(self.bed.cli, run)

    def stream(self, i: int, tokens: int) -> dict:
        conn = http.client.HTTPConnection(SRV_V4, HTTP_PORT, timeout=60)
        conn.connect()
        try:
            r = http_stream_chat(conn, chat_body(story(i), tokens, extra=STREAM_OPTS),
                                 headers={"Authorization": f"Bearer {self.key}"})
        finally:
            conn.close()
        return {"ttft_s": r["ttft_s"], "tokens": (r["usage"] or {}).get("completion_tokens", 0),
                "retried": False}


def pin(cpu: int) -> None:
    """This thread on `cpu` (-1: left as it is)."""
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})


def streams(target, bed: Testbed, n: int, tokens: int) -> dict:
    """n concurrent streams from the client namespace (threads made there stay in it)."""
    def run():
        out: list[dict] = []
        start = threading.Barrier(n)

        def one(i: int) -> None:
            start.wait()
            try:
                r = target.stream(i, tokens)
            except Exception as e:  # noqa: BLE001  (a failed stream is a result)
                r = {"error": repr(e)}
            r["end"] = time.perf_counter()
            out.append(r)
        t0 = time.perf_counter()
        ths = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        return t0, out
    t0, out = in_netns(bed.cli, run)
    ok = [r for r in out if "error" not in r]
    wall = max((r["end"] for r in out), default=t0) - t0
    tokens = sum(r["tokens"] for r in ok)
    return {"ttft_ms": stats([r["ttft_s"] * 1e3 for r in ok if r["ttft_s"] is not None]),
            "tok_s": tokens / wall if wall > 0 else None, "tokens": tokens, "wall_s": wall,
            "retried": sum(r["retried"] for r in ok), "failed": len(out) - len(ok),
            "errors": [r["error"] for r in out if "error" in r][:3]}


# ---------------------------------------------------------------------------- one row

UDP_SNMP = "kernel_udp:"
KERNEL_SERIES = {"zerolayer_xsk_rx_dropped_total": "xsk_ring_full",
                 f"{UDP_SNMP}RcvbufErrors": "udp_rcvbuf_full", f"{UDP_SNMP}InErrors": "udp_in_errors"}


def udp_counters() -> dict[str, float]:
    """The calling thread's namespace's Udp: counters (/proc/thread-self: /proc/self/net
    would show the namespace of the process's first thread)."""
    with open("/proc/thread-self/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    return {f"{UDP_SNMP}{k}": float(v) for k, v in zip(rows[0][1:], rows[1][1:])}


def kernel_reasons(delta: dict[str, float]) -> dict[str, float]:
    """What the kernel did with the datagrams, by reason: every reason of
    zerolayer_xdp_packets_total{reason} the loaded XDP program reports (the daemon exports
    whichever its stats map holds), the AF_XDP ring's overflow drops, and the UDP socket's."""
    out: dict[str, float] = {}
    for k, v in delta.items():
        if k.startswith("zerolayer_xdp_packets_total{") and 'reason="' in k:
            reason = k.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = out.get(reason, 0) + v
        elif k in KERNEL_SERIES:
            out[KERNEL_SERIES[k]] = v
    return out


def measure(target, bed: Testbed, a) -> dict:
    def rx() -> int:
        return link_stats(bed.srv, SRV_IF)["rx"]["packets"]
    rx0, c0, cpu0, t0 = rx(), target.counters(), proc_cpu_s(target.pid), time.monotonic()
    rtts, lost = target.pings(a.pings, a.ping_wait_s, a.ping_cpu)
    st = streams(target, bed, a.streams, a.stream_tokens)
    cpu1, t1, rx1 = proc_cpu_s(target.pid), time.monotonic(), rx()
    time.sleep(0.5)                 # zerolayerd copies the kernel's counters every 0.25 s
    delta = {k: v - c0.get(k, 0.0) for k, v in target.counters().items()
             if (k.split("{")[0].endswith("_total") or k.startswith(UDP_SNMP)) and v - c0.get(k, 0.0)}
    return {"ping_ms": stats([x * 1e3 for x in rtts]), "pings": a.pings, "pings_lost": lost,
            "streams": st, "server_cpu_share": (cpu1 - cpu0) / (t1 - t0), "window_s": t1 - t0,
            "server_rx_pps": (rx1 - rx0) / (t1 - t0), "kernel_by_reason": kernel_reasons(delta),
            "user_space_datagrams": delta.get("zerolayer_ingress_datagrams_total"),
            "counters": delta}


def flood_row(path: str, cls: str, spoof: bool, rate: str, target, bed: Testbed, tmp: Path,
              a) -> dict:
    tag = f"{path}-{cls}-{'spoofed' if spoof else 'one'}-{rate}"
    if path == "llama":
        sender = wrk(bed.fld, a.sender_cpu, f"http://{SRV_V4}:{HTTP_PORT}/v1/chat/completions",
                     "wrong-" + target.key, rate, a.flood_max_s, tmp, tmp / f"{tag}.log")
    else:
        ep = Endpoints(bed.fld_mac, bed.srv_mac, socket.inet_aton(FLD_V4),
                       socket.inet_aton(SRV_V4), 40000, PORT)
        cfg = tmp / f"{tag}.cfg"
        # built now: the replayed INVOKE and the wrong-MAC one carry a fresh timestamp
        cfg.write_text(trafgen_config(cls, ep, target.d.key_id, target.d.secret, spoof))
        sender = trafgen(bed.fld, FLD_IF, a.sender_cpu, cfg, rate, a.flood_max_s, tmp / f"{tag}.log")
    try:
        time.sleep(1.0)                # the flood under way before the window opens
        if sender.proc.poll() is not None:
            raise RuntimeError(f"the sender exited at once:\n{sender.log.read_text()[-2000:]}")
        m = measure(target, bed, a)
        m["sender_outlived_window"] = sender.proc.poll() is None
    finally:
        out = sender.stop()
    res = parse_wrk(out) if path == "llama" else parse_trafgen(out)
    m["sender"] = {"sent": res.sent, "seconds": res.seconds,
                   "rate": res.sent / res.seconds if res.seconds > 0 else 0.0, "output_tail": out[-600:]}
    return m


def run_path(path: str, bed: Testbed, tmp: Path, a, rows: list[dict]) -> None:
    log(f"{path}: starting the server")
    target = (LlamaTarget(bed, tmp, a.server_cpu, a.model, a.streams) if path == "llama"
              else ZlTarget(bed, tmp, path, a.server_cpu, a.zl_extra))
    try:
        target.pings(3, 2.0, -1)                           # warm: first-call paths
        # warm: each stream's prompt once, so the no-flood row does not pay the prompt caches'
        # first fill that the rows after it skip
        streams(target, bed, a.streams, 4)
        plan = [("none", False, "0")] + (
            [("http_wrong_key", False, r) for r in a.rates] if path == "llama" else
            [(c, s == "spoofed", r) for c in a.classes for s in a.sources for r in a.rates])
        for cls, spoof, rate in plan:
            log(f"{path}: {cls}, {'spoofed' if spoof else 'one source'}, rate {rate}")
            m = (measure(target, bed, a) if cls == "none"
                 else flood_row(path, cls, spoof, rate, target, bed, tmp, a))
            m.update(path=path, cls=cls, sources="spoofed" if spoof else "one", rate=rate)
            if path == "llama":
                m["server_flags_added"] = target.fallback     # --no-repack after a crash
            rows.append(m)
            log("  | " + " | ".join(table_cells(m)) + " |")
    finally:
        target.stop()


# ---------------------------------------------------------------------------- output

def _n(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:.0f}"


def _p(s: dict | None) -> str:
    return "– / –" if not s else f"{s['p50']:.2f} / {s['p99']:.2f}"


HEADER = ["path", "junk", "sources", "asked pps", "sent pps", "server NIC rx pps",
          "PING p50 / p99 ms", "PINGs lost", "TTFT p50 / p99 ms", "tok/s",
          "streams retried / failed", "server CPU", "kernel counters by reason",
          "datagrams in user space"]


def table_cells(m: dict) -> list[str]:
    st, snd = m["streams"], m.get("sender")
    kern = ", ".join(f"{k} {_n(v)}" for k, v in sorted(m["kernel_by_reason"].items(),
                                                       key=lambda kv: -kv[1]))
    rate = {"0": "–", "max": "max"}.get(m["rate"]) or _n(float(m["rate"]))
    return [m["path"], m["cls"], m["sources"], rate, _n(snd["rate"]) if snd else "–",
            _n(m["server_rx_pps"]), _p(m["ping_ms"]), f"{m['pings_lost']}/{m['pings']}",
            _p(st["ttft_ms"]), "–" if st["tok_s"] is None else f"{st['tok_s']:.1f}",
            f"{st['retried']}/{st['failed']}", f"{m['server_cpu_share']:.0%}",
            kern or "–", _n(m["user_space_datagrams"])]


def render(res: dict) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(table_cells(m)) + " |" for m in res["rows"]]
    meta, mach = res["meta"], res["meta"]["machine"]
    lines += ["", f"{mach.get('cpu_model')}, L3 {mach.get('l3_cache')}, {mach.get('nproc')} CPUs; "
              f"git {meta['git']}; {meta['date']}; loadavg before {meta['loadavg_before']}, "
              f"after {meta.get('loadavg_after')}"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", default=",".join(PATHS), help="of udp, xdp, llama")
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--sources", default="one,spoofed", help="of one, spoofed")
    ap.add_argument("--rates", default="10000,100000,max",
                    help="packets (requests) per second; max = the sender's ceiling")
    ap.add_argument("--pings", type=int, default=100)
    ap.add_argument("--ping-wait-s", type=float, default=0.5,
                    help="a PING with no answer by then counts as lost")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--stream-tokens", type=int, default=32)
    ap.add_argument("--flood-max-s", type=float, default=120,
                    help="time bound of each flood (it is stopped when its row is measured)")
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--sender-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=None,
                    help="the legitimate clients' CPU (default: the sender's, where they run "
                         "before it: its nice is 19); -1: not pinned")
    ap.add_argument("--ping-cpu", type=int, default=None,
                    help="the pinger's CPU (default: the server's, idle while the PINGs run); "
                         "-1: not pinned")
    ap.add_argument("--model", help="GGUF for llama-server (default: the bundled model)")
    ap.add_argument("--zl-extra", default="", help="more zerolayerd flags, one string")
    ap.add_argument("--lock-wait", type=float, default=1800)
    ap.add_argument("--out")
    ap.add_argument("--render", help="print the table of an earlier run's JSON and exit")
    a = ap.parse_args(argv)
    a.zl_extra = shlex.split(a.zl_extra)
    a.client_cpu = a.sender_cpu if a.client_cpu is None else a.client_cpu
    a.ping_cpu = a.server_cpu if a.ping_cpu is None else a.ping_cpu
    for what, allowed in (("paths", PATHS), ("classes", CLASSES), ("sources", ("one", "spoofed"))):
        setattr(a, what, [x for x in getattr(a, what).split(",") if x])
        if bad := set(getattr(a, what)) - set(allowed):
            ap.error(f"unknown {what} {sorted(bad)}; choose from {allowed}")
    a.rates = [r for r in a.rates.split(",") if r]
    if bad := [r for r in a.rates if r != "max" and not r.isdigit()]:
        ap.error(f"rates {bad}: neither a number nor max")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.render:
        print(render(json.loads(Path(a.render).read_text())))
        return 0
    if os.geteuid() != 0:
        print("needs root (namespaces, XDP, raw packets)", file=sys.stderr)
        return 2
    if "llama" in a.paths and not (LLAMA_BIN / "llama-server").exists():
        raise SystemExit(f"{LLAMA_BIN}/llama-server missing: run bash bench/setup_flood.sh")
    if a.model is None:
        from zerolayer.gpu.gguf_loader import default_model_path
        a.model = str(default_model_path())
    # SIGTERM unwinds like Ctrl-C, so the senders, servers and namespaces go in `finally`
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    lock, waited = take_lock(a.lock_wait, " ".join(sys.argv))
    res: dict = {"rows": [], "meta": run_meta(
        machine=machine_info(), git_dirty=sh(f"git -C {REPO} status --porcelain -- bench daemon bpf"),
        trafgen=sh("trafgen -v | head -1"), wrk=sh("wrk -v 2>&1 | head -1"),
        loadavg_before=os.getloadavg(), top_before=top_processes(5),
        lock_waited_s=round(waited, 1), args=dict(vars(a)))}
    if a.client_cpu >= 0:
        # (after machine_info, which counts the CPUs this process may use) this thread's
        # affinity, inherited by every client thread started after it
        os.sched_setaffinity(0, {a.client_cpu})
    tmp = Path(tempfile.mkdtemp(prefix="zl-bench-flood-"))
    try:
        with flood_testbed() as bed:
            res["meta"]["testbed"] = bed.name
            for path in a.paths:
                run_path(path, bed, tmp, a, res["rows"])
    finally:
        lock.close()
        res["meta"].update(loadavg_after=os.getloadavg(), top_after=top_processes(5))
        out = results_path(a.out, "flood")
        out.write_text(json.dumps(res, indent=1, default=str))
        log(f"results: {out}")
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
