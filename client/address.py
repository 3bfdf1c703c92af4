"""One grammar for a daemon's address, for the SDK and the `zerolayer` command line alike.

    ("host", port)                          a UDP daemon
    "host:port", "[v6addr]:port"            the same as text ("udp://" in front is allowed)
    "shm:///run/zerolayer/shm.sock"         same-host shared memory (?busy_poll_us=N)
    "fleet://dns-name:port"                 a fleet: every A/AAAA record of the name
    ["host:port", ("host", port), ...]      a fleet of the listed UDP daemons

The command line also takes "host" and ":port" (its defaults fill in the rest); the SDK
needs both. A bare IPv6 address needs its brackets: "::1:7433" could be read two ways.

Only parsing lives here, no I/O: a fleet's DNS name is resolved by fleet.py and carriers
are chosen by connect.py, so every module of the package can import this one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

HostPort = tuple[str, int]
Address = HostPort | str | Sequence[HostPort | str]


def node_name(addr: HostPort) -> str:
    """"host:port", or "[v6addr]:port": the form a fleet hashes and a user reads."""
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_host_port(text: str, *, default_host: str | None = None,
                    default_port: int | None = None) -> HostPort:
    """HOST:PORT or [V6ADDR]:PORT → (host, port); HOST, :PORT and [V6ADDR] only where a
    default fills the gap. Raises ValueError. Host names are case-insensitive, so they are
    lower-cased: every client then hashes a fleet node by the same name."""
    s = text.strip()
    if s.startswith("["):
        host, sep, rest = s[1:].partition("]")
        if not sep or not host or (rest and not rest.startswith(":")):
            raise ValueError(f"bad address {text!r}: expected [IPV6]:PORT")
        port_s = rest[1:] if rest else ""
    elif s.count(":") > 1:
        raise ValueError(f"bad address {text!r}: write an IPv6 address as [ADDR]:PORT")
    else:
        host, _, port_s = s.partition(":")
    host = _lower_host(host) or default_host or ""
    if not host:
        raise ValueError(f"bad address {text!r}: no host")
    if not port_s:
        if default_port is None:
            raise ValueError(f"bad address {text!r}: no port")
        return host, default_port
    if not port_s.isdigit() or not 1 <= int(port_s) <= 65535:
        raise ValueError(f"bad address {text!r}: port must be 1..65535")
    return host, int(port_s)


def _lower_host(host: str) -> str:
    # An IPv6 zone ("fe80::1%eth0") names an interface, whose name keeps its case.
    addr, pct, zone = host.partition("%")
    return addr.lower() + pct + zone


def is_fleet(address: object) -> bool:
    """A list of addresses, a tuple of them, or "fleet://...": many daemons, not one."""
    if isinstance(address, str):
        return address.startswith("fleet://")
    return isinstance(address, list) or (isinstance(address, tuple) and bool(address)
                                         and not isinstance(address[0], str))


def parse_address(address: Address) -> tuple[str, HostPort | str]:
    """("udp", (host, port)), ("shm", socket_path), or ("fleet", the address as given)."""
    if is_fleet(address):
        return "fleet", address if isinstance(address, str) else repr(address)
    if isinstance(address, tuple):
        host, port = address
        return "udp", (str(host), int(port))
    if not isinstance(address, str):
        raise ValueError(f"not an address: {address!r}")
    scheme, sep, rest = address.partition("://")
    if not sep:
        return "udp", parse_host_port(address)
    if scheme == "udp":
        return "udp", parse_host_port(rest.partition("/")[0])
    if scheme == "shm":
        path = urlsplit(address).path
        if not path:
            raise ValueError(f"an shm address needs the daemon's socket path: {address!r}")
        return "shm", path
    raise ValueError(f"unknown address scheme {scheme!r} (udp://host:port or shm:///path)")


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


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """A fleet as written: fixed nodes, or one DNS name whose records are the nodes."""
    nodes: tuple[HostPort, ...] = ()
    dns: HostPort | None = None


def parse_fleet_spec(address: object) -> FleetSpec | None:
    """The fleet an address names, unresolved; None if it names one daemon."""
    if not is_fleet(address):
        return None
    if isinstance(address, str):
        try:
            return FleetSpec(dns=parse_host_port(address.removeprefix("fleet://")
                                                 .partition("/")[0]))
        except ValueError:
            raise ValueError(
                f"a fleet address needs a DNS name and a port: {address!r}") from None
    assert isinstance(address, (list, tuple))
    nodes: list[HostPort] = []
    for a in address:
        kind, where = parse_address(a)
        if kind != "udp" or not isinstance(where, tuple):
            raise ValueError(f"fleet nodes are UDP addresses, got {a!r}")
        nodes.append(where)
    return FleetSpec(nodes=tuple(nodes))
