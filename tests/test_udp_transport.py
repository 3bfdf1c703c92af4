"""The UDP carrier's socket reuse (client/udp_transport.py), seen from a loopback responder:
a finished channel's socket serves the next call, concurrent channels never share one, what a
finished call left queued does not reach the next, and a socket that saw an error is dropped."""
from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from zerolayer.client.udp_transport import IDLE_SOCKETS, UdpChannel, UdpConnector


@pytest.fixture
def server() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(5.0)
    yield s
    s.close()


def _source_of(server: socket.socket, payload: bytes) -> tuple[str, int]:
    data, addr = server.recvfrom(2048)
    assert data == payload
    return addr


def _opened(conn: UdpConnector, server: socket.socket, payload: bytes
            ) -> tuple[UdpChannel, tuple[str, int]]:
    """A channel of conn that has sent payload, and the source address the server saw."""
    ch = conn.open(payload)
    ch.send(payload)
    return ch, _source_of(server, payload)


def test_a_finished_channels_socket_serves_the_next_call(server: socket.socket) -> None:
    conn = UdpConnector(server.getsockname())
    first, src1 = _opened(conn, server, b"one")
    server.sendto(b"reply", src1)
    assert first.recv(5.0) == b"reply"
    first.close()
    second, src_second = _opened(conn, server, b"two")
    assert src_second == src1
    second.close()
    conn.close()


def test_concurrent_channels_have_their_own_sockets(server: socket.socket) -> None:
    conn = UdpConnector(server.getsockname())
    chans = [conn.open(bytes([i])) for i in range(IDLE_SOCKETS + 2)]
    sources = []
    for i, ch in enumerate(chans):
        ch.send(b"x%d" % i)
        sources.append(_source_of(server, b"x%d" % i))
    assert len(set(sources)) == len(chans)
    for i, src in enumerate(sources):   # each gets only what was sent to it
        server.sendto(b"to%d" % i, src)
    assert [ch.recv(5.0) for ch in chans] == [b"to%d" % i for i in range(len(chans))]
    for ch in chans:
        ch.close()
    # only IDLE_SOCKETS are kept: the next calls reuse those and no others
    again = [conn.open(b"z") for _ in range(IDLE_SOCKETS + 2)]
    for i, ch in enumerate(again):
        ch.send(b"y%d" % i)
    reused = {_source_of(server, b"y%d" % i) for i in range(len(again))} & set(sources)
    assert len(reused) == IDLE_SOCKETS
    for ch in again:
        ch.close()
    conn.close()


def test_what_a_finished_call_left_queued_is_not_read_by_the_next(server: socket.socket) -> None:
    conn = UdpConnector(server.getsockname())
    first, src = _opened(conn, server, b"one")
    server.sendto(b"late frame of the first call", src)
    server.sendto(b"another", src)
    # wait until both sit in the socket's queue, then finish the call without reading them
    peek = socket.socket(fileno=first._sock.fileno())     # type: ignore[union-attr]
    try:
        peek.settimeout(5.0)
        while len(peek.recv(2048, socket.MSG_PEEK)) != len(b"late frame of the first call"):
            pass
    finally:
        peek.detach()
    first.close()
    second = conn.open(b"b")
    second.send(b"two")
    assert _source_of(server, b"two") == src          # the same socket ...
    server.sendto(b"fresh", src)
    assert second.recv(5.0) == b"fresh"               # ... with nothing of the first call
    second.close()
    conn.close()


def test_a_socket_that_saw_an_error_is_not_reused(server: socket.socket) -> None:
    addr = server.getsockname()
    server.close()                                    # the daemon is gone: ICMP unreachable
    conn = UdpConnector(addr)
    first = conn.open(b"a")
    first.send(b"one")
    assert first.recv(0.05) is None                   # the refusal, absorbed as a loss
    port1 = first._sock.getsockname()[1]              # type: ignore[union-attr]
    first.close()
    second = conn.open(b"b")
    assert second._sock.getsockname()[1] != port1     # type: ignore[union-attr]
    second.close()
    conn.close()


def test_close_releases_the_kept_sockets(server: socket.socket) -> None:
    conn = UdpConnector(server.getsockname())
    ch, src = _opened(conn, server, b"one")
    ch.close()
    conn.close()
    later = conn.open(b"b")           # a closed connector still works, with a new socket
    later.send(b"two")
    assert _source_of(server, b"two") != src
    later.close()
    conn.close()
