"""Single-producer/single-consumer rings of datagram records in shared memory.

The same-host carrier (docs/PROTOCOL.md "Same-host shared-memory carrier"): the daemon makes
one memfd per client connection holding a *region* of two rings, requests (client → daemon)
and responses (daemon → client), and passes it with two eventfds (the doorbells) over its
Unix socket. Both sides import this module, so the layout has one source. Standard library
only (mmap, struct): `zerolayer.client` must stay importable without numpy.

Region (every offset a multiple of 64, so no two writers share a cache line):

    0      256   region header: magic "ZLSM", version, the two capacities (informative)
    256    256   request ring header   ┐ ring header: u64 words at byte offsets
    512    C_q   request ring data     │   0    tail     (producer's: bytes ever written)
    …      256   response ring header  │   64   head     (consumer's: bytes ever consumed)
    …      C_r   response ring data    ┘   128  waiting  (consumer's: 1 = "ring my doorbell")

A record is a u32 length (1..MAX_DATAGRAM) then the datagram, padded to 8 bytes; a record
may wrap from the end of the data area to its start (the length word never does: records
start 8-aligned and the capacity is a power of two). head and tail count bytes for ever;
`counter & (capacity - 1)` is the position.

Ordering. The producer writes the record, then stores tail; the consumer loads tail, reads
the record, then stores head. On x86-64 (TSO) stores become visible in program order and
loads are not reordered with older loads, so that is enough without fences; the counters
are single aligned 8-byte stores and loads (memoryview "Q" items), which x86-64 never
tears. Other CPUs would need barriers that Python cannot express, so `check_platform`
refuses them. The one place TSO is not enough is the doorbell's "waiting" flag (a store
then a load of the other side's word, Dekker's pattern, which TSO may reorder): both sides
put a full fence between them, see `full_fence`.

Nothing read from the other side is trusted: each side keeps its own counter privately and
never reads it back, and every value it reads (the other counter, a record length) is
checked before use; a bad one raises RingCorrupt with a reason, and the reader drops the
connection. The daemon seals the memfd's size, so a client cannot shrink it under the
daemon's mapping (which would fault the daemon on its next access).
"""
from __future__ import annotations

import fcntl
import mmap
import os
import platform
import struct
import threading

from .wire_consts import WIRE

MAGIC = b"ZLSM"
VERSION = 1
CACHE_LINE = 64
REGION_HDR = 256
RING_HDR = 256
ALIGN = 8                          # records start 8-aligned
MAX_RECORD = WIRE["ZL_MAX_DATAGRAM"]
MIN_CAPACITY = 1 << 12
MAX_CAPACITY = 1 << 26
_TAIL, _HEAD, _WAITING = 0, CACHE_LINE // 8, 2 * CACHE_LINE // 8   # indexes of u64 words
_LEN = struct.Struct("<I")
_REGION = struct.Struct("<4sHHII")  # magic, version, reserved, request cap, response cap

# The daemon's greeting, the one message it sends on the Unix socket (with the three fds
# [memfd, request doorbell, response doorbell] when status is OK): magic, version, status,
# slot, request capacity, response capacity, max record, region size.
HELLO = struct.Struct("<4sHHIIIIQ")
STATUS_OK = 0
STATUS_REFUSED_PEER = 1            # SO_PEERCRED: uid/gid not in the allowed lists
STATUS_FULL = 2                    # [shm] max_clients connections already
STATUS_TEXT = {STATUS_REFUSED_PEER: "this uid/gid is not allowed ([shm] allowed_uids/gids)",
               STATUS_FULL: "the daemon has [shm] max_clients connections already"}


