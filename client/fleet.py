"""Several daemons behind one Client: rendezvous hashing on the request id.

    Client(["10.0.0.1:7433", "10.0.0.2:7433", "10.0.0.3:7433"], key_id, secret)
    Client("fleet://zerolayer.prod.svc:7433", key_id, secret)   # every A/AAAA record

Exactly-once needs a retry to land where the first attempt's result is cached. So every
request has one order of nodes, computed from its request id alone (highest random weight,
"rendezvous" hashing: the order of node n is SHA-256(request id ‖ n)), and all its attempts
go to the first node of that order. It moves to the next node only when the current one is
silent (no authenticated datagram for `failover_after_s`) or answers DRAINING. Any client
computes the same order for the same id, so a duplicate sent by another process, or after a
client restart, also reaches the node holding the result. Adding or removing a node moves
only the requests whose first node changed.

Each request keeps one UDP socket, so one source port (per address family) for all its
datagrams: an L4 balancer that hashes the 5-tuple keeps them on one node too.

The guarantee (docs/OPERATIONS.md, "Fleet"): exactly-once while a node lives. A request
whose node died mid-run runs again on the next node; the client sees a new run id (invoke()
starts over and reports it in InvokeResult.restarts; a stream that already handed out text
raises StreamRestartedError).
"""
from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from collections.abc import Sequence

from .address import FleetSpec, node_name, parse_fleet_spec

__all__ = ["AsyncFleetConnector", "FleetChannel", "FleetConnector", "Nodes", "node_name",
           "parse_fleet", "rendezvous_order"]

RECV_BUF = 2048
RESOLVE_EVERY_S = 30.0


def rendezvous_order(request_id: bytes, nodes: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """Nodes in the order this request tries them: the same in every client."""
    def weight(n: tuple[str, int]) -> bytes:
        return hashlib.sha256(request_id + node_name(n).encode()).digest()
    return sorted(nodes, key=weight, reverse=True)


def _resolve(host: str, port: int) -> list[tuple[str, int]]:
    seen: dict[tuple[str, int], None] = {}
    for _, _, _, _, sa in socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM):
        seen[(str(sa[0]), int(sa[1]))] = None
    return list(seen)


class Nodes:
    """The fleet's node list: fixed, or the records of one DNS name, re-resolved every
    RESOLVE_EVERY_S (a failed lookup keeps the last good list)."""

    def __init__(self, nodes: Sequence[tuple[str, int]] = (), dns: tuple[str, int] | None = None
                 ) -> None:
        self._dns = dns
        self._nodes = list(nodes) if dns is None else _resolve(*dns)
        self._resolved_at = time.monotonic()
        if not self._nodes:
            raise ValueError("a fleet needs at least one node")

    def current(self) -> list[tuple[str, int]]:
        if self._dns is not None and time.monotonic() - self._resolved_at > RESOLVE_EVERY_S:
            self._resolved_at = time.monotonic()
            try:
                self._nodes = _resolve(*self._dns) or self._nodes
            except OSError:
                pass
        return list(self._nodes)


def parse_fleet(address: object) -> Nodes | None:
    """A Nodes for a list of addresses or a "fleet://name:port" string; None otherwise."""
    spec: FleetSpec | None = parse_fleet_spec(address)
    if spec is None:
        return None
    return Nodes(spec.nodes, dns=spec.dns)


class _Route:
    """One request's position in its node order, and the socket per address family (one
    source port each) it sends from."""

    def __init__(self, order: list[tuple[str, int]]) -> None:
        self.order = order
        self.index = 0
        self.switches = 0
        self._sockaddrs: dict[int, tuple[int, tuple[str, int]]] = {}

    @property
    def node(self) -> tuple[str, int]:
        return self.order[self.index % len(self.order)]

    def failover(self) -> str | None:
        if len(self.order) < 2:
            return None
        self.index = (self.index + 1) % len(self.order)
        self.switches += 1
        return node_name(self.node)

    def sockaddr(self) -> tuple[int, tuple[str, int]]:
        i = self.index % len(self.order)
        if i not in self._sockaddrs:
            host, port = self.order[i]
            fam, _, _, _, sa = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
            self._sockaddrs[i] = (fam, (str(sa[0]), int(sa[1])))
        return self._sockaddrs[i]

    def from_node(self, addr: object) -> bool:
        if not isinstance(addr, tuple):
            return False
        host, port = self.node
        return (str(addr[0]), int(addr[1])) == (host, port) or (
            str(addr[0]).removeprefix("::ffff:"), int(addr[1])) == (host, port)


