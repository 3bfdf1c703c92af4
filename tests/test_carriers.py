"""The idle loop's poll of the shared-memory rings, as the carriers decide it: the server asks
`may_spin` and `spin` and knows nothing of shm, its clients or [shm] poll_us."""
from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from zerolayer.daemon.carriers import Carriers, ShmCarrier, UdpCarrier


class FakeShm:
    """What ShmCarrier asks of its ShmIngress here: its clients, and the poll itself."""

    def __init__(self, wrote: bool) -> None:
        self.conns: dict[int, object] = {}
        self.wrote = wrote
        self.spins: list[tuple[float, list]] = []

    def spin(self, seconds: float, other_fds: list) -> bool:
        self.spins.append((seconds, other_fds))
        return self.wrote


@pytest.fixture
def udp() -> Iterator[UdpCarrier]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    yield UdpCarrier(s, batch=8)
    s.close()


def test_no_shm_carrier_never_spins(udp: UdpCarrier) -> None:
    c = Carriers(udp)
    assert not c.may_spin and not c.spin([])


def test_spins_only_with_a_client_and_a_poll_time(udp: UdpCarrier) -> None:
    io = FakeShm(wrote=True)
    c = Carriers(udp, ShmCarrier(io, poll_s=0.0002))  # type: ignore[arg-type]
    assert not c.may_spin                  # no same-host client: sleep at once
    io.conns[3] = object()
    assert c.may_spin
    assert c.spin(["fd"]) and io.spins == [(0.0002, ["fd"])]
    io.wrote = False
    assert not c.spin([])                  # nothing came: the loop goes on to sleep


def test_poll_us_zero_turns_the_spin_off(udp: UdpCarrier) -> None:
    io = FakeShm(wrote=True)
    io.conns[3] = object()
    c = Carriers(udp, ShmCarrier(io))  # type: ignore[arg-type]
    assert not c.may_spin
