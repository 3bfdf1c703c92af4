"""recvmmsg/sendmmsg through ctypes, on loopback, IPv4 and IPv6."""
from __future__ import annotations

import socket

import pytest

from zerolayer.daemon.carriers.udp_io import BatchedUDP


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


@pytest.mark.parametrize("n", [2, 12])  # the sendto path and the sendmmsg path
def test_a_refused_destination_costs_only_its_datagram(n):
    """A datagram the kernel refuses for its destination (here the broadcast address
    without SO_BROADCAST: EACCES, nothing leaves the host; a spoofed client's address with no
    route back fails the same way) is dropped and counted; the datagrams to others still go,
    and nothing raises into the I/O thread."""
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    try:
        ua, ub = BatchedUDP(a, batch=8, bufsize=1500), BatchedUDP(b, batch=8, bufsize=1500)
        bad = ("255.255.255.255", 9)
        items = [(bytes([i]), bad if i % 2 == 0 else b.getsockname()) for i in range(n)]
        assert ua.send_batch(items) == n
        assert ua.undeliverable == (n + 1) // 2
        got = []
        for _ in range(100):
            got += ub.recv_batch()
            if len(got) == n // 2:
                break
        assert [g[0] for g in got] == [bytes([i]) for i in range(1, n, 2)]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_each_datagram_gets_its_own_senders_address(family, host):
    """Senders' addresses are decoded once and then looked up: interleaved senders, within
    one batch and across batches, each get their own address back, also after the lookup
    table was emptied (it is bounded)."""
    srv = socket.socket(family, socket.SOCK_DGRAM)
    srv.bind((host, 0))
    clients = [socket.socket(family, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        for c in clients:
            c.bind((host, 0))
        u = BatchedUDP(srv, batch=4, bufsize=64)
        for rnd in range(3):
            sent = [(i, k) for k in range(3) for i in range(3)]   # 9 datagrams, 3 batches
            for i, k in sent:
                clients[i].sendto(bytes([i, k, rnd]), srv.getsockname())
            got = []
            for _ in range(100):
                got += u.recv_batch()
                if len(got) == len(sent):
                    break
            assert len(got) == len(sent)
            for data, addr in got:
                assert addr[:2] == clients[data[0]].getsockname()[:2]
            if rnd == 1:
                u._addrs.clear()
    finally:
        srv.close()
        for c in clients:
            c.close()