class FleetChannel:
    def __init__(self, order: list[tuple[str, int]]) -> None:
        self.route = _Route(order)
        self._socks: dict[int, socket.socket] = {}
        self._closed = False

    @property
    def node(self) -> str:
        return node_name(self.route.node)

    def failover(self) -> str | None:
        return self.route.failover()

    def _sock(self, family: int) -> socket.socket:
        s = self._socks.get(family)
        if s is None:
            s = self._socks[family] = socket.socket(family, socket.SOCK_DGRAM)
        return s

    def send(self, datagram: bytes) -> None:
        if self._closed:
            return
        fam, sa = self.route.sockaddr()
        try:
            self._sock(fam).sendto(datagram, sa)
        except (ConnectionRefusedError, BlockingIOError):
            pass           # lost, as far as the protocol is concerned: timers retry

    def recv(self, timeout_s: float) -> bytes | None:
        if self._closed:
            return None
        fam, _ = self.route.sockaddr()
        s = self._sock(fam)
        deadline = time.monotonic() + max(timeout_s, 1e-4)
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                dg, addr = s.recvfrom(RECV_BUF)
            except (TimeoutError, BlockingIOError):
                return None
            except OSError:
                time.sleep(min(left, 0.01))
                return None
            if self.route.from_node(addr):   # only the current node speaks for the request
                return dg
        return None

    def close(self) -> None:
        self._closed = True
        for s in self._socks.values():
            s.close()
        self._socks.clear()


class FleetConnector:
    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes

    def open(self, request_id: bytes) -> FleetChannel:
        return FleetChannel(rendezvous_order(request_id, self.nodes.current()))

    def close(self) -> None:
        pass


class _FleetProtocol(asyncio.DatagramProtocol):
    def __init__(self, channel: AsyncFleetChannel) -> None:
        self._ch = channel

    def datagram_received(self, data: bytes, addr: object) -> None:
        if self._ch.route.from_node(addr):
            self._ch.queue.put_nowait(data)

    def error_received(self, exc: Exception) -> None:
        pass


class AsyncFleetChannel:
    def __init__(self, order: list[tuple[str, int]]) -> None:
        self.route = _Route(order)
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._transports: dict[int, asyncio.DatagramTransport] = {}
        self._closed = False

    @property
    def node(self) -> str:
        return node_name(self.route.node)

    def failover(self) -> str | None:
        return self.route.failover()

    async def prepare(self) -> None:
        """One endpoint (one source port) per address family of the request's nodes."""
        loop = asyncio.get_running_loop()
        for host, port in self.route.order:
            fam = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][0]
            if fam not in self._transports:
                t, _ = await loop.create_datagram_endpoint(lambda: _FleetProtocol(self),
                                                           family=fam)
                self._transports[fam] = t

    def send(self, datagram: bytes) -> None:
        if self._closed:
            return
        fam, sa = self.route.sockaddr()
        t = self._transports.get(fam)
        if t is not None and not t.is_closing():
            t.sendto(datagram, sa)

    async def recv(self, timeout_s: float) -> bytes | None:
        if not self.queue.empty():
            return self.queue.get_nowait()
        try:
            return await asyncio.wait_for(self.queue.get(), max(timeout_s, 1e-4))
        except TimeoutError:
            return None

    def close(self) -> None:
        self._closed = True
        for t in self._transports.values():
            t.close()
        self._transports.clear()


class AsyncFleetConnector:
    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes

    async def open(self, request_id: bytes) -> AsyncFleetChannel:
        ch = AsyncFleetChannel(rendezvous_order(request_id, self.nodes.current()))
        await ch.prepare()
        return ch

    async def aclose(self) -> None:
        pass
