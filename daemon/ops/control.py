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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

import zmq

from ..handoff import Handoff
from ..json_value import JSONObject

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

    from ..carriers.xdp_io import XdpIO

# The slow part of a command, run on the control thread before the hand-off: (cmd, args) ->
# what the I/O thread adopts (xdp-attach: the XDP program and sockets it opened), or None.
Prepare: TypeAlias = Callable[[str, JSONObject], "XdpIO | None"]

VERSION = 1
CALL_TIMEOUT_S = 5.0
POLL_MS = 200
ERROR_CODES = ("BAD_REQUEST", "UNKNOWN_COMMAND", "BAD_ARGUMENT", "UNAVAILABLE", "BUSY",
               "TIMEOUT", "INTERNAL")
COMMANDS = ("status", "drain", "undrain", "reload-keys", "config", "cache-stats",
            "cache-flush", "kv-stats", "xdp-status", "xdp-attach", "xdp-detach", "rate-limit",
            "untagged-rate", "log-level")


class ControlError(Exception):
    def __init__(self, code: str, message: str):
        assert code in ERROR_CODES
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class ControlCall:
    cmd: str
    args: JSONObject
    prepared: XdpIO | None = None       # what Prepare opened for it, if anything
    done: threading.Event = field(default_factory=threading.Event)
    reply: JSONObject | None = None

    def answer(self, result: JSONObject) -> None:
        self.reply = {"v": VERSION, "ok": True, "result": result}
        self.done.set()

    def fail(self, code: str, message: str) -> None:
        self.reply = _error(code, message)
        self.done.set()


def _error(code: str, message: str) -> JSONObject:
    return {"v": VERSION, "ok": False, "error": {"code": code, "message": message}}


def resolve_path(setting: str, environ: Mapping[str, str] | None = None) -> str:
    """[control] socket: "" = off; "auto" = $RUNTIME_DIRECTORY/control.sock under systemd
    (RuntimeDirectory=), else off; anything else is the path."""
    environ = os.environ if environ is None else environ
    if setting != "auto":
        return setting
    rd = environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return os.path.join(rd, "control.sock") if rd else ""


class ControlServer(threading.Thread):
    def __init__(self, path: str, calls: Handoff[ControlCall],
                 log: Callable[[str], None] = print, prepare: Prepare | None = None,
                 tcp: str = "", curve_dir: str = ""):
        super().__init__(name="zerolayer-control", daemon=True)
        self.path = path
        self.calls = calls
        # the slow part of a command (compiling and attaching XDP), done here on the control
        # thread so that the I/O thread only adopts the result
        self.prepare = prepare
        self.log = log
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.socks: list[zmq.Socket] = []
        self.auth: ThreadAuthenticator | None = None
        if path:
            s = self._router()
            if os.path.exists(path):      # a stale socket of an earlier run
                os.unlink(path)
            old = os.umask(0o177)         # created 0600: no window where others could connect
            try:
                s.bind(f"ipc://{path}")
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
        if tcp:
            self._bind_curve(tcp, curve_dir)
        self._halt = threading.Event()
        self.served = 0

    def _router(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.LINGER, 0)
        self.socks.append(s)
        return s

    def _bind_curve(self, endpoint: str, curve_dir: str) -> None:
        """Remote operators: TCP with CURVE (encrypted, and only the public keys in
        CURVE_DIR/clients may connect; ZeroMQ's ZAP handler refuses the rest). Never TCP
        without it: the control socket can drain the daemon."""
        from zmq.auth import load_certificate
        from zmq.auth.thread import ThreadAuthenticator
        secret = os.path.join(curve_dir, "server.key_secret")
        clients = os.path.join(curve_dir, "clients")
        if not curve_dir or not os.path.isfile(secret) or not os.path.isdir(clients):
            raise ValueError(f"[control] tcp needs [control] curve_dir with server.key_secret "
                             f"and clients/ (zerolayer ctl-keys makes them), not {curve_dir!r}")
        public, private = load_certificate(secret)
        self.auth = ThreadAuthenticator(self.ctx)
        self.auth.start()
        self.auth.configure_curve(domain="*", location=clients)
        s = self._router()
        s.curve_secretkey, s.curve_publickey, s.curve_server = private, public, True
        s.bind(endpoint)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)

    def run(self) -> None:
        poller = zmq.Poller()
        for s in self.socks:
            poller.register(s, zmq.POLLIN)
        try:
            while not self._halt.is_set():
                for s, _ in poller.poll(POLL_MS):
                    frames = s.recv_multipart()
                    envelope, payload = frames[:-1], frames[-1]
                    reply = self._serve(payload)
                    s.send_multipart([*envelope, json.dumps(reply).encode()])
                    self.served += 1
        finally:
            for s in self.socks:
                s.close(0)
            if self.auth is not None:
                self.auth.stop()
            if self.path:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass

    def _serve(self, payload: bytes) -> JSONObject:
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
        prepared = None
        if self.prepare is not None:
            try:
                prepared = self.prepare(cmd, args)
            except ControlError as e:
                return _error(e.code, e.message)
            except Exception as e:  # noqa: BLE001 - an operator's command must not end us
                return _error("INTERNAL", f"{type(e).__name__}: {e}")
        call = ControlCall(cmd, args, prepared)
        if not self.calls.put(call):
            return _error("BUSY", "the daemon has control calls queued; retry")
        if not call.done.wait(CALL_TIMEOUT_S):
            return _error("TIMEOUT", f"no answer from the I/O thread in {CALL_TIMEOUT_S:g} s")
        assert call.reply is not None
        return call.reply


def request(path: str, cmd: str, args: JSONObject | None = None,
            timeout_s: float = 10.0, curve: tuple[str, str] | None = None) -> JSONObject:
    """One call (the client side, for `zerolayer ctl`). `path` is the ipc socket's path, or
    a tcp:// endpoint with `curve` = (the client's key_secret file, the server's public key
    file). Returns the reply object; raises TimeoutError when nothing answers (a client
    whose key the server does not know gets no answer at all), FileNotFoundError when an ipc
    socket is not there."""
    tcp = path.startswith("tcp://")
    if not tcp and not os.path.exists(path):
        raise FileNotFoundError(path)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        if tcp:
            from zmq.auth import load_certificate
            if curve is None:
                raise ValueError("a tcp:// control endpoint needs CURVE keys")
            s.curve_publickey, s.curve_secretkey = load_certificate(curve[0])
            s.curve_serverkey = load_certificate(curve[1])[0]
        s.connect(path if tcp else f"ipc://{path}")
        s.send_multipart([b"", json.dumps({"v": VERSION, "cmd": cmd,
                                           "args": args or {}}).encode()])
        if not s.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no answer on {path} in {timeout_s:g} s")
        return json.loads(s.recv_multipart()[-1])
    finally:
        s.close(0)
