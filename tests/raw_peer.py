"""A hand-made protocol peer for tests that must see every frame the daemon sends: signed
INVOKEs and control messages built with client.wire, a reader thread that files each
decoded frame under its request id, and keepalives for the requests a test wants to keep
(and stops when it wants a lease to run out). No SDK: nothing retries, re-sends or hides a
frame."""
from __future__ import annotations

import secrets
import socket
import threading
import time

from zerolayer.protocol import wire
from zerolayer.protocol.wire import MsgType

KEEPALIVE_S = 0.1


class RawPeer:
    def __init__(self, addr, key_id: int, secret: bytes):
        self.addr, self.key_id, self.secret = addr, key_id, secret
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(0.05)
        self.frames: dict[bytes, list] = {}
        self.kept: set[bytes] = set()
        self._cv = threading.Condition()
        self._stop = False
        self._threads = [threading.Thread(target=f, daemon=True)
                         for f in (self._read, self._keepalives)]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self._stop = True
        for t in self._threads:
            t.join(5)
        self.sock.close()

    # -- sending ---------------------------------------------------------------------------
    def send(self, datagrams: list[bytes]) -> None:
        for dg in datagrams:
            self.sock.sendto(dg, self.addr)

    def invoke_datagrams(self, body: bytes, rid: bytes | None = None, *,
                         key_id: int | None = None, secret: bytes | None = None,
                         timestamp_us: int | None = None) -> tuple[bytes, list[bytes]]:
        rid = rid or secrets.token_bytes(16)
        ts = time.time_ns() // 1000 if timestamp_us is None else timestamp_us
        return rid, wire.encode_invoke(self.key_id if key_id is None else key_id,
                                       self.secret if secret is None else secret, rid, ts,
                                       secrets.token_bytes(32), body)

    def invoke(self, body: bytes, **kw) -> bytes:
        rid, dgs = self.invoke_datagrams(body, **kw)
        self.send(dgs)
        return rid

    def control(self, rid: bytes, mt: MsgType, arg: int = 0) -> bytes:
        dg = wire.encode_control(mt, self.key_id, self.secret, rid, time.time_ns() // 1000,
                                 secrets.token_bytes(32), arg)
        self.send([dg])
        return dg

    def keep(self, rid: bytes) -> None:
        self.kept.add(rid)

    def let_go(self, rid: bytes) -> None:
        self.kept.discard(rid)

    # -- receiving -------------------------------------------------------------------------
    def of(self, rid: bytes) -> list:
        with self._cv:
            return list(self.frames.get(rid, ()))

    def wait(self, rid: bytes, cond, timeout: float = 120, what: str = "frames") -> list:
        """The request's frames once `cond(frames)` holds."""
        end = time.monotonic() + timeout
        with self._cv:
            while not cond(self.frames.get(rid, [])):
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what}: "
                                         f"{self.frames.get(rid, [])}")
                self._cv.wait(left)
            return list(self.frames[rid])

    def wait_end(self, rid: bytes, timeout: float = 120) -> list:
        return self.wait(rid, lambda fs: any(isinstance(f, (wire.ErrorFrame, wire.DoneFrame))
                                             for f in fs), timeout, "the last frame")

    def _read(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, OSError):
                continue
            try:
                f = wire.decode_response(data, self.secret)
            except Exception:  # noqa: BLE001 - not ours to judge here: the test sees no frame
                continue
            with self._cv:
                self.frames.setdefault(f.request_id, []).append(f)
                self._cv.notify_all()

    def _keepalives(self) -> None:
        while not self._stop:
            for rid in list(self.kept):
                self.control(rid, MsgType.RESEND, wire.NO_SEQ)
            time.sleep(KEEPALIVE_S)
