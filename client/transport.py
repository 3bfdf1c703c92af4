"""How a request's datagrams reach the daemon: addresses, connectors and channels.

The SDK's reliability logic (request_machine.py) never touches a socket. It is driven by a
*channel*: one request's (or one PING's) two-way datagram path to the daemon. A *connector*
belongs to one Client and opens a channel per call:

- UDP (`("host", port)`, `"host:port"`, `"udp://host:port"`): each channel is its own
  connected UDP socket, so concurrent calls never see each other's datagrams and the kernel
  drops datagrams from anyone but the daemon's address.
- Same-host shared memory (`"shm:///run/zerolayer/shm.sock"`): one ring pair per Client,
  shared by its channels and demultiplexed by request id (client/shm_transport.py).

A channel's send is best effort, like UDP: a datagram that cannot be sent is lost, and the
request machine's timers retry. recv returns one datagram, or None when the wait ran out.
"""
from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from typing import Protocol, Union, runtime_checkable
from urllib.parse import parse_qs, urlsplit

# ("127.0.0.1", 7700), or a string "host:port" / "udp://host:port" / "shm:///path.sock";
# a fleet of daemons: a list of those UDP addresses, or "fleet://dns-name:port" (fleet.py)
Address = Union[tuple[str, int], str, Sequence[Union[tuple[str, int], str]]]
RECV_BUF = 2048


class Channel(Protocol):
    def send(self, datagram: bytes) -> None: ...
    def recv(self, timeout_s: float) -> bytes | None: ...
    def close(self) -> None: ...


@runtime_checkable
class Routed(Protocol):
    """A channel that can move its request to the next daemon of a fleet (fleet.py)."""
    @property
    def node(self) -> str: ...
    def failover(self) -> str | None: ...


class Connector(Protocol):
    def open(self, request_id: bytes) -> Channel: ...
    def close(self) -> None: ...


class AsyncChannel(Protocol):
    def send(self, datagram: bytes) -> None: ...
    async def recv(self, timeout_s: float) -> bytes | None: ...
    def close(self) -> None: ...


class AsyncConnector(Protocol):
    async def open(self, request_id: bytes) -> AsyncChannel: ...
    async def aclose(self) -> None: ...


def parse_address(address: Address) -> tuple[str, tuple[str, int] | str]:
    """("udp", (host, port)), ("shm", socket_path), or ("fleet", the address as given)."""
    if isinstance(address, str) and address.startswith("fleet://"):
        return "fleet", address
    if isinstance(address, list) or (isinstance(address, tuple) and address
                                     and not isinstance(address[0], str)):
        return "fleet", repr(address)
    if isinstance(address, tuple):
        host, port = address
        return "udp", (str(host), int(port))
    if not isinstance(address, str):
        raise ValueError(f"not an address: {address!r}")
    if "://" not in address:
        address = "udp://" + address
    u = urlsplit(address)
    if u.scheme == "udp":
        if u.hostname is None or u.port is None:
            raise ValueError(f"a UDP address needs a host and a port: {address!r}")
        return "udp", (u.hostname, u.port)
    if u.scheme == "shm":
        if not u.path:
            raise ValueError(f"an shm address needs the daemon's socket path: {address!r}")
        return "shm", u.path
    raise ValueError(f"unknown address scheme {u.scheme!r} (udp://host:port or shm:///path)")


def shm_busy_poll_us(address: Address) -> int:
    """"shm:///path?busy_poll_us=50": spin on the response ring up to 50 µs before sleeping
    on the doorbell (lower latency for a core's worth of spinning); default 0."""
    if not isinstance(address, str):
        return 0
    q = parse_qs(urlsplit(address).query)
    try:
        return max(0, int(q.get("busy_poll_us", ["0"])[0]))
    except ValueError:
        raise ValueError(f"busy_poll_us must be an integer: {address!r}") from None


def connector_for(address: Address) -> Connector:
    from .fleet import FleetConnector, parse_fleet
    nodes = parse_fleet(address)
    if nodes is not None:
        return FleetConnector(nodes)
    kind, where = parse_address(address)
    if kind == "shm":
        from .shm_transport import ShmConnector
        assert isinstance(where, str)
        return ShmConnector(where, busy_poll_us=shm_busy_poll_us(address))
    assert isinstance(where, tuple)
    return UdpConnector(where)


def async_connector_for(address: Address) -> AsyncConnector:
    from .fleet import AsyncFleetConnector, parse_fleet
    nodes = parse_fleet(address)
    if nodes is not None:
        return AsyncFleetConnector(nodes)
    kind, where = parse_address(address)
    if kind == "shm":
        from .shm_transport import AsyncShmConnector
        assert isinstance(where, str)
        return AsyncShmConnector(where)   # asyncio sleeps on the doorbell (add_reader)
    assert isinstance(where, tuple)
    return AsyncUdpConnector(where)


# -- UDP ------------------------------------------------------------------------------------

def _udp_socket(address: tuple[str, int]) -> socket.socket:
    family, stype, proto, _, sockaddr = socket.getaddrinfo(address[0], address[1],
                                                           type=socket.SOCK_DGRAM)[0]
    s = socket.socket(family, stype, proto)
    try:
        # connect(): the kernel then delivers only datagrams from the daemon's address to us.
        s.connect(sockaddr)
    except BaseException:
        s.close()
        raise
    return s


class UdpChannel:
    def __init__(self, address: tuple[str, int]) -> None:
        self._sock: socket.socket | None = _udp_socket(address)

    def send(self, datagram: bytes) -> None:
        if self._sock is None:
            return
        try:
            self._sock.send(datagram)
        except (ConnectionRefusedError, BlockingIOError):
            pass   # a lost datagram, as far as the protocol is concerned: timers will retry

    def recv(self, timeout_s: float) -> bytes | None:
        if self._sock is None:
            return None
        self._sock.settimeout(max(timeout_s, 1e-4))
        try:
            return self._sock.recv(RECV_BUF)
        except (TimeoutError, BlockingIOError):
            return None
        except OSError:      # ICMP port unreachable etc.: the daemon may be restarting
            time.sleep(min(timeout_s, 0.01))   # do not spin on a stream of ICMP errors
            return None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class UdpConnector:
    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address

    def open(self, request_id: bytes) -> UdpChannel:
        return UdpChannel(self.address)

    def close(self) -> None:
        pass


class _DatagramQueue(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.queue.put_nowait(data)

    def error_received(self, exc: Exception) -> None:
        pass         # ICMP port unreachable: the daemon may be restarting; timers retry


class AsyncUdpChannel:
    def __init__(self, transport: asyncio.DatagramTransport, proto: _DatagramQueue) -> None:
        self._transport: asyncio.DatagramTransport | None = transport
        self._queue = proto.queue

    def send(self, datagram: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.sendto(datagram)

    async def recv(self, timeout_s: float) -> bytes | None:
        if not self._queue.empty():
            return self._queue.get_nowait()
        try:
            return await asyncio.wait_for(self._queue.get(), max(timeout_s, 1e-4))
        except asyncio.TimeoutError:
            return None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None


class AsyncUdpConnector:
    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address

    async def open(self, request_id: bytes) -> AsyncUdpChannel:
        loop = asyncio.get_running_loop()
        sock = _udp_socket(self.address)
        sock.setblocking(False)
        transport, proto = await loop.create_datagram_endpoint(_DatagramQueue, sock=sock)
        return AsyncUdpChannel(transport, proto)

    async def aclose(self) -> None:
        pass
