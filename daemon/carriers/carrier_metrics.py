"""The carriers' own Prometheus series: the XDP program's packet counts, the AF_XDP rings,
the UDP socket's refused destinations, the shared-memory connections. Each carrier keeps
its counts as plain ints where they happen (or the kernel keeps them, in the program's map
and XDP_STATISTICS); the daemon's loop copies them in here through ``Carriers.observe``, so a
scrape never touches a ring or a map. Registered in the daemon's one registry
(ops/metrics.py), which holds everything that is not a carrier's.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from .shm_ingress import CONNECT_RESULTS, RING_ERRORS, ShmIngress
from .udp_io import BatchedUDP

if TYPE_CHECKING:  # (xdp_io is imported only where ingress = "xdp")
    from .xdp_io import XdpIO


class CarrierMetrics:
    """Every carrier's series, present (at 0) whichever carriers this daemon runs."""

    def __init__(self, r: CollectorRegistry):
        # the XDP fast path (zero, and present all the same, when ingress is udp)
        self.xdp_attached = Gauge("zerolayer_xdp_attached",
                                  "1 while the XDP program is attached and AF_XDP sockets serve",
                                  registry=r)
        self.xdp_packets = Counter("zerolayer_xdp_packets",
                                   "Packets the XDP program saw, by action and reason",
                                   ["action", "reason"], registry=r)
        self.xsk_rx_dropped = Counter("zerolayer_xsk_rx_dropped",
                                      "Redirected packets the AF_XDP sockets could not take "
                                      "(no fill frame, RX ring full, too big)", registry=r)
        self.xsk_tx_dropped = Counter("zerolayer_xsk_tx_dropped",
                                      "Reply frames not sent: every TX frame in flight "
                                      "(the client recovers them with RESEND)", registry=r)
        self.udp_undeliverable = Counter("zerolayer_udp_undeliverable",
                                         "UDP replies the kernel refused for their "
                                         "destination (no route back, an ICMP error pending, "
                                         "a firewall): dropped, the others still sent",
                                         registry=r)
        self.xsk_ring_entries = Gauge("zerolayer_xsk_ring_entries",
                                      "Entries in the AF_XDP rings, summed over queues",
                                      ["ring"], registry=r)
        # the same-host shared-memory carrier (shm_ingress.py)
        self.shm_open = Gauge("zerolayer_shm_connections_open",
                              "Same-host clients connected over shared memory", registry=r)
        self.shm_connections = Counter("zerolayer_shm_connections",
                                       "Shared-memory connection attempts by result: accepted, "
                                       "refused_peer (SO_PEERCRED), refused_full "
                                       "([shm] max_clients), failed", ["result"], registry=r)
        self.shm_ring_full = Counter("zerolayer_shm_ring_full_drops",
                                     "Reply frames lost because a client's response ring was "
                                     "full (the client recovers them with RESEND)", registry=r)
        self.shm_ring_errors = Counter("zerolayer_shm_ring_errors",
                                       "Shared-memory connections dropped for breaking the "
                                       "ring protocol, by reason: bad_index, bad_length, "
                                       "protocol", ["reason"], registry=r)
        for result in CONNECT_RESULTS:
            self.shm_connections.labels(result)
        for reason in RING_ERRORS:
            self.shm_ring_errors.labels(reason)
        self._last: dict = {}
        self._xdp_last: dict = {}

    def update_shm(self, shm: ShmIngress) -> None:
        """Copy the shm ingress's own counts (plain ints on the I/O thread) into Prometheus."""
        last, st = self._last, shm.stats
        self.shm_open.set(len(shm.conns))
        for result in CONNECT_RESULTS:
            advance(self.shm_connections.labels(result), last, ("shm", result), st[result])
        for reason in RING_ERRORS:
            advance(self.shm_ring_errors.labels(reason), last, ("shm", reason), st[reason])
        advance(self.shm_ring_full, last, ("shm", "full"), st["ring_full_drops"])

    def update_udp(self, io: BatchedUDP) -> None:
        """Copy the UDP carrier's own count of refused destinations (udp_io.BatchedUDP)."""
        advance(self.udp_undeliverable, self._last, "udp_undeliverable", io.undeliverable)

    def new_xdp_program(self) -> None:
        """A freshly loaded program (xdp-attach) counts from 0 again: forget the old totals,
        or its first packets would be taken for the old program's and never counted."""
        self._xdp_last.clear()

    def update_xdp(self, io: XdpIO) -> None:
        """Copy the kernel's counters (the program's per-CPU array, XDP_STATISTICS) into
        Prometheus as increments. Called from the daemon's loop, so scrapes never touch the
        rings or the maps."""
        from .xdp_io import REASON_ACTION
        last = self._xdp_last
        for reason, n in io.packet_counts().items():
            advance(self.xdp_packets.labels(REASON_ACTION[reason], reason), last, reason, n)
        st = io.xsk_stats()
        advance(self.xsk_rx_dropped, last, "rx", st.rx_dropped + st.rx_ring_full)
        advance(self.xsk_tx_dropped, last, "tx", io.tx_no_frame)
        for ring, n in io.ring_occupancy().items():
            self.xsk_ring_entries.labels(ring).set(n)


def advance(counter: Counter, last: dict, key: Hashable, total: int) -> None:
    """Add to `counter` what `total` (a running count kept elsewhere) gained since last time."""
    d = total - last.get(key, 0)
    if d > 0:
        counter.inc(d)
    last[key] = total
