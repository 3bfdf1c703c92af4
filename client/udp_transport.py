"""The UDP carrier: a connected socket per channel (a request, or a PING)."""
from __future__ import annotations

import asyncio
import socket
import time

RECV_BUF = 2048


def _udp_socket(address: tuple[str, int]) -> socket.socket:
    family, stype, proto, _, sockaddr = socket.getaddrinfo(address[0], address[1],
                                                           type=socket.SOCK_DGRAM)[0]
    s = socket.socket(family, stype, proto)
    try:
        # connect(): the kernel then delivers only datagrams from the daemon's address to us.
        s.connect(sockaddr)
    except BaseException:
        s.close()
        raise
    return s


class UdpChannel:
    def __init__(self, address: tuple[str, int]) -> None:
        self._sock: socket.socket | None = _udp_socket(address)

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
            time.sleep(min(timeout_s, 0.01))   # do not spin on a stream of ICMP errors
            return None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class UdpConnector:
    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address

    def open(self, request_id: bytes) -> UdpChannel:
        return UdpChannel(self.address)

    def close(self) -> None:
        pass


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

    async def open(self, request_id: bytes) -> AsyncUdpChannel:
        loop = asyncio.get_running_loop()
        sock = _udp_socket(self.address)
        sock.setblocking(False)
        transport, proto = await loop.create_datagram_endpoint(_DatagramQueue, sock=sock)
        return AsyncUdpChannel(transport, proto)

    async def aclose(self) -> None:
        pass
