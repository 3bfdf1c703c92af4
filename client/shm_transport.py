"""The client side of the same-host shared-memory carrier (docs/PROTOCOL.md "Same-host
shared-memory carrier"): ShmConnector (threads) and AsyncShmConnector (asyncio).

The datagrams are exactly those of UDP, signed and checked the same way; only the carrier
differs. A connector holds one *session*: a SOCK_SEQPACKET connection to the daemon's
socket, over which the daemon passed a memfd with a request ring and a response ring
(protocol/shm_ring.py) and two eventfds, the doorbells. All channels of a connector (one per
request) share the session: sends go into the request ring under a lock, and responses are
sorted to channels by the request id at bytes 16..32 of every response datagram.

As over UDP a datagram can be lost (a full ring, a daemon restart), and the SDK's timers
resend. When the daemon goes away (EOF on the socket) the session is dropped and the next
send connects again, so a restarted daemon is found within the SDK's retry window. Only a
refusal (the daemon does not allow this uid/gid) raises, at open(), since retrying cannot
help.

Threads (ShmConnector): whichever thread waits in recv() first *leads*: it reads the
response ring for everyone (sorting records into the channels' queues) and sleeps on the
doorbell; the others wait on a condition until their datagram or the lead is theirs. So
with one calling thread (the common case) a datagram goes ring → caller with no hand-off.
`busy_poll_us`: the leader spins on the ring that long before sleeping on the doorbell,
which saves the wake-up (a few µs) at the cost of CPU.
"""
from __future__ import annotations

import asyncio
import collections
import os
import select
import socket
import threading
import time

from zerolayer.protocol.shm_ring import (
    HELLO,
    STATUS_OK,
    STATUS_REFUSED_PEER,
    STATUS_TEXT,
    Region,
    RingCorrupt,
    check_platform,
    unpack_hello,
)

RID = slice(16, 32)           # request id in every datagram's common header (wire.py)
CONNECT_TIMEOUT_S = 5.0
DEAD_WAIT_S = 0.05            # no daemon to wait on: look again this often
POP_LIMIT = 1024


class ShmRefusedError(PermissionError):
    """The daemon refused this process (its uid/gid is not in [shm] allowed_uids/gids)."""


