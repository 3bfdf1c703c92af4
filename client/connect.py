"""Carrier dispatch: the connector for an address (address.py names the grammar).

    a fleet (a list, or "fleet://name:port")  -> FleetConnector: a node per request (fleet.py)
    "shm:///path.sock"                         -> ShmConnector: same-host rings (shm_transport.py)
    anything else UDP                          -> UdpConnector: a socket per call, reused

The clients call only these two functions, so a new carrier is one more branch here and
one more module beside the others, none of which imports this one.
"""
from __future__ import annotations

from .address import Address, parse_address, shm_busy_poll_us
from .fleet import AsyncFleetConnector, FleetConnector, parse_fleet
from .shm_transport import AsyncShmConnector, ShmConnector
from .transport import AsyncConnector, Connector
from .udp_transport import AsyncUdpConnector, UdpConnector


def connector_for(address: Address) -> Connector:
    nodes = parse_fleet(address)
    if nodes is not None:
        return FleetConnector(nodes)
    kind, where = parse_address(address)
    if kind == "shm":
        assert isinstance(where, str)
        return ShmConnector(where, busy_poll_us=shm_busy_poll_us(address))
    assert isinstance(where, tuple)
    return UdpConnector(where)


def async_connector_for(address: Address) -> AsyncConnector:
    nodes = parse_fleet(address)
    if nodes is not None:
        return AsyncFleetConnector(nodes)
    kind, where = parse_address(address)
    if kind == "shm":
        assert isinstance(where, str)
        return AsyncShmConnector(where)   # asyncio sleeps on the doorbell (add_reader)
    assert isinstance(where, tuple)
    return AsyncUdpConnector(where)
