"""The junk a flood sends, as real wire-format datagrams, and netsniff-ng trafgen's byte
configuration for them.

Each class is one or more datagrams built with protocol/wire.py (so they are exactly what a
client, a broken client or an attacker would put on the wire), wrapped in Ethernet/IPv4/UDP
headers and written out as a trafgen packet configuration. trafgen cycles through the packets
of a configuration, so a class with several variants (malformed: bad magic, version, length)
sends them in turn. With `spoof`, the IPv4 source is rewritten per packet at run time (trafgen's
drnd/dinc) inside SPOOF_NET, and the header checksum recomputed by trafgen (csumip); the UDP
checksum is 0 (none, legal over IPv4), so no per-packet UDP checksum work is needed.

`classify` decides which class a datagram belongs to with the protocol's own parser and the
daemon's order of checks (daemon/ingress.py): the test decodes what trafgen really sends with it.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import time
from dataclasses import dataclass

from zerolayer.client.invoke_body import build_invoke_body
from zerolayer.protocol import wire, xdp_tag
from zerolayer.protocol.errors import MalformedError
from zerolayer.protocol.wire import ChatMessage, MsgType

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


@dataclass(frozen=True)
class Endpoints:
    src_mac: bytes
    dst_mac: bytes
    src_ip: bytes
    dst_ip: bytes
    sport: int
    dport: int


def _now_us() -> int:
    return time.time_ns() // 1000


def _invoke(key_id: int, secret: bytes, ts_us: int) -> bytes:
    """One single-fragment chat INVOKE for one token: a real request, as the SDK builds it."""
    body = build_invoke_body(None, [ChatMessage("user", "Say hi.")], None, max_tokens=1,
                             temperature=0.0, top_k=0, top_p=1.0, seed=None, stop=())
    (dg,) = wire.encode_invoke(key_id, secret, secrets.token_bytes(wire.REQUEST_ID_LEN), ts_us,
                               secrets.token_bytes(wire.NONCE_LEN), body)
    return dg


def datagrams(cls: str, key_id: int, secret: bytes) -> list[bytes]:
    """The datagrams of one junk class, signed (where signed) with the daemon's real key."""
    now = _now_us()
    if cls == "malformed":
        ping = wire.encode_control(MsgType.PING, key_id, secret,
                                   secrets.token_bytes(wire.REQUEST_ID_LEN), now,
                                   secrets.token_bytes(wire.NONCE_LEN))
        bad_magic = b"XXXX" + ping[4:]
        bad_version = ping[:4] + bytes([wire.VERSION + 1]) + ping[5:]
        bad_length = ping[:8] + struct.pack("<H", len(ping) + 16) + ping[10:]
        return [bad_magic, bad_version, bad_length]
    if cls == "unknown_key":
        return [_invoke(UNKNOWN_KEY_ID, secrets.token_bytes(32), now)]
    if cls == "stale_timestamp":
        return [_invoke(key_id, secret, now - STALE_S * 1_000_000)]
    if cls == "wrong_mac":
        dg = _invoke(key_id, secret, now)
        return [dg[:-wire.TAG_LEN] + secrets.token_bytes(wire.TAG_LEN)]
    if cls == "forged_tag":
        dg = bytearray(_invoke(key_id, secret, now))
        flags = struct.unpack_from("<H", dg, FLAGS_OFF)[0] | wire.XDP_TAG
        struct.pack_into("<H", dg, FLAGS_OFF, flags)
        dg[xdp_tag.OFFSET:xdp_tag.OFFSET + xdp_tag.LEN] = secrets.token_bytes(xdp_tag.LEN)
        dg[-wire.TAG_LEN:] = secrets.token_bytes(wire.TAG_LEN)
        return [bytes(dg)]
    if cls == "replay":
        # one valid request, captured: the first copy is served, every later one is a replay
        return [_invoke(key_id, secret, now)]
    raise ValueError(f"unknown junk class {cls!r}")


def classify(dg: bytes, keys: dict[int, bytes], now_us: int, skew_s: float = 300.0,
             seen: set[bytes] | None = None) -> str:
    """Which class the daemon's checks put a datagram in (daemon/ingress.py's order:
    structure, key id, XDP tag, HMAC, timestamp, nonce). `seen`: nonces already accepted
    (replays)."""
    try:
        req = wire.parse_request(dg)
    except MalformedError:
        return "malformed"
    if req.key_id not in keys:
        return "unknown_key"
    flags = struct.unpack_from("<H", dg, FLAGS_OFF)[0]
    if flags & wire.XDP_TAG and not xdp_tag.valid(xdp_tag.derive_key(keys[req.key_id]), dg):
        return "forged_tag"
    tag = hmac.new(keys[req.key_id], dg[:-wire.TAG_LEN], hashlib.sha256).digest()
    if not hmac.compare_digest(tag, dg[-wire.TAG_LEN:]):
        return "wrong_mac"
    if abs(req.timestamp_us - now_us) > skew_s * 1_000_000:
        return "stale_timestamp"
    if seen is not None:
        if req.nonce in seen:
            return "replay"
        seen.add(req.nonce)
    return "valid"


def ip_checksum(hdr: bytes) -> int:
    s = sum(struct.unpack(f"!{len(hdr) // 2}H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def frame(ep: Endpoints, payload: bytes) -> bytes:
    """Ethernet + IPv4 (checksummed, TTL 64, DF) + UDP (checksum 0) + payload."""
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
    head = fr[:IP_OFF + 10]                               # up to the checksum
    src = _hex(bytes(SPOOF_NET)) + ", drnd(1), dinc(0, 255, 1)"
    return ("{\n  " + _hex(head) + ",\n  csumip(%d, %d),\n  " % (IP_OFF, UDP_OFF - 1) + src
            + ",\n  " + _hex(fr[SRC_IP_OFF + 4:]) + "\n}\n")


def trafgen_config(cls: str, ep: Endpoints, key_id: int, secret: bytes, spoof: bool) -> str:
    dgs = datagrams(cls, key_id, secret)
    out = [f"/* zerolayer junk class {cls}, {'spoofed sources' if spoof else 'one source'} */\n"]
    out += [trafgen_packet(frame(ep, d), spoof) for d in dgs]
    return "".join(out)


def read_pcap(data: bytes) -> list[bytes]:
    """The frames of a classic pcap file (what `trafgen -o file.pcap` writes)."""
    magic = data[:4]
    end = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",
           b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}[magic]
    off, out = 24, []
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack_from(end + "IIII", data, off)
        out.append(data[off + 16:off + 16 + incl])
        off += 16 + incl
    return out


def split_frame(fr: bytes) -> tuple[bytes, bytes, bool]:
    """(IPv4 source, UDP payload, IPv4 checksum valid) of an Ethernet/IPv4/UDP frame."""
    ip = fr[IP_OFF:UDP_OFF]
    return ip[12:16], fr[PAYLOAD_OFF:], ip_checksum(ip) == 0
