"""The ways datagrams reach the daemon and replies leave it: UDP, AF_XDP and same-host
shared memory, each a `Carrier`, and `Carriers`, the set the I/O loop turns over.

Above this module nothing knows which way a request came. Every received datagram comes
with its `Address`, an object its carrier made: a (host, port) tuple for UDP, an
`xdp_frames.Peer` (queue and swapped headers) for AF_XDP, an `shm_ingress.ShmConn` for a
same-host client. The request keeps it (`Request.addr`) and hands it back with each frame;
`Carriers.send` gives each frame to the first carrier that `owns` its address, so a reply
goes back the way its request came. UDP is last and owns a `Peer` too: after `xdp-detach`
the kernel's UDP path reaches those clients (same host and port), so they lose no frame.

The loop's costs, per turn: AF_XDP and the shm rings are memory reads, so they are read
every turn; UDP is a syscall, so with AF_XDP attached and busy polling on it is read every
8th turn only (it then gets only what the XDP program passes on). The shm carrier's socket
events (accepts, hang-ups, doorbells: one epoll_wait) are looked at on the same schedule.
"""
from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Protocol

from .carrier_metrics import CarrierMetrics
from .shm_ingress import ShmConn, ShmIngress, open_from_config
from .udp_io import BatchedUDP
from .xdp_frames import Peer

if TYPE_CHECKING:
    from zerolayer.bpf.kernel_keys import KernelKeys

    from ..config import NetworkSection, ShmSection
    from ..json_value import JSONObject
    from ..ops.logs import Log
    from .xdp_io import XdpIO

UdpAddr = tuple  # (host, port) or (host, port, flowinfo, scope_id), as the socket module has it
Address = UdpAddr | Peer | ShmConn
Frames = list[tuple[bytes, Address]]
RARE = 8   # turns between the busy loop's looks at what costs a syscall


class Carrier(Protocol):
    more: bool      # the last recv_batch filled its batch: more may be waiting

    def fds(self) -> list:
        """What the loop's select() waits on when it sleeps (objects with fileno())."""
        ...

    def owns(self, addr: Address) -> bool: ...

    def recv_batch(self, turn: int, busy: bool) -> Frames:
        """At most one batch of datagrams, never blocking; [] when it skips this turn."""
        ...

    def send(self, frames: Frames) -> None:
        """Queue every frame (all owned by this carrier); a frame with nowhere to go (a ring
        full, a client gone) is dropped and counted: the protocol's RESEND recovers it."""
        ...

    def flush(self) -> None:
        """Push out what a busy kernel left queued at the last send (AF_XDP's TX rings)."""
        ...

    @property
    def backlog(self) -> bool: ...

    def before_sleep(self) -> bool:
        """The loop is about to sleep: True if it must not (work arrived meanwhile)."""
        ...

    def observe(self, metrics: CarrierMetrics) -> None: ...

    def close(self) -> None: ...


class UdpCarrier:
    def __init__(self, sock: socket.socket, batch: int) -> None:
        self.sock = sock
        self.io = BatchedUDP(sock, batch=batch)
        self.rare = False       # set while AF_XDP serves: UDP then gets only the leftovers
        self.more = False

    def fds(self) -> list:
        return [self.sock]

    def owns(self, addr: Address) -> bool:
        return type(addr) is not ShmConn     # a tuple, or an AF_XDP client after detach

    def recv_batch(self, turn: int, busy: bool) -> Frames:
        if self.rare and busy and turn % RARE:
            self.more = False
            return []
        got = self.io.recv_batch()
        self.more = len(got) == self.io.batch
        return got  # type: ignore[return-value]

    def send(self, frames: Frames) -> None:
        if any(type(a) is Peer for _, a in frames):
            frames = [(f, self._udp_addr(a) if type(a) is Peer else a) for f, a in frames]
        self.io.send_batch(frames)  # type: ignore[arg-type]

    def _udp_addr(self, peer: Peer) -> UdpAddr:
        """Where the kernel's UDP path reaches an AF_XDP client (after `xdp-detach`)."""
        if self.sock.family == socket.AF_INET6 and not peer.ipv6:
            return ("::ffff:" + peer.host, peer.port)
        return (peer.host, peer.port)

    def flush(self) -> None:
        pass

    @property
    def backlog(self) -> bool:
        return False

    def before_sleep(self) -> bool:
        return False

    def observe(self, metrics: CarrierMetrics) -> None:
        metrics.update_udp(self.io)

    def close(self) -> None:
        self.sock.close()