class RingCorrupt(Exception):
    """The other side broke the ring's invariants; `reason` is a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


_FENCE = threading.Lock()


def full_fence() -> None:
    """A full memory barrier (StoreLoad included). CPython has no fence primitive, but taking
    and releasing a lock executes a `lock`-prefixed instruction (a CAS in sem_trywait /
    sem_post, or PyMutex), which x86-64 orders against every earlier and later access."""
    with _FENCE:
        pass


def check_platform() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise OSError(f"the shared-memory carrier relies on x86-64 memory ordering; "
                      f"this is {platform.machine()}")


def check_capacity(capacity: int) -> None:
    if not (MIN_CAPACITY <= capacity <= MAX_CAPACITY and capacity & (capacity - 1) == 0):
        raise ValueError(f"ring capacity {capacity} is not a power of two in "
                         f"{MIN_CAPACITY}..{MAX_CAPACITY}")


def region_size(req_capacity: int, resp_capacity: int) -> int:
    return REGION_HDR + 2 * RING_HDR + req_capacity + resp_capacity


def record_size(n: int) -> int:
    return (4 + n + ALIGN - 1) & ~(ALIGN - 1)


class Ring:
    """One direction of a region. A side uses it either as producer (push) or as consumer
    (pop, arm/disarm), never both."""

    def __init__(self, buf: mmap.mmap, offset: int, capacity: int,
                 max_record: int = MAX_RECORD) -> None:
        check_capacity(capacity)
        whole = memoryview(buf)
        self._words = whole[offset:offset + RING_HDR].cast("Q")
        self._data = whole[offset + RING_HDR:offset + RING_HDR + capacity]
        whole.release()
        self.capacity = capacity
        self._mask = capacity - 1
        self.max_record = max_record
        self._head = 0      # the consumer's counter, its own copy (never read back)
        self._tail = 0      # the producer's counter, likewise

    def release(self) -> None:
        """Drop the views on the mapping (the mapping cannot close while they exist)."""
        self._words.release()
        self._data.release()

    # -- producer --------------------------------------------------------------------------
    def push(self, data: bytes) -> bool:
        """Write one record and publish it. False: no room (the datagram is lost, as over
        UDP). RingCorrupt: the consumer's head is impossible."""
        n = len(data)
        if not 0 < n <= self.max_record:
            raise ValueError(f"a record is 1..{self.max_record} bytes, not {n}")
        tail = self._tail
        used = tail - self._words[_HEAD]
        if not 0 <= used <= self.capacity:
            raise RingCorrupt("bad_index", f"head is {used} bytes behind tail")
        need = record_size(n)
        if self.capacity - used < need:
            return False
        d, pos = self._data, tail & self._mask
        _LEN.pack_into(d, pos, n)
        start = pos + 4
        first = min(n, self.capacity - start)
        d[start:start + first] = data[:first]
        if first < n:
            d[:n - first] = data[first:]
        self._tail = tail + need
        self._words[_TAIL] = self._tail       # after the record: TSO keeps store order
        return True

    def wants_doorbell(self) -> bool:
        """After pushing: does the consumer sleep (so the eventfd must be written)? The
        fence orders our tail store before this load of its flag (see full_fence)."""
        full_fence()
        return self._words[_WAITING] != 0

    # -- consumer --------------------------------------------------------------------------
    def pop_batch(self, limit: int) -> list[bytes]:
        """Up to `limit` records, oldest first, with one load of tail and one store of head.
        RingCorrupt if tail or a length is impossible: nothing is read out of bounds."""
        head = self._head
        avail = self._words[_TAIL] - head
        if avail == 0:
            return []
        if not 0 < avail <= self.capacity or avail & (ALIGN - 1):
            raise RingCorrupt("bad_index", f"tail is {avail} bytes ahead of head")
        d, cap = self._data, self.capacity
        out: list[bytes] = []
        try:
            while avail and len(out) < limit:
                pos = head & self._mask
                n = _LEN.unpack_from(d, pos)[0]
                need = record_size(n)
                if not 0 < n <= self.max_record or need > avail:
                    raise RingCorrupt("bad_length", f"record length {n}, {avail} bytes left")
                start = pos + 4
                first = min(n, cap - start)
                rec = bytes(d[start:start + first])
                if first < n:
                    rec += bytes(d[:n - first])
                out.append(rec)
                head += need
                avail -= need
        finally:
            if head != self._head:   # the records read so far are consumed either way
                self._head = head
                self._words[_HEAD] = head   # after the reads: TSO keeps load→store order
        return out

    def pending(self) -> bool:
        return self._words[_TAIL] != self._head

    def arm(self) -> bool:
        """Before sleeping on the doorbell: raise the waiting flag, then look once more.
        True: records are there already (don't sleep). The fence makes sure that either the
        producer sees our flag or we see its tail."""
        self._words[_WAITING] = 1
        full_fence()
        return self._words[_TAIL] != self._head

    def disarm(self) -> None:
        """Awake and polling: the producer may skip the doorbell."""
        self._words[_WAITING] = 0

    def counters(self) -> tuple[int, int]:
        """(head, tail) as the shared header says (for tests and diagnostics)."""
        return self._words[_HEAD], self._words[_TAIL]


class Region:
    """A mapped memfd with its two rings."""

    def __init__(self, fd: int, req_capacity: int, resp_capacity: int,
                 max_record: int = MAX_RECORD) -> None:
        size = region_size(req_capacity, resp_capacity)
        if os.fstat(fd).st_size < size:
            raise ValueError("the shared-memory region is smaller than announced")
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        off = REGION_HDR
        self.requests = Ring(self.mm, off, req_capacity, max_record)
        self.responses = Ring(self.mm, off + RING_HDR + req_capacity, resp_capacity, max_record)

    @classmethod
    def create(cls, req_capacity: int, resp_capacity: int,
               name: str = "zerolayer-shm") -> tuple[Region, int]:
        """A fresh zero-filled memfd (so a new connection never sees old data), its size
        sealed. Returns the region and the memfd (the caller passes it on, then closes it)."""
        check_capacity(req_capacity)
        check_capacity(resp_capacity)
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, region_size(req_capacity, resp_capacity))
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            region = cls(fd, req_capacity, resp_capacity)
            _REGION.pack_into(region.mm, 0, MAGIC, VERSION, 0, req_capacity, resp_capacity)
        except BaseException:
            os.close(fd)
            raise
        return region, fd

    def close(self) -> None:
        self.requests.release()
        self.responses.release()
        self.mm.close()


def pack_hello(status: int, slot: int = 0, req_capacity: int = 0, resp_capacity: int = 0) -> bytes:
    size = region_size(req_capacity, resp_capacity) if status == STATUS_OK else 0
    return HELLO.pack(MAGIC, VERSION, status, slot, req_capacity, resp_capacity, MAX_RECORD,
                      size)


def unpack_hello(msg: bytes) -> tuple[int, int, int, int, int]:
    """(status, slot, request capacity, response capacity, max record); ValueError if it is
    not a v1 greeting."""
    if len(msg) != HELLO.size:
        raise ValueError(f"bad greeting from the daemon ({len(msg)} bytes)")
    magic, version, status, slot, req_cap, resp_cap, max_record, _ = HELLO.unpack(msg)
    if magic != MAGIC or version != VERSION:
        raise ValueError("the socket is not a zerolayer shared-memory endpoint (v1)")
    if status == STATUS_OK:
        check_capacity(req_cap)
        check_capacity(resp_cap)
        if not 0 < max_record <= MAX_RECORD:
            raise ValueError(f"bad max record {max_record}")
    return status, slot, req_cap, resp_cap, max_record
