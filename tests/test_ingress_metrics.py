"""What the I/O thread counts as plain ints reaches Prometheus: datagrams and refusals by
code (added in at every collection, so a scrape is never behind), and UDP replies the
kernel refused for their destination."""
from __future__ import annotations

import secrets
import socket
import time

from zerolayer.daemon.auth import KeyStore, ReplayGuard
from zerolayer.daemon.carriers import UdpCarrier
from zerolayer.daemon.ingress import ControlRequest, Ingress, Rejected
from zerolayer.daemon.ops.metrics import Metrics
from zerolayer.daemon.reassembly import Reassembler
from zerolayer.protocol import wire
from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.wire import MsgType

KEY_ID = 7
SECRET = secrets.token_bytes(32)


def _ping(secret: bytes = SECRET, key_id: int = KEY_ID) -> bytes:
    return wire.encode_control(MsgType.PING, key_id, secret, secrets.token_bytes(16),
                               time.time_ns() // 1000, secrets.token_bytes(32), xdp_tag=True)


def _value(m: Metrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels or None)
    return 0.0 if v is None else v


def test_datagrams_and_refusals_are_counted_at_every_collection() -> None:
    m = Metrics()
    ing = Ingress(KeyStore(keys={KEY_ID: SECRET}), ReplayGuard(), Reassembler())
    m.pull_ingress(ing)
    good = _ping()
    forged = good[:-1] + bytes([good[-1] ^ 1])
    assert type(ing.feed(good)) is ControlRequest
    r = ing.feed(forged)
    assert type(r) is Rejected and r.code is ErrorCode.INVALID_SIGNATURE
    r = ing.feed(good)                      # the same PING again: a replay
    assert type(r) is Rejected and r.code is ErrorCode.EXPIRED_NONCE
    r = ing.feed(_ping(key_id=KEY_ID + 1))
    assert type(r) is Rejected and r.code is ErrorCode.UNKNOWN_KEY
    ing.feed(b"\x00" * 10)                  # malformed: too short for a header
    for _ in range(2):                      # a second collection adds nothing twice
        assert _value(m, "zerolayer_ingress_datagrams_total") == 5
        assert _value(m, "zerolayer_request_errors_total", code="INVALID_SIGNATURE") == 1
        assert _value(m, "zerolayer_request_errors_total", code="EXPIRED_NONCE") == 1
        assert _value(m, "zerolayer_request_errors_total", code="UNKNOWN_KEY") == 1
        assert _value(m, "zerolayer_request_errors_total", code="MALFORMED") == 1
        assert _value(m, "zerolayer_request_errors_total", code="OVERLOADED") == 0
    # the daemon's own direct counts (not ingress's) still add to the same series
    m.errors.labels(ErrorCode.OVERLOADED.name).inc()
    ing.feed(forged)
    assert _value(m, "zerolayer_request_errors_total", code="OVERLOADED") == 1
    assert _value(m, "zerolayer_request_errors_total", code="INVALID_SIGNATURE") == 2
    assert _value(m, "zerolayer_ingress_datagrams_total") == 6


def test_udp_replies_refused_for_their_destination_are_counted() -> None:
    """A reply to an address the kernel will not send to (here the broadcast address
    without SO_BROADCAST; a spoofed source with no route back fails alike) is dropped,
    counted in zerolayer_udp_undeliverable_total, and the reply to a real client still
    goes."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    cli.bind(("127.0.0.1", 0))
    cli.settimeout(5)
    try:
        m = Metrics()
        udp = UdpCarrier(srv, batch=8)
        udp.send([(b"a", ("255.255.255.255", 9)), (b"b", cli.getsockname())])
        udp.observe(m.carriers)
        assert _value(m, "zerolayer_udp_undeliverable_total") == 1
        assert cli.recvfrom(16)[0] == b"b"
        udp.send([(b"c", ("255.255.255.255", 9))] * 3 + [(b"d", cli.getsockname())])
        udp.observe(m.carriers)
        udp.observe(m.carriers)             # observing twice adds nothing twice
        assert _value(m, "zerolayer_udp_undeliverable_total") == 4
        assert cli.recvfrom(16)[0] == b"d"
    finally:
        srv.close()
        cli.close()
