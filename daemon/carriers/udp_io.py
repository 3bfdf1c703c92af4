"""Batched UDP receive and send with recvmmsg(2)/sendmmsg(2), through ctypes.

Python's socket module has no recvmmsg/sendmmsg; one syscall per datagram costs ~2-5 us of
Python overhead each, which dominates under a burst (a 1 MiB invoke is ~750 datagrams, and
a flood of garbage is as many as the sender can make). One call here moves up to `batch`
datagrams. Buffers and headers are allocated once and reused.

Falls back to recvfrom/sendto where libc lacks the calls (the same semantics, slower).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import struct

MSG_DONTWAIT = 0x40
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _msghdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.POINTER(_iovec)), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _msghdr), ("msg_len", ctypes.c_uint)]


_SOCKADDR_LEN = 128  # sockaddr_storage
_MMSG_SIZE = ctypes.sizeof(_mmsghdr)
_LEN_OFF = _mmsghdr.msg_len.offset
_NAMELEN_OFF = _mmsghdr.msg_hdr.offset + _msghdr.msg_namelen.offset
_FLAGS_OFF = _mmsghdr.msg_hdr.offset + _msghdr.msg_flags.offset
_U32 = struct.Struct("=I")
_ADDR_CACHE = 65536  # decoded client addresses kept


def _encode_addr(addr: tuple, family: int) -> bytes:
    if family == socket.AF_INET:
        return struct.pack("<H", socket.AF_INET) + struct.pack("!H", addr[1]) + \
            socket.inet_pton(socket.AF_INET, addr[0]) + b"\0" * 8
    flow = addr[2] if len(addr) > 2 else 0
    scope = addr[3] if len(addr) > 3 else 0
    return struct.pack("<H", socket.AF_INET6) + struct.pack("!HI", addr[1], flow) + \
        socket.inet_pton(socket.AF_INET6, addr[0]) + struct.pack("<I", scope)


def _decode_addr(raw: bytes) -> tuple:
    fam = struct.unpack_from("<H", raw)[0]
    if fam == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack_from("!H", raw, 2)[0]
    port, flow = struct.unpack_from("!HI", raw, 2)
    return (socket.inet_ntop(socket.AF_INET6, raw[8:24]), port, flow,
            struct.unpack_from("<I", raw, 24)[0])


class BatchedUDP:
    def __init__(self, sock: socket.socket, batch: int = 64, bufsize: int = 2048):
        self.sock = sock
        self.fd = sock.fileno()
        self.family = sock.family
        self.batch = batch
        self.bufsize = bufsize
        self.native = hasattr(_libc, "recvmmsg") and hasattr(_libc, "sendmmsg")
        self._bufs = ctypes.create_string_buffer(batch * bufsize)
        self._names = ctypes.create_string_buffer(batch * _SOCKADDR_LEN)
        self._bufs_mv = memoryview(self._bufs).cast("B")
        self._names_mv = memoryview(self._names).cast("B")
        self._iov = (_iovec * batch)()
        self._rx = (_mmsghdr * batch)()
        base = ctypes.addressof(self._bufs)
        nbase = ctypes.addressof(self._names)
        for i in range(batch):
            self._iov[i].iov_base = base + i * bufsize
            self._iov[i].iov_len = bufsize
            h = self._rx[i].msg_hdr
            h.msg_name = nbase + i * _SOCKADDR_LEN
            h.msg_iov = ctypes.pointer(self._iov[i])
            h.msg_iovlen = 1
            h.msg_namelen = _SOCKADDR_LEN
        # The headers as bytes: a length read and two resets per datagram through struct,
        # where each ctypes field access cost more than the three together.
        self._rx_mv = memoryview(self._rx).cast("B")
        self._addrs: dict[bytes, tuple] = {}
        # the bytes that tell two senders apart: family, port, address (and, for IPv6,
        # flow label and scope)
        self._name_len = 8 if self.family == socket.AF_INET else 28
        self._tx = (_mmsghdr * batch)()
        self._tx_iov = (_iovec * batch)()
        self.rx_calls = 0
        self.tx_calls = 0
        self.undeliverable = 0  # datagrams the kernel refused for their destination (send_batch)

    def recv_batch(self) -> list[tuple[bytes, tuple]]:
        """Every datagram waiting now (up to `batch`), without blocking. Truncated datagrams
        (longer than bufsize) are returned cut, and the protocol layer rejects them."""
        if not self.native:
            return self._recv_fallback()
        # The kernel only rewrites the headers it fills, so only those are reset (below):
        # resetting all `batch` of them through ctypes cost ~25 us per empty poll.
        n = _libc.recvmmsg(self.fd, self._rx, self.batch, MSG_DONTWAIT, None)
        self.rx_calls += 1
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return []
            if err in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                return []  # ICMP for an earlier send: nothing to read, nothing lost
            raise OSError(err, os.strerror(err))
        out = []
        raw, names, hdrs = self._bufs_mv, self._names_mv, self._rx_mv  # .raw would copy
        bufsize, addrs, name_len = self.bufsize, self._addrs, self._name_len
        for i in range(n):
            h = i * _MMSG_SIZE
            ln = min(_U32.unpack_from(hdrs, h + _LEN_OFF)[0], bufsize)
            o = i * bufsize
            no = i * _SOCKADDR_LEN
            # a client's address is decoded once (inet_ntop and two unpacks), then looked up
            key = bytes(names[no:no + name_len])
            addr = addrs.get(key)
            if addr is None:
                if len(addrs) >= _ADDR_CACHE:   # bounded: spoofed sources can't grow it
                    addrs.clear()
                addr = addrs[key] = _decode_addr(bytes(names[no:no + _SOCKADDR_LEN]))
            out.append((bytes(raw[o:o + ln]), addr))
            _U32.pack_into(hdrs, h + _NAMELEN_OFF, _SOCKADDR_LEN)
            _U32.pack_into(hdrs, h + _FLAGS_OFF, 0)
        return out

    def _recv_fallback(self) -> list[tuple[bytes, tuple]]:
        out = []
        for _ in range(self.batch):
            try:
                out.append(self.sock.recvfrom(self.bufsize, MSG_DONTWAIT))
            except (BlockingIOError, InterruptedError, ConnectionRefusedError):
                break
        return out

    def send_batch(self, items: list[tuple[bytes, tuple]]) -> int:
        """Send the items in order; returns how many were dealt with. A full socket buffer
        drops the rest (the protocol recovers them with RESEND). A datagram the kernel
        refuses for its destination alone (no route to it, a pending ICMP error, a firewall)
        is dropped and counted in `undeliverable`, and the others still go: a client with a
        spoofed or unreachable address must cost the daemon nothing but that datagram."""
        sent = 0
        while sent < len(items):
            chunk = items[sent:sent + self.batch]
            # One or two datagrams (a PONG, an ACK): plain sendto is cheaper than building
            # the mmsghdr array through ctypes.
            if not self.native or len(chunk) <= 2:
                for data, addr in chunk:
                    try:
                        self.sock.sendto(data, addr)
                    except (BlockingIOError, InterruptedError):
                        return sent
                    except OSError:
                        self.undeliverable += 1
                    sent += 1
                continue
            keep = []  # the buffers must outlive the call
            for i, (data, addr) in enumerate(chunk):
                b = ctypes.create_string_buffer(data, len(data))
                a = ctypes.create_string_buffer(_encode_addr(addr, self.family), _SOCKADDR_LEN)
                keep.append((b, a))
                self._tx_iov[i].iov_base = ctypes.addressof(b)
                self._tx_iov[i].iov_len = len(data)
                h = self._tx[i].msg_hdr
                h.msg_name = ctypes.addressof(a)
                h.msg_namelen = 16 if self.family == socket.AF_INET else 28
                h.msg_iov = ctypes.pointer(self._tx_iov[i])
                h.msg_iovlen = 1
            n = _libc.sendmmsg(self.fd, self._tx, len(chunk), MSG_DONTWAIT)
            self.tx_calls += 1
            if n < 0:  # the chunk's first datagram failed: why decides what follows
                err = ctypes.get_errno()
                if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                    return sent
                self.undeliverable += 1  # its destination's fault: skip it, send the rest
                sent += 1
                continue
            if n == 0:
                return sent
            sent += n  # short: the next call reports why message n failed (full, or its own)
        return sent
