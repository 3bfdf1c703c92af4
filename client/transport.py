"""How a request's datagrams reach the daemon: the connector and channel interfaces.

The SDK's reliability logic (request_machine.py) never touches a socket. It is driven by a
*channel*: one request's (or one PING's) two-way datagram path to the daemon. A *connector*
belongs to one Client and opens a channel per call. The carriers that implement them:

- UDP (udp_transport.py): each channel is its own connected UDP socket, so concurrent calls
  never see each other's datagrams and the kernel drops datagrams from anyone but the
  daemon's address; a finished channel's socket serves a later call.
- Same-host shared memory (shm_transport.py): one ring pair per Client, shared by its
  channels and demultiplexed by request id.
- A fleet (fleet.py): a channel per request, sent to one node of the request's own order.

connect.py picks the carrier an address names (address.py); this module names only what
they have in common, and imports none of them.

A channel's send is best effort, like UDP: a datagram that cannot be sent is lost, and the
request machine's timers retry. recv returns one datagram, or None when the wait ran out.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


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
