"""The same-host shared-memory ingress: a third carrier beside UDP and AF_XDP.

A client on this host connects to a Unix SOCK_SEQPACKET socket ([shm] socket). For each
connection this module makes a fresh memfd holding a request ring and a response ring
(protocol/shm_ring.py, the layout both sides import) and two eventfds (doorbells),
and passes the three fds with SCM_RIGHTS in its one greeting message. The connection then
stays open only so that each side sees the other die: EOF on it frees the client's rings.

The datagrams are the protocol's, unchanged: they go to the same Front.receive as
UDP's (HMAC, timestamp, nonce, reassembly, result cache), with the connection object as the
peer address, so a reply goes back into that connection's response ring (send_batch), and a
request id is global: a duplicate over UDP attaches to a request begun over shm and v.v.

Everything runs on the I/O thread, without blocking: one epoll set (its fd is in the
loop's select list) holds the listener, every connection socket and every request doorbell.
The loop calls poll_events (accept, hang-ups, doorbells), recv_batch (the rings: plain
memory reads) and, before it sleeps, arm (raise each ring's waiting flag, so clients ring
the doorbell only while the daemon sleeps).

A client is untrusted on top of its HMAC: a ring whose counters or record lengths are
impossible (shm_ring.RingCorrupt), or bytes written on the socket, drop that connection only,
counted by reason; its memfd is sealed against resizing, so it cannot fault the daemon.
Permissions: the socket file's mode/group decide who can connect at all, and SO_PEERCRED
is checked against [shm] allowed_uids / allowed_gids when either is set.
"""
from __future__ import annotations

import grp
import logging
import os
import select
import socket
import stat
import struct
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from zerolayer.protocol.shm_ring import (
    STATUS_FULL,
    STATUS_OK,
    STATUS_REFUSED_PEER,
    Region,
    RingCorrupt,
    check_platform,
    pack_hello,
)

if TYPE_CHECKING:
    from ..config import ShmSection
    from ..ops.logs import Log

CONNECT_RESULTS = ("accepted", "refused_peer", "refused_full", "failed")
RING_ERRORS = ("bad_index", "bad_length", "protocol")
LISTEN_BACKLOG = 64
_PEERCRED = struct.Struct("3i")   # struct ucred: pid, uid, gid


def resolve_path(setting: str, environ: Mapping[str, str] | None = None) -> str:
    """[shm] socket: "" = off; "auto" = $RUNTIME_DIRECTORY/shm.sock under systemd, else off;
    anything else is the path (the same rule as the control socket's)."""
    environ = os.environ if environ is None else environ
    if setting != "auto":
        return setting
    rd = environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return os.path.join(rd, "shm.sock") if rd else ""


def parse_ids(spec: str) -> frozenset[int]:
    """"0,1001" -> {0, 1001}; "" -> empty (no check)."""
    return frozenset(int(p) for p in (p.strip() for p in spec.split(",")) if p)


class ShmConn:
    """One client: its socket, rings and doorbells. It is also the reply address the daemon
    keeps for the client's requests: identity, not a slot number, so a reply for a dead
    client can never land in the ring of a later one that took its slot."""

    __slots__ = ("sock", "slot", "region", "req_efd", "resp_efd", "pid", "uid", "gid",
                 "closed")

    def __init__(self, sock: socket.socket, slot: int, region: Region, req_efd: int,
                 resp_efd: int, cred: tuple[int, int, int]) -> None:
        self.sock = sock
        self.slot = slot
        self.region = region
        self.req_efd = req_efd
        self.resp_efd = resp_efd
        self.pid, self.uid, self.gid = cred
        self.closed = False

    def __repr__(self) -> str:
        return f"shm[{self.slot}] pid {self.pid} uid {self.uid}"


# A frame's destination: a ShmConn, or another carrier's address (passed through).
_Dest = TypeVar("_Dest")


