"""The UDP carrier: a connected socket per channel (a request, or a PING).

A connector resolves the daemon's address once and keeps the sockets of finished channels
for the next ones, the way an HTTP client keeps a connection alive: a fresh socket is a
getaddrinfo, a socket, a connect and a close per call, which on a loaded host is most of
the SDK's PING round trip. A socket serves one channel at a time, so concurrent calls still
never see each other's datagrams. A late datagram of a finished call that reaches the next
user of its socket is not lost information: it is not addressed to that call's request id,
and authentication (retry_policy.authenticate) drops it as foreign.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time

RECV_BUF = 2048
IDLE_SOCKETS = 8        # kept per connector: the most calls one Client usually has at once

SockAddr = tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes]
Resolved = tuple[socket.AddressFamily, socket.SocketKind, int, SockAddr]


def _resolve(address: tuple[str, int]) -> Resolved:
    family, stype, proto, _, sockaddr = socket.getaddrinfo(address[0], address[1],
                                                           type=socket.SOCK_DGRAM)[0]
    return family, stype, proto, sockaddr


def _udp_socket(where: Resolved) -> socket.socket:
    family, stype, proto, sockaddr = where
    s = socket.socket(family, stype, proto)
    try:
        # connect(): the kernel then delivers only datagrams from the daemon's address to us.
        s.connect(sockaddr)
    except BaseException:
        s.close()
        raise
    return s


def _drained(s: socket.socket) -> bool:
    """Read what is queued on a finished channel's socket; False if it is not fit to reuse
    (a pending error, e.g. ICMP port unreachable from a restarting daemon)."""
    try:
        s.setblocking(False)
        while True:
            s.recv(RECV_BUF)
    except BlockingIOError:
        return True
    except OSError:
        return False


class UdpChannel:
    def __init__(self, sock: socket.socket, owner: UdpConnector | None = None) -> None:
        self._sock: socket.socket | None = sock
        self._owner = owner
        self._clean = True

    def send(self, datagram: bytes) -> None:
        if self._sock is None:
            return
        try:
            self._sock.send(datagram)
        except (ConnectionRefusedError, BlockingIOError):
            pass   # a lost datagram, as far as the protocol is concerned: timers will retry

    def recv(self, timeout_s: float) -> bytes | None:
        if self._sock is None:
            return None
        self._sock.settimeout(max(timeout_s, 1e-4))
        try:
            return self._sock.recv(RECV_BUF)
        except (TimeoutError, BlockingIOError):
            return None
        except OSError:      # ICMP port unreachable etc.: the daemon may be restarting
            self._clean = False
            time.sleep(min(timeout_s, 0.01))   # do not spin on a stream of ICMP errors
            return None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._owner is None or not self._clean:
            sock.close()
        else:
            self._owner.release(sock)


class UdpConnector:
    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self._where: Resolved | None = None
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()     # a Client may be shared by threads
        self._closed = False

    def open(self, request_id: bytes) -> UdpChannel:
        with self._lock:
            sock = self._idle.pop() if self._idle else None
            where = self._where
        if sock is None:
            if where is None:
                where = self._where = _resolve(self.address)
            sock = _udp_socket(where)
        return UdpChannel(sock, self)

    def release(self, sock: socket.socket) -> None:
        """Take back a finished channel's socket for a later call, or close it."""
        if _drained(sock):
            with self._lock:
                if not self._closed and len(self._idle) < IDLE_SOCKETS:
                    self._idle.append(sock)
                    return
        sock.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
        for s in idle:
            s.close()


class _DatagramQueue(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.queue.put_nowait(data)

    def error_received(self, exc: Exception) -> None:
        pass         # ICMP port unreachable: the daemon may be restarting; timers retry


class AsyncUdpChannel:
    def __init__(self, transport: asyncio.DatagramTransport, proto: _DatagramQueue) -> None:
        self._transport: asyncio.DatagramTransport | None = transport
        self._queue = proto.queue

    def send(self, datagram: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.sendto(datagram)

    async def recv(self, timeout_s: float) -> bytes | None:
        if not self._queue.empty():
            return self._queue.get_nowait()
        try:
            return await asyncio.wait_for(self._queue.get(), max(timeout_s, 1e-4))
        except TimeoutError:
            return None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None


class AsyncUdpConnector:
    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self._where: Resolved | None = None

    async def open(self, request_id: bytes) -> AsyncUdpChannel:
        loop = asyncio.get_running_loop()
        if self._where is None:
            self._where = _resolve(self.address)
        sock = _udp_socket(self._where)
        sock.setblocking(False)
        transport, proto = await loop.create_datagram_endpoint(_DatagramQueue, sock=sock)
        return AsyncUdpChannel(transport, proto)

    async def aclose(self) -> None:
        pass
