"""The AF_XDP ingress: the XDP program attached to one device, one AF_XDP socket per RX queue,
and the same recv_batch/send_batch interface as the UDP path (udp_io.BatchedUDP), so the
protocol, the engine and streaming above it don't know which path a datagram took.

    xdp = XdpIO.open(XdpSettings("eth0", (7433,)))  # BCC in a helper, sockets, register, attach
    for payload, peer in xdp.recv_batch(): ...  # peer: an xdp_frames.Peer, the reply route
    xdp.send_batch([(frame, peer), ...])       # written in place into UMEM TX frames
    xdp.close()                                # detach (the bpf_link), free the UMEM

The program is attached through a bpf_link owned by this process: when the daemon exits, or
is killed, the kernel detaches it and invoke traffic goes to the kernel's UDP stack again
(docs/OPERATIONS.md, "When the daemon dies").
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from zerolayer.bpf.compile_helper import compile_isolated
from zerolayer.bpf.kernel_keys import KernelKeys
from zerolayer.bpf.loader import REASONS, InvokeSteer, XdpLink

from .xdp_frames import Peer, parse_frame, write_reply
from .xsk_ring import Umem, XskSocket, XskStats, rx_queue_count

# action label for each of the program's reasons (zerolayer_xdp_packets_total{action,reason})
REASON_ACTION = {r: ("redirect" if r == "redirect" else "pass" if r.startswith("pass") else "drop")
                 for r in REASONS}


@dataclass
class XdpSettings:
    ifname: str
    ports: tuple[int, ...]
    attach_mode: str = "auto"     # native | generic | auto (XDP attach)
    xsk_mode: str = "auto"        # copy | zerocopy | auto (AF_XDP bind)
    ring_size: int = 2048
    frame_size: int = 4096
    rate_pps: int = 0             # per-source token bucket in the kernel; 0 = off
    rate_burst: int = 0
    untagged_pps: int = 0         # the untagged requests' bucket per CPU; 0 = off
    untagged_burst: int = 0
    pin_dir: str = ""             # bpffs directory for the maps; "" = no pins


class XdpIO:
    def __init__(self, s: XdpSettings, prog: InvokeSteer, umem: Umem, socks: list[XskSocket]):
        self.settings = s
        self.prog = prog
        self.umem = umem
        self.socks = socks
        self.link: XdpLink | None = None   # attached by open(); None once closed
        self._peers: dict = {}
        self.batch = 256              # frames per socket per recv_batch call
        self.rx_unparsed = 0          # frames the program redirected that didn't parse here
        self.tx_no_frame = 0          # replies dropped: every TX frame in flight (RESEND recovers)
        self.tx_backlog = False       # frames left on a TX ring by a busy kernel: poll_tx()
        self.compile_seconds = prog.compile_stats.seconds
        self.pins: dict = {}           # map name -> pinned path (settings.pin_dir)
        # The kernel's copy of the keys and clock (bpf/kernel_keys.py); set by the daemon
        # once it has published them. None: the program checks no key, tag or timestamp.
        self.auth: KernelKeys | None = None

    @classmethod
    def open(cls, s: XdpSettings) -> XdpIO:
        """Compile and load the program, open a socket on every RX queue, register them in
        the XSKMAP, then attach. Anything that fails undoes what was done and raises."""
        n_q = rx_queue_count(s.ifname)
        # BCC runs in a helper process: this one gets fds and never loads LLVM (~125 MB).
        prog = compile_isolated(ports=s.ports, rate_pps=s.rate_pps, burst=s.rate_burst)
        umem = socks = None
        try:
            prog.set_untagged_rate(s.untagged_pps, s.untagged_burst)
            umem = Umem(n_q * 2 * s.ring_size, s.frame_size)
            socks = []
            for q in range(n_q):
                socks.append(XskSocket(umem, umem.part(q, n_q), s.ifname, q,
                                       ring_size=s.ring_size, mode=s.xsk_mode))
                prog.register_xsk(q, socks[-1].fileno())
            io = cls(s, prog, umem, socks)
            if s.pin_dir:
                io.pins = prog.pin_maps(s.pin_dir)
            io.link = prog.attach(s.ifname, mode=s.attach_mode)
            return io
        except BaseException:
            for x in socks or []:
                x.close()
            prog.close()
            if umem is not None:
                umem.close()
            raise

    def fileno_list(self) -> list[int]:
        return [x.fileno() for x in self.socks]

    @property
    def zerocopy(self) -> bool:
        return all(x.zerocopy for x in self.socks)

    # ---- the two calls the daemon's loop makes ---------------------------------------------
    def recv_batch(self) -> list[tuple[bytes, Peer]]:
        out = []
        view = self.umem.view
        for x in self.socks:
            addrs, lens = x.rx(self.batch)
            if len(addrs) == 0:
                continue
            for a, n in zip(addrs, lens):
                r = parse_frame(view[a:a + n], x.queue, self._peers)
                if r is None:
                    self.rx_unparsed += 1
                else:
                    out.append(r)
            x.recycle(addrs)  # copied out: the frames go straight back to the fill ring
        return out

    def send_batch(self, items: list[tuple[bytes, Peer]]) -> int:
        """Write each frame into a free TX frame of its peer's queue socket, then kick every
        socket once. Returns how many were queued (the rest: no free frame; the protocol
        recovers them with RESEND, as with a full socket buffer on the UDP path)."""
        per_q: dict[int, tuple[list[int], list[int]]] = {}
        view, fs = self.umem.view, self.umem.frame_size
        sent = 0
        for data, peer in items:
            x = self.socks[peer.queue]
            a = x.tx_frame()
            if a is None:
                self.tx_no_frame += 1
                continue
            n = write_reply(view[a:a + fs], peer, data)
            addrs, lens = per_q.setdefault(peer.queue, ([], []))
            addrs.append(a)
            lens.append(n)
            sent += 1
        for q, (addrs, lens) in per_q.items():
            if self.socks[q].tx_submit(addrs, lens):
                self.tx_backlog = True
        return sent

    def poll_tx(self) -> None:
        """Retry frames a busy kernel left on a TX ring (the loop calls this while
        tx_backlog is set)."""
        backlog = False
        for x in self.socks:
            if x.tx_pending():
                backlog = x.kick() > 0 or backlog
        self.tx_backlog = backlog

    # ---- observability ------------------------------------------------------------------------
    def packet_counts(self) -> dict[str, int]:
        return self.prog.stats()

    def xsk_stats(self) -> XskStats:
        tot = np.zeros(6, np.int64)
        for x in self.socks:
            tot += np.array(list(vars(x.stats()).values()), np.int64)
        return XskStats(*map(int, tot))

    def ring_occupancy(self) -> dict[str, int]:
        occ: dict[str, int] = {}
        for x in self.socks:
            for k, v in x.occupancy().items():
                occ[k] = occ.get(k, 0) + v
        return occ

    def close(self) -> None:
        if self.link is not None:
            self.link.close()      # detach first: from here on traffic goes to the kernel stack
            self.link = None
        for x in self.socks:
            self.prog.unregister_xsk(x.queue)
            x.close()
        self.socks = []
        for path in self.pins.values():  # a pin would keep the maps alive after we are gone
            path.unlink(missing_ok=True)
        self.prog.close()
        self.umem.close()


def wait_tx_drained(io: XdpIO, timeout_s: float = 1.0) -> bool:
    """Kick until every TX ring is empty (used at shutdown so the last frames leave)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        io.poll_tx()
        if not any(x.tx_pending() for x in io.socks):
            return True
        time.sleep(0.001)
    return False
