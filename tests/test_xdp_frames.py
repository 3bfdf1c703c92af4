"""Reply framing for the AF_XDP path (daemon/carriers/xdp_frames.py), on hand-built frames: the
datagram is found behind Ethernet (+VLAN) / IPv4 or IPv6 / UDP, and the reply written in
place goes back with MACs, IPs and ports swapped and checksums a receiver accepts."""
from __future__ import annotations

import ipaddress
import struct

import pytest

from fixtures.packets import (
    DST4,
    DST6,
    DST_MAC,
    ETH_P_ARP,
    SRC4,
    SRC6,
    SRC_MAC,
    checksum16,
    eth,
    ipv4,
    udp4,
    udp6,
)
from zerolayer.daemon.carriers.xdp_frames import ipv4_header_ok, parse_frame, write_reply

PORT = 7433


def reply(frame: bytes, payload: bytes, queue: int = 0):
    got = parse_frame(memoryview(frame), queue, {})
    assert got is not None
    data, peer = got
    buf = bytearray(4096)
    n = write_reply(memoryview(buf), peer, payload)
    return data, peer, bytes(buf[:n])


@pytest.mark.parametrize("vlan", [None, 42])
@pytest.mark.parametrize("size", [1, 37, 1400])
def test_ipv4_reply_swaps_everything_and_checksums(vlan, size):
    req = bytes(range(256)) * 6
    data, peer, out = reply(udp4(req[:200], PORT, vlan=vlan), req[:size])
    assert data == req[:200]
    assert (peer.host, peer.port) == (SRC4, 40000) and peer[0] == SRC4
    assert out[0:6] == SRC_MAC and out[6:12] == DST_MAC
    ip = 14 + (4 if vlan is not None else 0)
    if vlan is not None:
        assert struct.unpack_from("!HH", out, 12) == (0x8100, 42)
    assert ipv4_header_ok(out, ip)
    ver, _, total, _, flags, ttl, proto = struct.unpack_from("!BBHHHBB", out, ip)
    assert (ver, total, flags & 0x4000, ttl, proto) == (0x45, 20 + 8 + size, 0x4000, 64, 17)
    assert out[ip + 12:ip + 16] == ipaddress.IPv4Address(DST4).packed
    assert out[ip + 16:ip + 20] == ipaddress.IPv4Address(SRC4).packed
    sport, dport, ulen, csum = struct.unpack_from("!HHHH", out, ip + 20)
    assert (sport, dport, ulen, csum) == (PORT, 40000, 8 + size, 0)  # 0 = no checksum (IPv4)
    assert out[ip + 28:] == req[:size]


@pytest.mark.parametrize("options", [b"\x01\x01\x01\x00", b"\x94\x04\x00\x00" + bytes(36)])
def test_ipv4_options_are_stepped_over_and_left_out_of_the_reply(options):
    """PROTOCOL.md §10: a request whose IPv4 header carries options (a Router Alert, padding
    up to the 60-byte maximum) is served; the reply is a plain 20-byte IPv4 header."""
    data, peer, out = reply(udp4(b"request", PORT, options=options), b"answer")
    assert data == b"request" and (peer.host, peer.port) == (SRC4, 40000)
    assert out[14] == 0x45 and ipv4_header_ok(out, 14)
    assert struct.unpack_from("!HHH", out, 14 + 20) == (PORT, 40000, 8 + 6)
    assert out[14 + 28:] == b"answer"


@pytest.mark.parametrize("size", [1, 2, 999, 1400])
def test_ipv6_reply_has_a_valid_udp_checksum(size):
    payload = bytes((i * 7) & 0xFF for i in range(size))
    _, peer, out = reply(udp6(b"x" * 64, PORT), payload)
    ip = 14
    plen, nh, hops = struct.unpack_from("!HBB", out, ip + 4)
    assert (out[ip] >> 4, plen, nh, hops) == (6, 8 + size, 17, 64)
    src, dst = out[ip + 8:ip + 24], out[ip + 24:ip + 40]
    assert src == ipaddress.IPv6Address(DST6).packed and dst == ipaddress.IPv6Address(SRC6).packed
    l4 = out[ip + 40:]
    assert struct.unpack_from("!HH", l4) == (PORT, 40000)
    assert struct.unpack_from("!H", l4, 6)[0] != 0  # IPv6 forbids "no checksum"
    pseudo = src + dst + struct.pack("!IxxxB", len(l4), 17)
    assert checksum16(pseudo + l4) == 0  # the receiver's verification


def test_one_peer_per_client_flow():
    peers: dict = {}
    a = parse_frame(memoryview(udp4(b"a", PORT)), 0, peers)[1]
    b = parse_frame(memoryview(udp4(b"b", PORT)), 0, peers)[1]
    c = parse_frame(memoryview(udp4(b"c", PORT, sport=40001)), 0, peers)[1]
    d = parse_frame(memoryview(udp4(b"d", PORT)), 1, peers)[1]
    assert a is b and a != c and a != d and len(peers) == 3


@pytest.mark.parametrize("frame", [
    eth(b"\0" * 40, ETH_P_ARP),
    udp4(b"x", PORT)[:30],
    eth(ipv4(b"\0" * 20, proto=6), 0x0800),
    udp4(b"hello", PORT)[:-2],          # UDP length says more than the frame has
], ids=["arp", "truncated", "tcp", "udp-len-lies"])
def test_what_is_not_a_udp_datagram_is_refused(frame):
    assert parse_frame(memoryview(frame), 0, {}) is None
