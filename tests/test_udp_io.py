"""recvmmsg/sendmmsg through ctypes, on loopback, IPv4 and IPv6."""
from __future__ import annotations

import socket

import pytest

from zerolayer.daemon.udp_io import BatchedUDP


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_batch_round_trip(family, host):
    a = socket.socket(family, socket.SOCK_DGRAM)
    b = socket.socket(family, socket.SOCK_DGRAM)
    a.bind((host, 0))
    b.bind((host, 0))
    try:
        ua, ub = BatchedUDP(a, batch=8, bufsize=1500), BatchedUDP(b, batch=8, bufsize=1500)
        assert ua.native
        payloads = [bytes([i]) * (i * 37 + 1) for i in range(20)]  # more than one batch
        assert ua.send_batch([(p, b.getsockname()) for p in payloads]) == 20
        got = []
        for _ in range(100):
            got += ub.recv_batch()
            if len(got) == 20:
                break
        assert [g[0] for g in got] == payloads
        assert all(g[1][:2] == a.getsockname()[:2] for g in got)
        assert ub.recv_batch() == []  # nothing waiting: no block, no error
        # a reply to the decoded source address arrives
        ub.send_batch([(b"pong", got[0][1])])
        a.settimeout(2)
        assert a.recvfrom(100)[0] == b"pong"
        # an oversize datagram arrives cut to bufsize, never overflowing
        a.sendto(b"x" * 3000, b.getsockname())
        for _ in range(100):
            r = ub.recv_batch()
            if r:
                assert len(r[0][0]) == 1500
                break
    finally:
        a.close()
        b.close()
