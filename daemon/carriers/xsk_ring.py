"""AF_XDP in pure Python: a UMEM, its fill/completion rings, and one RX/TX socket per queue.

No Python library wraps AF_XDP, and libxdp would be a C dependency for ~300 lines of ring
arithmetic, so this is written against the kernel ABI directly (uapi/linux/if_xdp.h,
Documentation/networking/af_xdp.rst):

    umem  = Umem(n_queues * frames_per_queue)      # one anonymous mmap (gpu/cuda/mapped_ring
                                                   # can register it with the device)
    xsk   = XskSocket(umem, umem.part(q, n_queues), ifname, q)  # UMEM_REG, 4 rings, bind()
    xdp_prog.register_xsk(q, xsk.fileno())         # the XDP program now redirects to it
    addrs, lens = xsk.rx()                         # frames the kernel wrote (UMEM offsets)
    ... umem.view[a:a + n] for a, n in zip(addrs, lens) ...
    xsk.recycle(addrs)                             # back to the fill ring, in one write
    a = xsk.tx_frame(); ...write umem.view[a:]...; xsk.tx_submit([a], [n])  # and kick

Rings are single-producer/single-consumer arrays of 2^n entries with free-running u32
producer/consumer indices shared with the kernel. Descriptors are written through numpy
views over the ring mmaps, whole batches at a time; the index is published after the
descriptors. That ordering is all x86-64 (TSO) needs: stores are not reordered with stores,
loads not with loads, and every numpy call is an opaque C call to the compiler. On a weakly
ordered CPU (arm64) this module would need real barriers, so it refuses to run there.

Frames: each socket owns a contiguous part of the UMEM (registered as its own UMEM, so ring
addresses are relative to the part; this class speaks absolute offsets into Umem.view to its
callers and converts at the rings), split in two pools. The RX pool lives
in the fill ring, RX ring and the daemon's hands, and goes back to the fill ring as soon as
the daemon has copied a datagram out. The TX pool is a free list: a frame is taken, a reply
is written into it in place, it goes on the TX ring, and the completion ring returns it.

Copy mode works on every driver (veth, lo, anything with generic XDP); zero-copy is tried
first when asked for ("auto") and kept when the driver accepts it. need_wakeup is always
requested: the kernel then only needs a syscall when it says so (fill ring empty, TX idle),
which is what keeps a busy-polling loop cheap.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

AF_XDP = 44
SOL_XDP = 283
# setsockopt/getsockopt names (uapi/linux/if_xdp.h)
XDP_MMAP_OFFSETS = 1
XDP_RX_RING = 2
XDP_TX_RING = 3
XDP_UMEM_REG = 4
XDP_UMEM_FILL_RING = 5
XDP_UMEM_COMPLETION_RING = 6
XDP_STATISTICS = 7
XDP_OPTIONS = 8
XDP_OPTIONS_ZEROCOPY = 1
# bind flags
XDP_SHARED_UMEM = 1 << 0
XDP_COPY = 1 << 1
XDP_ZEROCOPY = 1 << 2
XDP_USE_NEED_WAKEUP = 1 << 3
XDP_RING_NEED_WAKEUP = 1 << 0
# mmap page offsets of the four rings
XDP_PGOFF_RX_RING = 0
XDP_PGOFF_TX_RING = 0x80000000
XDP_UMEM_PGOFF_FILL_RING = 0x100000000
XDP_UMEM_PGOFF_COMPLETION_RING = 0x180000000

MSG_DONTWAIT = 0x40
# Copy-mode sendto() transmits at most this many frames per call (TX_BATCH_SIZE in
# net/xdp/xsk.c); the kick loop calls it again until the TX ring is drained.
TX_BUDGET_PER_CALL = 32

DESC = np.dtype([("addr", "<u8"), ("len", "<u4"), ("options", "<u4")])  # struct xdp_desc
ADDR = np.dtype(np.uint64)  # fill/completion ring entries (little-endian: x86-64 only)
_DESC_S = struct.Struct("<QI4x")    # the same, for per-packet access
_ADDR_S = struct.Struct("<Q")       # fill/completion ring entries
# Up to this many descriptors, struct on the mmap (~0.2 us each) beats numpy's fixed cost
# (~8 us per call here); beyond it, whole-batch numpy views.
SMALL_BATCH = 16
_U32 = 0xFFFFFFFF

_libc = ctypes.CDLL(None, use_errno=True)
_libc.sendto.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                         ctypes.c_void_p, ctypes.c_uint32]
_libc.sendto.restype = ctypes.c_ssize_t
_libc.recvfrom.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                           ctypes.c_void_p, ctypes.c_void_p]
_libc.recvfrom.restype = ctypes.c_ssize_t
_libc.bind.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]


class XskUnavailable(OSError):
    """AF_XDP cannot be set up here (no support, no permission, the driver refused)."""


@dataclass(frozen=True)
class XskStats:
    """struct xdp_statistics: what the kernel dropped or skipped on this socket."""
    rx_dropped: int = 0
    rx_invalid_descs: int = 0
    tx_invalid_descs: int = 0
    rx_ring_full: int = 0
    rx_fill_ring_empty_descs: int = 0
    tx_ring_empty_descs: int = 0


def rx_queue_count(ifname: str) -> int:
    """RX queues of a device, as the XDP program sees them in ctx->rx_queue_index. Asked over
    netlink (IFLA_NUM_RX_QUEUES), which follows the caller's network namespace; /sys/class/net
    follows whoever mounted /sys."""
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            raise XskUnavailable(f"no network device {ifname!r}")
        n = ipr.link("get", index=idx[0])[0].get_attr("IFLA_NUM_RX_QUEUES")
    return max(int(n or 1), 1)


class Umem:
    """One anonymous, page-aligned mmap holding every socket's frames.

    Anonymous and shared-nothing on purpose: it can be pinned with cudaHostRegister and
    read by the device (the GPU issue), and it is locked in memory by the kernel at
    XDP_UMEM_REG (the unit file raises RLIMIT_MEMLOCK)."""

    def __init__(self, n_frames: int, frame_size: int = 4096):
        if frame_size not in (2048, 4096):
            raise ValueError("frame_size must be 2048 or 4096 (aligned chunk mode)")
        self.frame_size = frame_size
        self.n_frames = n_frames
        self.size = n_frames * frame_size
        self.mm = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._anchor = ctypes.c_char.from_buffer(self.mm)
        self.address = ctypes.addressof(self._anchor)
        self.view = memoryview(self.mm)
        self.array = np.frombuffer(self.mm, dtype=np.uint8)

    def part(self, index: int, count: int) -> tuple[int, int]:
        """(byte offset, length) of the index-th of `count` equal parts, in whole frames."""
        per = self.n_frames // count
        return index * per * self.frame_size, per * self.frame_size

    def close(self) -> None:
        self.view.release()
        del self.array      # numpy's export of the mmap, or mm.close() raises BufferError
        del self._anchor
        self.mm.close()


_Entry = TypeVar("_Entry", np.void, np.uint64)


class _Ring(Generic[_Entry]):
    """One mmap'ed ring: a u32 producer, a u32 consumer, a u32 flags word, 2^n descriptors
    (struct xdp_desc for RX/TX, u64 addresses for fill/completion)."""

    def __init__(self, fd: int, pgoff: int, offsets: tuple[int, int, int, int], size: int,
                 dtype: np.dtype[_Entry]):
        prod, cons, desc, flags = offsets
        length = desc + size * dtype.itemsize
        self.mm = mmap.mmap(fd, length, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=pgoff)
        self.desc_off = desc
        self.item = dtype.itemsize
        # The three u32 words as memoryviews: an index reads or writes a Python int in ~30
        # ns, where a numpy scalar costs ~150 ns, and the idle loop reads one every turn.
        self._mv = memoryview(self.mm)
        self._words = [self._mv[o:o + 4].cast("I") for o in (prod, cons, flags)]
        self._producer, self._consumer, self._flags = self._words
        self.desc: npt.NDArray[_Entry] = np.frombuffer(self.mm, dtype, size, desc)
        self.size = size
        self.mask = size - 1

    # Python ints, not numpy scalars: the indices wrap at 2^32 and are compared freely.
    @property
    def producer(self) -> int:
        return self._producer[0]

    @property
    def consumer(self) -> int:
        return self._consumer[0]

    def publish_producer(self, value: int) -> None:
        self._producer[0] = value & _U32

    def publish_consumer(self, value: int) -> None:
        self._consumer[0] = value & _U32

    @property
    def needs_wakeup(self) -> bool:
        return (self._flags[0] & XDP_RING_NEED_WAKEUP) != 0

    def occupancy(self) -> int:
        return (self.producer - self.consumer) & _U32

    def slots(self, start: int, n: int) -> npt.NDArray[np.int64]:
        return (start + np.arange(n, dtype=np.int64)) & self.mask

    def close(self) -> None:
        for w in self._words:
            w.release()
        self._mv.release()   # the words are unusable from here (ValueError), not stale
        del self.desc        # numpy's export of the mmap, or mm.close() raises BufferError
        self.mm.close()


class XskSocket:
    """An AF_XDP socket bound to (ifname, queue), over part `part` of a Umem.

    mode: "copy", "zerocopy", or "auto" (zero-copy when the driver has it, else copy)."""

    def __init__(self, umem: Umem, part: tuple[int, int], ifname: str, queue: int, *,
                 ring_size: int = 2048, mode: str = "auto"):
        if platform.machine() not in ("x86_64", "AMD64"):
            raise XskUnavailable("the ring code relies on x86-64 store ordering (see module doc)")
        if ring_size & (ring_size - 1):
            raise ValueError("ring_size must be a power of two")
        if mode not in ("auto", "copy", "zerocopy"):
            raise ValueError("mode must be auto, copy or zerocopy")
        self.umem, self.ifname, self.queue = umem, ifname, queue
        self.base, length = part
        fs = umem.frame_size
        n_frames = length // fs
        if n_frames < 2 * ring_size:
            raise ValueError(f"a part of {n_frames} frames is too small for rings of {ring_size}")
        try:
            self.ifindex = socket.if_nametoindex(ifname)
        except OSError:
            raise XskUnavailable(f"no network device {ifname!r}") from None
        try:
            self.sock = socket.socket(AF_XDP, socket.SOCK_RAW, 0)
        except OSError as e:
            raise XskUnavailable(f"cannot open an AF_XDP socket: {e}") from e
        self.fd = self.sock.fileno()
        self._rings: tuple[_Ring[np.void] | _Ring[np.uint64], ...] = ()   # what close() closes
        try:
            self.rx_ring, self.tx_ring, self.fill, self.comp = rings = self._setup(length,
                                                                                   ring_size)
            self._rings = rings
            self.zerocopy = self._bind(mode)
        except BaseException:
            self.close()
            raise
        # Frame pools (UMEM byte offsets): first half RX (handed to the fill ring now),
        # second half TX (a free list).
        addrs = self.base + np.arange(n_frames, dtype=np.uint64) * fs
        half = n_frames // 2
        self._tx_free: list[int] = [int(a) for a in addrs[half:]]
        self._fill_ctr = 0      # our copy of the fill ring producer
        self._comp_ctr = 0      # our copy of the completion ring consumer
        self._rx_ctr = 0        # RX ring consumer
        self._tx_ctr = 0        # TX ring producer
        self.rx_frames = half
        self.tx_frames = n_frames - half
        self._pending_fill: list[npt.NDArray[np.uint64]] = []
        self.recycle(addrs[:half])
        self.kicks = 0          # sendto() calls made to start transmission
        self.tx_eagain = 0

    # ---- set-up ------------------------------------------------------------------------------
    def _setup(self, length: int, ring_size: int) -> tuple[_Ring[np.void], _Ring[np.void],
                                                           _Ring[np.uint64], _Ring[np.uint64]]:
        """Register the UMEM part and map the four rings: (RX, TX, fill, completion). On a
        failure the rings mapped so far are closed again."""
        s = self.sock
        s.setsockopt(SOL_XDP, XDP_UMEM_REG, struct.pack(
            "<QQIII4x", self.umem.address + self.base, length, self.umem.frame_size, 0, 0))
        for opt in (XDP_UMEM_FILL_RING, XDP_UMEM_COMPLETION_RING, XDP_RX_RING, XDP_TX_RING):
            s.setsockopt(SOL_XDP, opt, struct.pack("<I", ring_size))
        off = struct.unpack("<16Q", s.getsockopt(SOL_XDP, XDP_MMAP_OFFSETS, 128))
        rx, tx, fr, cr = off[0:4], off[4:8], off[8:12], off[12:16]
        mapped: list[_Ring[np.void] | _Ring[np.uint64]] = []
        try:
            rx_ring = _Ring(self.fd, XDP_PGOFF_RX_RING, rx, ring_size, DESC)
            mapped.append(rx_ring)
            tx_ring = _Ring(self.fd, XDP_PGOFF_TX_RING, tx, ring_size, DESC)
            mapped.append(tx_ring)
            fill = _Ring(self.fd, XDP_UMEM_PGOFF_FILL_RING, fr, ring_size, ADDR)
            mapped.append(fill)
            comp = _Ring(self.fd, XDP_UMEM_PGOFF_COMPLETION_RING, cr, ring_size, ADDR)
        except BaseException:
            for r in mapped:
                r.close()
            raise
        return rx_ring, tx_ring, fill, comp

    def _bind(self, mode: str) -> bool:
        tries = {"auto": (XDP_ZEROCOPY, XDP_COPY), "zerocopy": (XDP_ZEROCOPY,),
                 "copy": (XDP_COPY,)}[mode]
        last = 0
        for flag in tries:
            addr = struct.pack("<HHIII", AF_XDP, flag | XDP_USE_NEED_WAKEUP, self.ifindex,
                               self.queue, 0)
            if _libc.bind(self.fd, addr, len(addr)) == 0:
                opts = struct.unpack("<I", self.sock.getsockopt(SOL_XDP, XDP_OPTIONS, 4))[0]
                return bool(opts & XDP_OPTIONS_ZEROCOPY)
            last = ctypes.get_errno()
        raise XskUnavailable(f"AF_XDP bind to {self.ifname} queue {self.queue} ({mode}): "
                             f"{os.strerror(last)}")

    def fileno(self) -> int:
        return self.fd

    # ---- RX ------------------------------------------------------------------------------------
    def rx(self, limit: int = 256) -> tuple[list[int], list[int]]:
        """Frames received since the last call: (UMEM offsets, lengths), at most `limit`.
        The caller must recycle() every offset once it has copied the datagram out."""
        r = self.rx_ring
        n = min((r.producer - self._rx_ctr) & _U32, limit)
        if n == 0:
            # A zero-copy driver that ran dry of fill frames sleeps until woken; in copy mode
            # the kernel never sets this flag, so an idle poll costs one flag read.
            if self.fill.needs_wakeup:
                self.wake_rx()
            return [], []
        if n <= SMALL_BATCH:  # per-packet struct reads: ~0.2 us each against ~8 us of numpy
            addrs, lens = [], []
            for i in range(self._rx_ctr, self._rx_ctr + n):
                a, ln = _DESC_S.unpack_from(r.mm, r.desc_off + 16 * (i & r.mask))
                addrs.append(a + self.base)
                lens.append(ln)
        else:
            d = r.desc[r.slots(self._rx_ctr, n)]
            addrs = (d["addr"] + np.uint64(self.base)).tolist()
            lens = d["len"].tolist()
        self._rx_ctr = (self._rx_ctr + n) & _U32
        r.publish_consumer(self._rx_ctr)
        return addrs, lens

    def recycle(self, addrs: Sequence[int] | npt.NDArray[np.uint64]) -> None:
        """Give RX frames (a list or array of UMEM offsets) back to the kernel through the
        fill ring, in one write. The ring has room for every RX frame: this never waits."""
        n = len(addrs)
        if n == 0:
            return
        f = self.fill
        # Ring addresses are relative to this socket's part; aligned chunk mode wants the
        # frame's start, whatever offset RX gave.
        fs = self.umem.frame_size
        if n <= SMALL_BATCH:
            for i, a in enumerate(addrs):
                rel = int(a) - self.base
                _ADDR_S.pack_into(f.mm, f.desc_off + 8 * ((self._fill_ctr + i) & f.mask),
                                  rel - rel % fs)
        else:
            rels = np.asarray(addrs, np.uint64) - np.uint64(self.base)
            f.desc[f.slots(self._fill_ctr, n)] = rels - rels % np.uint64(fs)
        self._fill_ctr = (self._fill_ctr + n) & _U32
        f.publish_producer(self._fill_ctr)
        if f.needs_wakeup:
            self.wake_rx()

    def wake_rx(self) -> None:
        """The kernel asked (fill ring was empty): let it look at the fill ring again."""
        _libc.recvfrom(self.fd, None, 0, MSG_DONTWAIT, None, None)

    # ---- TX ------------------------------------------------------------------------------------
    def tx_frame(self) -> int | None:
        """A free TX frame's UMEM offset, or None when all are in flight."""
        if not self._tx_free:
            self.reap()
            if not self._tx_free:
                return None
        return self._tx_free.pop()

    def tx_submit(self, addrs: list[int], lens: list[int]) -> int:
        """Put written frames on the TX ring (in order), then kick. The TX ring is as large
        as the TX pool, so there is always room for a frame taken from tx_frame(). Returns
        the frames still waiting on the ring (see kick)."""
        n = len(addrs)
        if n == 0:
            return 0
        t = self.tx_ring
        if n <= SMALL_BATCH:
            for i in range(n):
                _DESC_S.pack_into(t.mm, t.desc_off + 16 * ((self._tx_ctr + i) & t.mask),
                                  addrs[i] - self.base, lens[i])
        else:
            idx = t.slots(self._tx_ctr, n)
            t.desc["addr"][idx] = np.asarray(addrs, np.uint64) - np.uint64(self.base)
            t.desc["len"][idx] = lens
            t.desc["options"][idx] = 0
        self._tx_ctr = (self._tx_ctr + n) & _U32
        t.publish_producer(self._tx_ctr)
        return self.kick()

    def tx_pending(self) -> int:
        """Frames on the TX ring the kernel has not taken yet."""
        return (self._tx_ctr - self.tx_ring.consumer) & _U32

    def kick(self, max_calls: int = 64) -> int:
        """Make the kernel transmit what is on the TX ring. In copy mode one sendto() sends at
        most TX_BUDGET_PER_CALL frames, so call it until the ring is drained; EAGAIN/EBUSY mean
        the kernel is busy or the completion ring is full: reap it and try again, and after
        max_calls leave the rest for the next loop iteration (the frames stay on the ring).
        Returns the frames still pending."""
        for _ in range(max_calls):
            pending = self.tx_pending()
            if pending == 0:
                break
            if self.zerocopy and not self.tx_ring.needs_wakeup:
                break  # the driver is already working through the ring
            self.kicks += 1
            if _libc.sendto(self.fd, None, 0, MSG_DONTWAIT, None, 0) < 0:
                err = ctypes.get_errno()
                if err in (errno.EAGAIN, errno.EBUSY, errno.ENOBUFS):
                    self.tx_eagain += 1
                    self.reap()
                    continue
                if err == errno.ENETDOWN:
                    break
                raise OSError(err, f"AF_XDP sendto: {os.strerror(err)}")
        self.reap()
        return self.tx_pending()

    def reap(self) -> int:
        """Take transmitted frames off the completion ring, back into the TX free list."""
        c = self.comp
        n = (c.producer - self._comp_ctr) & _U32
        if n and n <= SMALL_BATCH:
            for i in range(self._comp_ctr, self._comp_ctr + n):
                self._tx_free.append(_ADDR_S.unpack_from(c.mm, c.desc_off + 8 * (i & c.mask))[0]
                                     + self.base)
        elif n:
            self._tx_free.extend((c.desc[c.slots(self._comp_ctr, n)] + np.uint64(self.base)).tolist())
        if n:
            self._comp_ctr = (self._comp_ctr + n) & _U32
            c.publish_consumer(self._comp_ctr)
        return n

    # ---- observability -----------------------------------------------------------------------
    def stats(self) -> XskStats:
        raw = self.sock.getsockopt(SOL_XDP, XDP_STATISTICS, 48)
        return XskStats(*struct.unpack("<6Q", raw.ljust(48, b"\0")))

    def occupancy(self) -> dict[str, int]:
        """Entries in each ring right now (the ring occupancy gauges)."""
        return {"rx": self.rx_ring.occupancy(), "tx": self.tx_ring.occupancy(),
                "fill": self.fill.occupancy(), "completion": self.comp.occupancy()}

    def close(self) -> None:
        # The rings stay attributes: once closed, any use raises (released memoryviews).
        for r in self._rings:
            r.close()
        self._rings = ()
        self.sock.close()


