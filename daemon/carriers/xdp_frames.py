"""Ethernet/IP/UDP framing for the AF_XDP path: find the datagram in a received frame, and
write a reply frame in place in the UMEM.

The XDP program has already checked everything structural (bpf/pckt_parsing.h: one optional
VLAN tag, IPv4 (options stepped over) without fragments, IPv6 with UDP as the next header, UDP
lengths),
so parsing here only locates fields. A frame that still doesn't parse is counted and dropped.

A reply goes back the way the request came: MACs, IPs and ports swapped, the VLAN tag kept,
IPv4 options (if the request had any) left out.
Those swapped headers are computed once per client flow (a Peer) and copied in front of each
reply payload, straight into the TX frame. Checksums: IPv4 gets a correct header checksum
(the constant part is summed once per peer; only the length changes) and a UDP checksum of 0
("none", allowed for IPv4); IPv6 forbids a zero UDP checksum, so it is computed over the
pseudo-header and payload. Checksums of received frames are not checked here: on veth and lo
they are only partial (CHECKSUM_PARTIAL), and the HMAC covers every byte that matters.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

ETH_P_IP, ETH_P_IPV6, ETH_P_8021Q, ETH_P_8021AD = 0x0800, 0x86DD, 0x8100, 0x88A8
IPPROTO_UDP = 17
ETH_LEN, VLAN_LEN, IPV4_LEN, IPV6_LEN, UDP_LEN = 14, 4, 20, 40, 8
TTL = 64


@dataclass(frozen=True, eq=True)
class Peer:
    """Where a reply goes over AF_XDP: the queue socket it came in on and the swapped headers.

    It stands in for the (host, port) tuple of the UDP path: the daemon stores it with a
    request and hands it back with each frame to send; equality is per client flow."""
    queue: int
    header: bytes = field(repr=False)   # eth [+vlan] + ip + udp, swapped, lengths/csums 0
    ip_off: int = field(repr=False)
    ipv6: bool = False
    host: str = ""                      # the client's address, for logs
    port: int = 0
    _ip_sum: int = field(default=0, repr=False, compare=False)   # IPv4: header sum sans length
    _pseudo_sum: int = field(default=0, repr=False, compare=False)  # IPv6: addresses + proto

    def __getitem__(self, i: int) -> str | int:  # logs and tests read peer[0], peer[1] like a socket address
        return (self.host, self.port)[i]


def _fold(s: int) -> int:
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def _sum16(b: bytes | npt.NDArray[np.uint8]) -> int:
    """One's-complement sum of big-endian 16-bit words (odd length padded with a zero)."""
    a = np.frombuffer(b, np.uint8) if isinstance(b, (bytes, bytearray, memoryview)) else b
    if len(a) & 1:
        a = np.concatenate([a, np.zeros(1, np.uint8)])
    w = a.view(">u2")
    return int(w.sum(dtype=np.uint64))


def parse_frame(frame: memoryview, queue: int, peers: dict) -> tuple[bytes, Peer] | None:
    """(UDP payload, Peer) of a received frame, or None when it is not IPv4/IPv6 UDP.

    `peers` caches Peer objects by the raw address bytes, so a client's replies reuse one
    object (and its precomputed sums) across datagrams."""
    if len(frame) < ETH_LEN + IPV4_LEN + UDP_LEN:
        return None
    # One copy of the frame, then bytes slicing and indexing: each memoryview slice turned
    # into bytes, or indexed, cost more than the whole copy of a datagram-sized frame.
    b = frame.tobytes()
    off = 12
    etype = (b[off] << 8) | b[off + 1]
    if etype in (ETH_P_8021Q, ETH_P_8021AD):
        off += VLAN_LEN
        etype = (b[off] << 8) | b[off + 1]
    ip = off + 2
    if etype == ETH_P_IP:
        if b[ip] >> 4 != 4 or b[ip] & 0xF < 5 or b[ip + 9] != IPPROTO_UDP:
            return None
        udp = ip + (b[ip] & 0xF) * 4
        key = b[0:ip] + b[ip + 12:ip + 20] + b[udp:udp + 4]
    elif etype == ETH_P_IPV6:
        if b[ip + 6] != IPPROTO_UDP:
            return None
        udp = ip + IPV6_LEN
        key = b[0:ip] + b[ip + 8:ip + 40] + b[udp:udp + 4]
    else:
        return None
    if len(b) < udp + UDP_LEN:
        return None
    ulen = (b[udp + 4] << 8) | b[udp + 5]
    if ulen < UDP_LEN or udp + ulen > len(b):
        return None
    payload = b[udp + UDP_LEN:udp + ulen]
    pk = (queue, key)
    peer = peers.get(pk)
    if peer is None:
        peer = _make_peer(b[:udp + UDP_LEN], queue, ip, udp, etype == ETH_P_IPV6)
        if len(peers) >= 65536:  # a bounded cache: a spoofing flood can't grow it forever
            peers.clear()
        peers[pk] = peer
    return payload, peer