class ShmSession:
    """One connection: the socket (its EOF means the daemon is gone), the mapped rings and
    the doorbells. The client produces into `requests` and consumes `responses`."""

    def __init__(self, sock: socket.socket, region: Region, req_efd: int, resp_efd: int,
                 slot: int) -> None:
        self.sock = sock
        self.region = region
        self.req_efd = req_efd
        self.resp_efd = resp_efd
        self.slot = slot
        self.lock = threading.Lock()    # one producer at a time; close waits for it
        self.dead = False
        self.closed = False
        self.ring_full_drops = 0

    @classmethod
    def connect(cls, path: str, timeout_s: float = CONNECT_TIMEOUT_S) -> ShmSession:
        check_platform()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.settimeout(timeout_s)
            s.connect(path)
            msg, fds, _, _ = socket.recv_fds(s, HELLO.size + 64, 3)
        except BaseException:
            s.close()
            raise
        return cls.adopt(s, msg, fds)

    @classmethod
    def adopt(cls, s: socket.socket, msg: bytes, fds: list[int]) -> ShmSession:
        """Turn the daemon's greeting (and its fds) into a session, or raise."""
        try:
            if not msg:
                raise ConnectionRefusedError("the daemon closed the shared-memory connection")
            status, slot, req_cap, resp_cap, max_record = unpack_hello(msg)
            if status == STATUS_REFUSED_PEER:
                raise ShmRefusedError(STATUS_TEXT[status])
            if status != STATUS_OK:
                raise ConnectionRefusedError(STATUS_TEXT.get(status, f"refused ({status})"))
            if len(fds) != 3:
                raise ConnectionError(f"the daemon passed {len(fds)} fds, not 3")
            region = Region(fds[0], req_cap, resp_cap, max_record)
        except BaseException:
            for fd in fds:
                os.close(fd)
            s.close()
            raise
        os.close(fds[0])   # the mapping keeps the memory
        s.setblocking(False)
        return cls(s, region, fds[1], fds[2], slot)

    def send(self, datagram: bytes) -> None:
        """Best effort, like UDP: a full ring loses the datagram (counted)."""
        with self.lock:
            if self.dead:
                return
            try:
                ok = self.region.requests.push(datagram)
                if ok and self.region.requests.wants_doorbell():
                    os.eventfd_write(self.req_efd, 1)
            except RingCorrupt:
                self.dead = True
                return
            except OSError:      # the doorbell's counter is saturated: the daemon is awake
                return
        if not ok:
            self.ring_full_drops += 1

    def hung_up(self) -> bool:
        """The socket was readable: EOF (the daemon is gone) or a stray byte (ignored)."""
        try:
            data = self.sock.recv(16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.dead = True
        return not data

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = self.dead = True
            self.sock.close()
            os.close(self.req_efd)
            os.close(self.resp_efd)
            try:
                self.region.close()
            except BufferError:   # a view still in use somewhere: the GC unmaps it later
                pass


def _rid(datagram: bytes) -> bytes:
    return datagram[RID] if len(datagram) >= RID.stop else b""


# -- threads --------------------------------------------------------------------------------

class ShmChannel:
    def __init__(self, connector: ShmConnector, request_id: bytes) -> None:
        self._conn = connector
        self.request_id = request_id
        self.queue: collections.deque[bytes] = collections.deque()
        self.closed = False

    def send(self, datagram: bytes) -> None:
        if not self.closed:
            self._conn._send(datagram)

    def recv(self, timeout_s: float) -> bytes | None:
        return self._conn._recv(self, timeout_s)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._conn._unregister(self)


class ShmConnector:
    def __init__(self, path: str, busy_poll_us: int = 0,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.path = path
        self.busy_poll_us = busy_poll_us
        self.connect_timeout_s = connect_timeout_s
        self._mu = threading.Lock()              # channels, queues, the leader flag
        self._cv = threading.Condition(self._mu)
        self._connect_lock = threading.Lock()
        self._session: ShmSession | None = None
        self._channels: dict[bytes, list[ShmChannel]] = {}
        self._leading = False
        self._closed = False
        self.unrouted = 0                        # responses for no open channel (dropped)

    @property
    def session(self) -> ShmSession | None:
        return self._session

    def open(self, request_id: bytes) -> ShmChannel:
        self._current()          # connect now: a refusal raises here, not as a timeout
        ch = ShmChannel(self, request_id)
        with self._mu:
            self._channels.setdefault(request_id, []).append(ch)
        return ch

    def close(self) -> None:
        with self._mu:
            self._closed = True
            sess, self._session = self._session, None
            if sess is not None:
                sess.dead = True
                if not self._leading:      # else the leader closes it when it steps down
                    sess.close()
            self._cv.notify_all()

    def _current(self, timeout_s: float | None = None) -> ShmSession | None:
        """The live session, connecting if there is none (None if the daemon can't be
        reached now: the datagram is lost and the timers retry). A connect waits for the
        daemon's greeting at most `timeout_s` (default connect_timeout_s)."""
        s = self._session
        if s is not None and not s.dead:
            return s
        with self._connect_lock:
            with self._mu:
                if self._closed:
                    return None
                s = self._session
                if s is not None and not s.dead:
                    return s
                if s is not None:
                    self._session = None
                    if not self._leading:
                        s.close()
            try:
                s = ShmSession.connect(self.path, self.connect_timeout_s if timeout_s is None
                                       else max(1e-3, min(timeout_s, self.connect_timeout_s)))
            except ShmRefusedError:
                raise
            except (OSError, ValueError):
                return None
            with self._mu:
                if self._closed:
                    s.close()
                    return None
                self._session = s
                self._cv.notify_all()
            return s

    def _send(self, datagram: bytes) -> None:
        try:
            s = self._current()
        except ShmRefusedError:
            return
        if s is not None:
            s.send(datagram)

    def _unregister(self, ch: ShmChannel) -> None:
        with self._mu:
            chans = self._channels.get(ch.request_id)
            if chans is not None and ch in chans:
                chans.remove(ch)
                if not chans:
                    del self._channels[ch.request_id]
            self._cv.notify_all()

    def _dispatch(self, records: list[bytes]) -> None:
        with self._mu:
            for rec in records:
                chans = self._channels.get(_rid(rec))
                if not chans:
                    self.unrouted += 1
                for ch in chans or ():
                    ch.queue.append(rec)
            self._cv.notify_all()

    def _recv(self, ch: ShmChannel, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._mu:
            while True:
                if ch.queue:
                    return ch.queue.popleft()
                left = deadline - time.monotonic()
                if ch.closed or self._closed or left <= 0:
                    return None
                if not self._leading:
                    self._leading = True
                    break
                self._cv.wait(left)
        sess: ShmSession | None = None
        try:
            while True:
                cur = self._current(deadline - time.monotonic())   # recv's own deadline
                if sess is not None and sess is not cur and sess.dead:
                    sess.close()       # replaced while we led: only the leader reads it
                sess = cur
                with self._mu:
                    if ch.queue:
                        return ch.queue.popleft()
                    left = deadline - time.monotonic()
                    if ch.closed or self._closed or left <= 0:
                        return None
                    if sess is None:              # no daemon: wait a little, then retry
                        self._cv.wait(min(left, DEAD_WAIT_S))
                        continue
                self._lead_once(sess, left)
        finally:
            with self._mu:
                self._leading = False
                if sess is not None and sess.dead and sess is not self._session:
                    sess.close()
                self._cv.notify_all()

    def _lead_once(self, sess: ShmSession, left: float) -> None:
        """Read what is there; if nothing, spin (busy_poll_us), then sleep on the doorbell."""
        ring = sess.region.responses
        try:
            records = ring.pop_batch(POP_LIMIT)
            if records:
                self._dispatch(records)
                return
            if self.busy_poll_us:
                spin_end = time.monotonic() + min(left, self.busy_poll_us / 1e6)
                while time.monotonic() < spin_end:
                    if ring.pending():
                        return
            if ring.arm():
                ring.disarm()
                return
            try:
                sock_fd = sess.sock.fileno()
                r, _, _ = select.select([sess.resp_efd, sock_fd], [], [], left)
            finally:
                ring.disarm()
        except (RingCorrupt, ValueError, OSError):   # garbage, or closed under us
            sess.dead = True
            return
        if sock_fd in r:
            sess.hung_up()
        if sess.resp_efd in r:
            try:
                os.eventfd_read(sess.resp_efd)
            except BlockingIOError:
                pass


# -- asyncio --------------------------------------------------------------------------------

class AsyncShmChannel:
    def __init__(self, connector: AsyncShmConnector, request_id: bytes) -> None:
        self._conn = connector
        self.request_id = request_id
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.closed = False

    def send(self, datagram: bytes) -> None:
        if not self.closed:
            self._conn._send(datagram)

    async def recv(self, timeout_s: float) -> bytes | None:
        if not self.queue.empty():
            return self.queue.get_nowait()
        try:
            return await asyncio.wait_for(self.queue.get(), max(timeout_s, 1e-4))
        except TimeoutError:
            return None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._conn._unregister(self)


class AsyncShmConnector:
    """asyncio: the response doorbell and the socket are watched with loop.add_reader; the
    ring stays armed (the daemon rings after each batch it writes), so nothing polls."""

    def __init__(self, path: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.path = path
        self.connect_timeout_s = connect_timeout_s
        self._session: ShmSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channels: dict[bytes, list[AsyncShmChannel]] = {}
        self._connecting: asyncio.Task[None] | None = None
        self._closed = False
        self.unrouted = 0

    @property
    def session(self) -> ShmSession | None:
        return self._session

    async def open(self, request_id: bytes) -> AsyncShmChannel:
        try:
            await self._ensure()
        except ShmRefusedError:
            raise
        except (TimeoutError, OSError, ValueError):
            pass                  # the daemon is not there now: sends are lost, timers retry
        ch = AsyncShmChannel(self, request_id)
        self._channels.setdefault(request_id, []).append(ch)
        return ch

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            self._kill(self._session)

    async def _ensure(self) -> None:
        if self._closed or (self._session is not None and not self._session.dead):
            return
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        await asyncio.shield(self._connecting)

    async def _connect(self) -> None:
        check_platform()
        loop = self._loop = asyncio.get_running_loop()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(s, self.path), self.connect_timeout_s)
            readable: asyncio.Future[None] = loop.create_future()
            def on_readable() -> None:
                if not readable.done():
                    readable.set_result(None)
            loop.add_reader(s.fileno(), on_readable)
            try:
                await asyncio.wait_for(readable, self.connect_timeout_s)
            finally:
                loop.remove_reader(s.fileno())
            msg, fds, _, _ = socket.recv_fds(s, HELLO.size + 64, 3)
        except BaseException:
            s.close()
            raise
        sess = ShmSession.adopt(s, msg, fds)
        if self._closed:
            sess.close()
            return
        sess.region.responses.arm()       # for good: every batch the daemon writes rings
        loop.add_reader(sess.resp_efd, self._on_doorbell, sess)
        loop.add_reader(sess.sock.fileno(), self._on_socket, sess)
        self._session = sess
        self._drain(sess)

    def _kill(self, sess: ShmSession) -> None:
        if self._loop is not None and not sess.closed:
            self._loop.remove_reader(sess.resp_efd)
            self._loop.remove_reader(sess.sock.fileno())
        sess.close()
        if self._session is sess:
            self._session = None

    def _on_doorbell(self, sess: ShmSession) -> None:
        try:
            os.eventfd_read(sess.resp_efd)
        except BlockingIOError:
            pass
        self._drain(sess)

    def _on_socket(self, sess: ShmSession) -> None:
        if sess.hung_up():
            self._kill(sess)

    def _drain(self, sess: ShmSession) -> None:
        while not sess.closed:
            try:
                records = sess.region.responses.pop_batch(POP_LIMIT)
            except (RingCorrupt, ValueError):
                self._kill(sess)
                return
            if not records:
                return
            for rec in records:
                chans = self._channels.get(_rid(rec))
                if not chans:
                    self.unrouted += 1
                for ch in chans or ():
                    ch.queue.put_nowait(rec)

    def _send(self, datagram: bytes) -> None:
        sess = self._session
        if sess is None or sess.dead:
            if sess is not None:
                self._kill(sess)
            if not self._closed and (self._connecting is None or self._connecting.done()):
                # lost, as over UDP; the next attempt (the SDK's timers) finds the new session
                self._connecting = asyncio.get_running_loop().create_task(self._reconnect())
            return
        sess.send(datagram)

    async def _reconnect(self) -> None:
        try:
            await self._connect()
        except (TimeoutError, OSError, ValueError):
            pass

    def _unregister(self, ch: AsyncShmChannel) -> None:
        chans = self._channels.get(ch.request_id)
        if chans is not None and ch in chans:
            chans.remove(ch)
            if not chans:
                del self._channels[ch.request_id]
