"""bench_flood.py's helpers (bench/README.md): its three-namespace testbed, the junk it sends
(real wire-format datagrams, written out as netsniff-ng trafgen configurations), and its two
load generators (trafgen for UDP junk, wrk for wrong-key HTTP requests)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import struct
import subprocess
import time
import uuid
from collections import namedtuple
from pathlib import Path

from zerolayer.client.invoke_body import build_invoke_body
from zerolayer.protocol import wire, xdp_tag
from zerolayer.protocol.wire import ChatMessage, MsgType

# ---------------------------------------------------------------------------- the testbed

SRV_IF, FLD_IF = "zl-s", "fl-f"
SRV_V4, CLI_V4, FLD_V4 = "10.201.0.1", "10.201.0.2", "10.201.0.3"


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
    """NAME-srv (veth zl-s, SRV_V4: the server), NAME-cli (bridge br0, CLI_V4, joining zl-c,
    zl-s's peer, and fl-c: the legitimate clients), NAME-fld (veth fl-f, FLD_V4, fl-c's peer:
    the sender). The sender's packets reach the server's interface (and its XDP program)
    through the bridge as the clients' do, with socket buffers and qdisc of its own. Nothing
    is made in the caller's namespace; deleting the three (always) removes every device."""
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    srv, cli, fld = f"{name}-srv", f"{name}-cli", f"{name}-fld"
    try:
        for ns in (srv, cli, fld):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        # one queue each way, as scripts/xdp-testbed.sh: the daemon binds an AF_XDP socket
        # per RX queue, and a veth made without the numbers gets one per possible CPU
        one = ("numtxqueues", "1", "numrxqueues", "1")
        _ip("-n", srv, "link", "add", SRV_IF, *one, "type", "veth", "peer", "name", "zl-c",
            "netns", cli, *one)
        _ip("-n", fld, "link", "add", FLD_IF, "type", "veth", "peer", "name", "fl-c", "netns", cli)
        _ip("-n", cli, "link", "add", "br0", "type", "bridge")
        for port in ("zl-c", "fl-c"):
            _ip("-n", cli, "link", "set", port, "master", "br0", "up")
        for ns, dev, addr in ((srv, SRV_IF, SRV_V4), (cli, "br0", CLI_V4), (fld, FLD_IF, FLD_V4)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        # the server's default route points at the sender's namespace, as a real host's at
        # its upstream: replies to spoofed sources leave and are dropped there (that namespace
        # does not forward), as a router drops them on the way to nobody
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
# wrong_mac: an untagged invoke whose HMAC is wrong (an old client's layout: the XDP program
# passes untagged requests to the daemon unless [network] xdp_require_tag). forged_tag: what
# an attacker without the key sends to get past the kernel: the XDP_TAG flag set, the tag and
# the HMAC guessed (random); the kernel drops it (drop_bad_tag) in every configuration.
# spoofed sources: 10.203.0.0/16, outside every testbed subnet: what the server sends back (an
# unsigned ERROR on the UDP path) goes to its default route, the sender's namespace, which
# drops it, and never waits on ARP
SPOOF_NET = (10, 203)
UNKNOWN_KEY_ID = 0xDEAD
STALE_S = 3600          # far outside the daemon's ±300 s skew window
ETH_LEN, IP_LEN, UDP_LEN = 14, 20, 8
IP_OFF, UDP_OFF = ETH_LEN, ETH_LEN + IP_LEN
PAYLOAD_OFF = UDP_OFF + UDP_LEN
SRC_IP_OFF = IP_OFF + 12


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
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, IP_LEN + UDP_LEN + len(payload), 0,
                               0x4000, 64, 17, 0, ep.src_ip, ep.dst_ip))
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
            + src + ",\n  " + _hex(fr[SRC_IP_OFF + 4:]) + "\n}\n")


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


def rate_pps(rate: str) -> int | None:
    """'10000' -> 10000; 'max' -> None (the sender's ceiling: no pacing)."""
    return None if rate == "max" else int(rate)


# sent: packets (trafgen) or requests completed (wrk); seconds: the sender's own time sending
SenderResult = namedtuple("SenderResult", "sent seconds")


class Sender:
    """A generator started in `ns`, pinned to `cpu` at nice 19 (the legitimate clients that
    share its CPU run first), stopped by stop() with SIGINT (so it prints its own count), or
    after `bound_s` anyway. `workers`: how many forked workers named cmd[0] it ends with:
    trafgen pins each itself, the first to CPU 0 whatever its taskset (its -P counts workers,
    it cannot place them), so they are moved back to `cpu` once they exist."""

    def __init__(self, ns: str, cpu: int, cmd: list[str], bound_s: float, log: Path,
                 workers: int = 0):
        self.log = log
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, "timeout", "-s", "INT", "-k", "5", f"{bound_s:.0f}",
             "taskset", "-c", str(cpu), "nice", "-n", "19", *cmd],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if workers:
            pin_workers(self.proc, Path(cmd[0]).name, workers, cpu)

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


def pin_workers(root: subprocess.Popen, name: str, workers: int, cpu: int,
                wait_s: float = 10.0, hold_s: float = 0.3) -> None:
    """Wait until `workers` workers (workers_of) run below `root`; then keep them on `cpu` for
    `hold_s` (a worker pins itself right after its fork: a pin set before that would be
    undone). A generator that has already ended needs nothing."""
    deadline = time.monotonic() + wait_s
    while len(mine := workers_of(root.pid, name)) < workers:
        if root.poll() is not None:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(mine)} of {workers} {name} workers to pin to CPU {cpu} "
                               f"within {wait_s:.0f} s")
        time.sleep(0.01)
    until = time.monotonic() + hold_s
    while time.monotonic() < until:
        for p in mine:
            with contextlib.suppress(OSError):       # exited meanwhile
                os.sched_setaffinity(p, {cpu})
        time.sleep(0.01)


def trafgen(ns: str, dev: str, cpu: int, config: Path, rate: str, bound_s: float,
            log: Path, count: int | None = None) -> Sender:
    """trafgen with one worker (-P 1), leaving the host's socket-memory sysctls and IRQ
    affinity alone (its defaults change both, machine-wide); paced (-b NNNpps) or, for max,
    its TX ring at full speed. `count`: packets at most (default: the rate times bound_s)."""
    pps = rate_pps(rate)
    count = int((pps or CEILING_PPS_BOUND) * bound_s) if count is None else count
    cmd = ["trafgen", "-o", dev, "-i", str(config), "-P", "1", "-n", str(count),
           "--no-sock-mem", "--notouch-irq", *(["-b", f"{pps}pps"] if pps else [])]
    return Sender(ns, cpu, cmd, bound_s, log, workers=1)


def parse_trafgen(out: str) -> SenderResult:
    """trafgen's exit summary: 'N packets outgoing' and 'S sec, U usec on CPUk (...)'."""
    sent = re.search(r"(\d+) packets outgoing", out)
    took = re.search(r"(\d+) sec,\s+(\d+) usec on CPU", out)
    return SenderResult(int(sent.group(1)) if sent else 0,
                        int(took.group(1)) + int(took.group(2)) / 1e6 if took else 0.0)


def wrk(ns: str, cpu: int, url: str, api_key: str, rate: str, bound_s: float, tmp: Path,
        log: Path, connections: int = 64) -> Sender:
    pps = rate_pps(rate)
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