class ShmIngress:
    def __init__(self, listener: socket.socket, path: str, *, ring_bytes: int,
                 max_clients: int, allowed_uids: frozenset[int] = frozenset(),
                 allowed_gids: frozenset[int] = frozenset(), batch: int = 64,
                 log: Log = print) -> None:
        self.listener = listener
        self.path = path
        self.ring_bytes = ring_bytes
        self.allowed_uids = allowed_uids
        self.allowed_gids = allowed_gids
        self.batch = batch
        self.log = log
        st = os.stat(path)
        self._inode = (st.st_dev, st.st_ino)  # close() removes the file only if still ours
        self.ep = select.epoll()
        self.ep.register(listener.fileno(), select.EPOLLIN)
        self.slots: list[ShmConn | None] = [None] * max_clients
        self.conns: list[ShmConn] = []
        self._by_fd: dict[int, ShmConn] = {}       # socket and request doorbell → conn
        self.more = False                          # a ring still held records after recv
        self.stats = {name: 0 for name in CONNECT_RESULTS + RING_ERRORS}
        self.stats["ring_full_drops"] = 0

    @classmethod
    def open(cls, path: str, *, mode: int = 0o660, group: str = "", ring_bytes: int,
             max_clients: int, allowed_uids: frozenset[int] = frozenset(),
             allowed_gids: frozenset[int] = frozenset(), batch: int = 64,
             log: Log = print) -> ShmIngress:
        """Bind and listen on `path` (a stale socket file of an earlier run is replaced)."""
        check_platform()
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise OSError(f"[shm] socket {path} exists and is not a socket")
            os.unlink(path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.bind(path)   # the umask's mode leaves it unconnectable by others until chmod
            if group:
                os.chown(path, -1, grp.getgrnam(group).gr_gid)
            os.chmod(path, mode)
            s.listen(LISTEN_BACKLOG)
            s.setblocking(False)
        except BaseException:
            s.close()
            raise
        return cls(s, path, ring_bytes=ring_bytes, max_clients=max_clients,
                   allowed_uids=allowed_uids, allowed_gids=allowed_gids, batch=batch, log=log)

    def fileno(self) -> int:
        return self.ep.fileno()

    # -- events ----------------------------------------------------------------------------
    def poll_events(self) -> None:
        """Accept new clients, notice hang-ups, clear doorbells; one epoll_wait(0). The
        loop is awake from here on, so clients need not ring: disarm."""
        lfd = self.listener.fileno()
        for fd, _ in self.ep.poll(0):
            if fd == lfd:
                self._accept_all()
                continue
            c = self._by_fd.get(fd)
            if c is None:
                continue
            if fd == c.req_efd:
                try:
                    os.eventfd_read(fd)
                except BlockingIOError:
                    pass
            else:
                self._on_socket(c)
        for c in self.conns:
            c.region.requests.disarm()

    def arm(self) -> bool:
        """Before the loop sleeps: ask every client to ring. True if a ring already holds
        records (then the loop must not sleep)."""
        pending = False
        for c in self.conns:
            pending |= c.region.requests.arm()
        return pending

    def spin(self, seconds: float, other_fds: list) -> bool:
        """Look at the request rings (memory reads, no syscall) for up to `seconds`, and at
        `other_fds` (one select(0)) every 16 turns, so UDP and the engine wait no longer than
        ~one such turn. True as soon as anything is there: the loop goes round instead of
        sleeping, and the client's datagram needs no doorbell and no wake-up."""
        rings = [c.region.requests for c in self.conns]
        end = time.monotonic() + seconds
        turn = 0
        while True:
            for r in rings:
                if r.pending():
                    return True
            turn += 1
            if not turn & 15:
                if select.select(other_fds, [], [], 0.0)[0]:
                    return True
                if time.monotonic() >= end:
                    return False

    def _on_socket(self, c: ShmConn) -> None:
        try:
            data = c.sock.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        # EOF: the client closed or died. Anything else breaks the protocol (the client
        # never writes on the socket after connecting).
        self._drop(c, "protocol" if data else None)

    def _accept_all(self) -> None:
        while True:
            try:
                s, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:   # EMFILE and the like: the client will retry
                self.stats["failed"] += 1
                self.log(f"shm: accept failed: {e}", logging.WARNING)
                return
            self._accept(s)

    def _accept(self, s: socket.socket) -> None:
        fds: list[int] = []
        region: Region | None = None
        try:
            s.setblocking(False)
            cred = _PEERCRED.unpack(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                 _PEERCRED.size))
            if not self._allowed(cred[1], cred[2]):
                self._refuse(s, STATUS_REFUSED_PEER, "refused_peer")
                self.log(f"shm: refused pid {cred[0]} uid {cred[1]} gid {cred[2]} "
                         f"(not in [shm] allowed_uids/allowed_gids)", logging.WARNING)
                return
            slot = next((i for i, c in enumerate(self.slots) if c is None), None)
            if slot is None:
                self._refuse(s, STATUS_FULL, "refused_full")
                return
            region, memfd = Region.create(self.ring_bytes, self.ring_bytes)
            fds.append(memfd)
            req_efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            fds.append(req_efd)
            resp_efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            fds.append(resp_efd)
            socket.send_fds(s, [pack_hello(STATUS_OK, slot, self.ring_bytes, self.ring_bytes)],
                            fds)
            os.close(memfd)   # the mapping keeps the memory; the client has its own fd
            c = ShmConn(s, slot, region, req_efd, resp_efd, cred)
            self.ep.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
            self.ep.register(req_efd, select.EPOLLIN)
        except (OSError, ValueError) as e:
            self.stats["failed"] += 1
            self.log(f"shm: connection setup failed: {e}", logging.WARNING)
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            if region is not None:
                region.close()
            try:
                self.ep.unregister(s.fileno())
            except (OSError, ValueError):
                pass
            s.close()
            return
        self.slots[slot] = c
        self.conns.append(c)
        self._by_fd[s.fileno()] = c
        self._by_fd[req_efd] = c
        self.stats["accepted"] += 1
        self.log(f"shm: connected {c}", logging.DEBUG)

    def _allowed(self, uid: int, gid: int) -> bool:
        if not self.allowed_uids and not self.allowed_gids:
            return True
        return uid in self.allowed_uids or gid in self.allowed_gids

    def _refuse(self, s: socket.socket, status: int, result: str) -> None:
        self.stats[result] += 1
        try:
            s.send(pack_hello(status))   # say why, so the client can raise a clear error
        except OSError:
            pass
        s.close()

    def _drop(self, c: ShmConn, reason: str | None) -> None:
        """Free a client's rings: it hung up (reason None) or broke the protocol."""
        if c.closed:
            return
        c.closed = True
        if reason is not None:
            self.stats[reason] += 1
            self.log(f"shm: dropped {c}: {reason}", logging.WARNING)
        else:
            self.log(f"shm: disconnected {c}", logging.DEBUG)
        for fd in (c.sock.fileno(), c.req_efd):
            self._by_fd.pop(fd, None)
            try:
                self.ep.unregister(fd)
            except (OSError, ValueError):
                pass
        c.sock.close()
        os.close(c.req_efd)
        os.close(c.resp_efd)
        c.region.close()
        self.slots[c.slot] = None
        self.conns.remove(c)

    # -- datagrams -------------------------------------------------------------------------
    def recv_batch(self) -> list[tuple[bytes, ShmConn]]:
        """Up to `batch` datagrams from each client's request ring."""
        out: list[tuple[bytes, ShmConn]] = []
        more = False
        for c in list(self.conns):
            try:
                recs = c.region.requests.pop_batch(self.batch)
            except RingCorrupt as e:
                self._drop(c, e.reason)
                continue
            more |= len(recs) == self.batch
            out += [(r, c) for r in recs]
        self.more = more
        return out

    def send_batch(self, items: Sequence[tuple[bytes, _Dest]]) -> list[tuple[bytes, _Dest]]:
        """Write the frames addressed to shm clients into their response rings and ring the
        doorbells of those that sleep; return the other frames (for UDP / AF_XDP), addressed
        as they came."""
        rest: list[tuple[bytes, _Dest]] = []
        touched: dict[ShmConn, None] = {}   # in order, once each
        for item in items:
            c = item[1]
            if not isinstance(c, ShmConn):
                rest.append(item)
                continue
            if c.closed:
                continue   # the client is gone; if it comes back its retry finds the cache
            try:
                if not c.region.responses.push(item[0]):
                    self.stats["ring_full_drops"] += 1   # lost, like UDP: RESEND recovers
                    continue
            except RingCorrupt as e:
                self._drop(c, e.reason)
                continue
            touched[c] = None
        for conn in touched:
            if not conn.closed and conn.region.responses.wants_doorbell():
                try:
                    os.eventfd_write(conn.resp_efd, 1)
                except OSError:
                    pass
        return rest

    def close(self) -> None:
        for c in list(self.conns):
            self._drop(c, None)
        self.ep.close()
        self.listener.close()
        try:   # a successor started meanwhile may have bound the path anew: leave that one
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                os.unlink(self.path)
        except OSError:
            pass


def open_from_config(cfg: ShmSection, batch: int,
                     log: Log) -> ShmIngress | None:
    """The ingress for the [shm] section, or None when it is off."""
    path = resolve_path(cfg.socket)
    if not path:
        return None
    return ShmIngress.open(path, mode=int(cfg.mode, 8), group=cfg.group,
                           ring_bytes=cfg.ring_bytes, max_clients=cfg.max_clients,
                           allowed_uids=parse_ids(cfg.allowed_uids),
                           allowed_gids=parse_ids(cfg.allowed_gids), batch=batch, log=log)
