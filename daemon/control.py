"""The operator's control socket (pyzmq): `zerolayer ctl status|drain|undrain|...`.

A ZeroMQ ROUTER socket on `ipc://PATH`, mode 0600, so only root and the daemon's user reach
it: the socket file's permissions are the access control (no key, as for `systemctl`). Under
systemd PATH is $RUNTIME_DIRECTORY/control.sock (the unit's RuntimeDirectory=zerolayer,
itself 0750), see [control] socket.

Threads: this module's thread owns the ZeroMQ socket and never touches the data plane. Each
request becomes a ControlCall handed to the I/O thread (a bounded Handoff, woken through its
eventfd like the engine's events), which runs it between datagram batches (every command is
O(1) or a copy of counters) and sets its reply; this thread waits for it, at most
CALL_TIMEOUT_S. A full hand-off gets BUSY: the data plane is never made to wait for an
operator.

Wire format, version 1: one ZeroMQ message frame of JSON each way.
    request  {"v": 1, "cmd": "status", "args": {}}
    reply    {"v": 1, "ok": true, "result": {...}}
             {"v": 1, "ok": false, "error": {"code": "UNKNOWN_COMMAND", "message": "..."}}
Error codes (closed): BAD_REQUEST, UNKNOWN_COMMAND, BAD_ARGUMENT, UNAVAILABLE, BUSY, TIMEOUT,
INTERNAL. docs/OPERATIONS.md "Control socket" lists the commands.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import zmq

from .handoff import Handoff

VERSION = 1
CALL_TIMEOUT_S = 5.0
POLL_MS = 200
ERROR_CODES = ("BAD_REQUEST", "UNKNOWN_COMMAND", "BAD_ARGUMENT", "UNAVAILABLE", "BUSY",
               "TIMEOUT", "INTERNAL")
COMMANDS = ("status", "drain", "undrain", "reload-keys", "config", "cache-stats",
            "cache-flush", "kv-stats", "xdp-status", "xdp-attach", "xdp-detach", "rate-limit",
            "log-level")


class ControlError(Exception):
    def __init__(self, code: str, message: str):
        assert code in ERROR_CODES
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class ControlCall:
    cmd: str
    args: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None

    def answer(self, result: dict[str, Any]) -> None:
        self.reply = {"v": VERSION, "ok": True, "result": result}
        self.done.set()

    def fail(self, code: str, message: str) -> None:
        self.reply = _error(code, message)
        self.done.set()


def _error(code: str, message: str) -> dict[str, Any]:
    return {"v": VERSION, "ok": False, "error": {"code": code, "message": message}}


def resolve_path(setting: str, environ: dict[str, str] | None = None) -> str:
    """[control] socket: "" = off; "auto" = $RUNTIME_DIRECTORY/control.sock under systemd
    (RuntimeDirectory=), else off; anything else is the path."""
    environ = os.environ if environ is None else environ
    if setting != "auto":
        return setting
    rd = environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return os.path.join(rd, "control.sock") if rd else ""


class ControlServer(threading.Thread):
    def __init__(self, path: str, calls: Handoff[ControlCall], log=print, prepare=None):
        super().__init__(name="zerolayer-control", daemon=True)
        self.path = path
        self.calls = calls
        # (cmd, args) -> args: the slow part of a command (compiling and attaching XDP),
        # done here on the control thread so that the I/O thread only adopts the result
        self.prepare = prepare
        self.log = log
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if os.path.exists(path):      # a stale socket of an earlier run
            os.unlink(path)
        old = os.umask(0o177)         # created 0600: no window where others could connect
        try:
            self.sock.bind(f"ipc://{path}")
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._halt = threading.Event()
        self.served = 0

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        try:
            while not self._halt.is_set():
                if not dict(poller.poll(POLL_MS)):
                    continue
                frames = self.sock.recv_multipart()
                envelope, payload = frames[:-1], frames[-1]
                reply = self._serve(payload)
                self.sock.send_multipart([*envelope, json.dumps(reply).encode()])
                self.served += 1
        finally:
            self.sock.close(0)
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def _serve(self, payload: bytes) -> dict[str, Any]:
        try:
            req = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return _error("BAD_REQUEST", "not JSON")
        if not isinstance(req, dict) or req.get("v") != VERSION:
            return _error("BAD_REQUEST", f"expected an object with \"v\": {VERSION}")
        cmd, args = req.get("cmd"), req.get("args", {})
        if not isinstance(cmd, str) or not isinstance(args, dict):
            return _error("BAD_REQUEST", "\"cmd\" must be a string and \"args\" an object")
        if cmd not in COMMANDS:
            return _error("UNKNOWN_COMMAND", f"{cmd!r}; commands: {', '.join(COMMANDS)}")
        if self.prepare is not None:
            try:
                args = self.prepare(cmd, args)
            except ControlError as e:
                return _error(e.code, e.message)
            except Exception as e:  # noqa: BLE001 - an operator's command must not end us
                return _error("INTERNAL", f"{type(e).__name__}: {e}")
        call = ControlCall(cmd, args)
        if not self.calls.put(call):
            return _error("BUSY", "the daemon has control calls queued; retry")
        if not call.done.wait(CALL_TIMEOUT_S):
            return _error("TIMEOUT", f"no answer from the I/O thread in {CALL_TIMEOUT_S:g} s")
        assert call.reply is not None
        return call.reply


def request(path: str, cmd: str, args: dict[str, Any] | None = None,
            timeout_s: float = 10.0) -> dict[str, Any]:
    """One call (the client side, for `zerolayer ctl`). Returns the reply object; raises
    TimeoutError when nothing answers, FileNotFoundError when the socket is not there."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(f"ipc://{path}")
        s.send_multipart([b"", json.dumps({"v": VERSION, "cmd": cmd,
                                           "args": args or {}}).encode()])
        if not s.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no answer on {path} in {timeout_s:g} s")
        return json.loads(s.recv_multipart()[-1])
    finally:
        s.close(0)