class XdpCarrier:
    def __init__(self, io: XdpIO) -> None:
        self.io = io
        self.more = False

    def fds(self) -> list:
        return self.io.fileno_list()

    def owns(self, addr: Address) -> bool:
        return type(addr) is Peer

    def recv_batch(self, turn: int, busy: bool) -> Frames:
        got = self.io.recv_batch()
        self.more = len(got) >= self.io.batch
        return got  # type: ignore[return-value]

    def send(self, frames: Frames) -> None:
        self.io.send_batch(frames)  # type: ignore[arg-type]

    def flush(self) -> None:
        if self.io.tx_backlog:
            self.io.poll_tx()

    @property
    def backlog(self) -> bool:
        return self.io.tx_backlog

    @property
    def umem_bytes(self) -> int:
        return self.io.umem.size

    def before_sleep(self) -> bool:
        return False

    def observe(self, metrics: CarrierMetrics) -> None:
        metrics.update_xdp(self.io)

    @property
    def ifname(self) -> str:
        return self.io.settings.ifname

    @property
    def auth(self) -> KernelKeys | None:
        """The kernel's copy of the keys (bpf/kernel_keys.py), once published."""
        return self.io.auth

    def status(self) -> JSONObject:
        """What `zerolayer ctl xdp-status` shows of the attached program and its sockets."""
        io = self.io
        return {"attached": True, "interface": io.settings.ifname, "zerocopy": io.zerocopy,
                "queues": len(io.socks), "ports": sorted(io.prog.ports()),
                "rate": dict(zip(("rate_pps", "burst"), io.prog.rate())),
                "untagged_rate": dict(zip(("rate_pps", "burst"), io.prog.untagged_rate())),
                "packets": io.packet_counts(), "pins": io.pins}

    def rate(self, untagged: bool = False) -> tuple[int, int]:
        """One of the XDP program's budgets: (packets a second, 0 = off; burst). The
        per-source token bucket, or with untagged, the budget of requests without the XDP
        tag (per receiving CPU, all sources together)."""
        return self.io.prog.untagged_rate() if untagged else self.io.prog.rate()

    def set_rate(self, rate_pps: int, burst: int, untagged: bool = False) -> None:
        """Set it, at once (buckets keep their state); ValueError for a negative value."""
        (self.io.prog.set_untagged_rate if untagged else self.io.prog.set_rate)(rate_pps, burst)

    def close(self) -> None:
        """Detach: invoke traffic goes to the kernel's UDP path from here on. Replies
        already on a TX ring go out first."""
        from .xdp_io import wait_tx_drained
        wait_tx_drained(self.io)
        self.io.close()


class ShmCarrier:
    def __init__(self, io: ShmIngress, poll_s: float = 0.0) -> None:
        self.io = io
        self.poll_s = poll_s    # [shm] poll_us: how long the idle loop polls the rings
        self.more = False
        self.polled_turn = 0

    def fds(self) -> list:
        return [self.io]     # its epoll fd: the listener, each client's socket and doorbell

    def owns(self, addr: Address) -> bool:
        return type(addr) is ShmConn

    def recv_batch(self, turn: int, busy: bool) -> Frames:
        # Accept, hang-ups, doorbells: one epoll_wait(0) at a turn's first batch, every
        # RARE-th turn when busy; the batches themselves are ring reads, no system call.
        if turn != self.polled_turn and (not busy or not turn % RARE):
            self.polled_turn = turn
            self.io.poll_events()
        got = self.io.recv_batch()
        self.more = self.io.more
        return got  # type: ignore[return-value]

    def send(self, frames: Frames) -> None:
        self.io.send_batch(frames)   # frames for a client gone since are dropped there

    def flush(self) -> None:
        pass

    @property
    def backlog(self) -> bool:
        return False

    def before_sleep(self) -> bool:
        """Clients ring the doorbell only while the loop sleeps: arm them; True if a
        record arrived meanwhile (look again instead of sleeping)."""
        return self.io.arm()

    @property
    def may_spin(self) -> bool:
        return self.poll_s > 0 and bool(self.io.conns)

    def spin(self, other_fds: list) -> bool:
        """Poll the rings for poll_s instead of sleeping: True if anything came (or one
        of other_fds became readable)."""
        return self.io.spin(self.poll_s, other_fds)

    def observe(self, metrics: CarrierMetrics) -> None:
        metrics.update_shm(self.io)

    def close(self) -> None:
        self.io.close()      # frees every client's rings, removes the socket file