def _make_peer(h: bytes, queue: int, ip: int, udp_in: int, ipv6: bool) -> Peer:
    """`h`: the request's headers up to the end of UDP, whose header starts at udp_in."""
    out = bytearray(ip + (IPV6_LEN if ipv6 else IPV4_LEN) + UDP_LEN)
    out[0:6], out[6:12] = h[6:12], h[0:6]           # MACs swapped
    out[12:ip] = h[12:ip]                           # VLAN tag (if any) and ethertype kept
    if ipv6:
        out[ip:ip + 4] = b"\x60\x00\x00\x00"        # version 6, no traffic class/flow label
        out[ip + 6], out[ip + 7] = IPPROTO_UDP, TTL
        out[ip + 8:ip + 24], out[ip + 24:ip + 40] = h[ip + 24:ip + 40], h[ip + 8:ip + 24]
        udp = ip + IPV6_LEN
        pseudo = _sum16(bytes(out[ip + 8:ip + 40])) + IPPROTO_UDP
        host = socket.inet_ntop(socket.AF_INET6, h[ip + 8:ip + 24])
    else:
        out[ip] = 0x45
        out[ip + 6] = 0x40                          # DF: replies are never fragmented
        out[ip + 8], out[ip + 9] = TTL, IPPROTO_UDP
        out[ip + 12:ip + 16], out[ip + 16:ip + 20] = h[ip + 16:ip + 20], h[ip + 12:ip + 16]
        udp = ip + IPV4_LEN
        pseudo = 0
        host = socket.inet_ntop(socket.AF_INET, h[ip + 12:ip + 16])
    out[udp:udp + 2], out[udp + 2:udp + 4] = h[udp_in + 2:udp_in + 4], h[udp_in:udp_in + 2]
    ip_sum = 0 if ipv6 else _sum16(bytes(out[ip:ip + IPV4_LEN]))
    port = struct.unpack_from("!H", h, udp_in)[0]
    return Peer(queue, bytes(out), ip, ipv6, host, port, ip_sum, pseudo)


def write_reply(buf: memoryview, peer: Peer, payload: bytes) -> int:
    """Write peer's headers + payload at the start of `buf` (a UMEM frame); returns the
    frame length."""
    h = peer.header
    hl = len(h)
    n = hl + len(payload)
    buf[:hl] = h
    buf[hl:n] = payload
    ip = peer.ip_off
    ulen = UDP_LEN + len(payload)
    udp = hl - UDP_LEN
    struct.pack_into("!H", buf, udp + 4, ulen)
    if peer.ipv6:
        struct.pack_into("!H", buf, ip + 4, ulen)
        # pseudo-header (addresses, next header, length) + UDP header + payload
        s = peer._pseudo_sum + ulen + _sum16(np.frombuffer(buf[udp:n], np.uint8))
        csum = (~_fold(s)) & 0xFFFF
        struct.pack_into("!H", buf, udp + 6, csum or 0xFFFF)
    else:
        total = IPV4_LEN + ulen
        struct.pack_into("!H", buf, ip + 2, total)
        struct.pack_into("!H", buf, ip + 10, (~_fold(peer._ip_sum + total)) & 0xFFFF)
        # UDP checksum 0 = none (header template already has it 0)
    return n


def ipv4_header_ok(frame: bytes, ip: int) -> bool:
    """True when an IPv4 header's checksum verifies (used by tests)."""
    return _fold(_sum16(frame[ip:ip + IPV4_LEN])) == 0xFFFF