class Carriers:
    """The carriers the loop turns over. AF_XDP may come and go at run time (the
    operator's xdp-attach / xdp-detach); `changed` tells the loop to re-read its fds."""

    def __init__(self, udp: UdpCarrier, shm: ShmCarrier | None = None) -> None:
        self.udp = udp
        self.shm = shm
        self.xdp: XdpCarrier | None = None
        self.changed = False
        self.all: list[Carrier] = []
        self._order()

    def _order(self) -> None:
        # owns() is asked in this order: UDP last, since it takes an AF_XDP client's
        # address too (after a detach)
        self.all = [c for c in (self.shm, self.xdp, self.udp) if c is not None]
        self.udp.rare = self.xdp is not None
        self.changed = True

    def attach_xdp(self, io: XdpIO) -> None:
        self.xdp = XdpCarrier(io)
        self._order()

    def detach_xdp(self) -> XdpCarrier | None:
        x, self.xdp = self.xdp, None
        self._order()
        return x

    def fds(self) -> list:
        return [fd for c in self.all for fd in c.fds()]

    def recv(self, turn: int, busy: bool) -> tuple[Frames, bool]:
        """One batch from each carrier, and whether any of them may have more."""
        out: Frames = []
        more = False
        for c in reversed(self.all):   # UDP, AF_XDP, shm: the order they were added in
            out += c.recv_batch(turn, busy)
            more = more or c.more
        return out, more

    def send(self, frames: Frames) -> None:
        """Each frame through the carrier that owns its address."""
        if len(self.all) == 1:
            self.udp.send(frames)
            return
        per: dict[int, Frames] = {}
        for item in frames:
            for i, c in enumerate(self.all):
                if c.owns(item[1]):
                    per.setdefault(i, []).append(item)
                    break
        for i, part in per.items():
            self.all[i].send(part)

    @property
    def backlog(self) -> bool:
        return self.xdp is not None and self.xdp.backlog   # the only carrier that has one

    @property
    def umem_bytes(self) -> int:
        """The AF_XDP UMEM's size while one is attached (memory accounting), else 0."""
        return self.xdp.umem_bytes if self.xdp is not None else 0

    def flush(self) -> None:
        for c in self.all:
            c.flush()

    @property
    def may_spin(self) -> bool:
        """Whether the loop, with nothing to do, should poll the shared-memory rings for a
        while before it sleeps: a same-host client is attached and [shm] poll_us is set."""
        return self.shm is not None and self.shm.may_spin

    def spin(self, other_fds: list) -> bool:
        """That poll (may_spin first): True if a client wrote or one of other_fds became
        readable, so the loop turns again instead of sleeping."""
        return self.shm is not None and self.shm.spin(other_fds)

    def before_sleep(self) -> bool:
        pending = False
        for c in self.all:
            pending = c.before_sleep() or pending
        return pending

    def observe(self, metrics: CarrierMetrics) -> None:
        for c in self.all:
            c.observe(metrics)

    def close(self) -> None:
        """AF_XDP first (detach, so the kernel's path takes over), then UDP, then shm."""
        for c in (self.xdp, self.udp, self.shm):
            if c is not None:
                c.close()


def open_carriers(sock: socket.socket, network: NetworkSection, shm: ShmSection,
                  log: Log) -> Carriers:
    """UDP on the bound socket, and the shared-memory carrier when [shm] turns it on (its
    socket bound now, so a bad path fails the start before the model loads). AF_XDP is
    attached later, once the model is up (Carriers.attach_xdp)."""
    io = open_from_config(shm, batch=network.batch, log=log)
    if io is not None:
        log(f"shared-memory carrier on {io.path} (mode {shm.mode})")
    return Carriers(UdpCarrier(sock, network.batch),
                    ShmCarrier(io, shm.poll_us / 1e6) if io is not None else None)
