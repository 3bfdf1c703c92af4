"""What each control command does, run on the I/O thread (daemon/ops/control.py hands them over).

Every command is O(1) or a copy of counters, so running one between datagram batches costs
the data plane microseconds. A command returns a JSON-able dict or raises ControlError.

The commands see the daemon through `Operated`, the few parts an operator may read or move,
and change its state only through those parts' own methods: a drain is a lifecycle event,
an attach or detach a change to the carrier set.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from zerolayer.gpu import __version__

from .. import config as config_mod
from .. import startup
from ..auth import KeyStore
from ..carriers import Carriers
from ..config import DaemonConfig
from ..engines import EngineSlot
from ..in_flight import InFlight
from ..json_value import JSONObject, JSONValue
from ..lifecycle import Event, Lifecycle, LifecycleError
from ..result_cache import ResultCache
from . import logs
from .control import ControlCall, ControlError
from .metrics import Metrics

if TYPE_CHECKING:
    from ..carriers.xdp_io import XdpIO


class Operated(Protocol):
    """What the control commands read and move (the Daemon has these)."""
    cfg: DaemonConfig
    engines: list[EngineSlot]
    lifecycle: Lifecycle
    in_flight: InFlight
    cache: ResultCache
    carriers: Carriers
    keys: KeyStore
    metrics: Metrics
    started: float

    def log(self, msg: str, level: int = logging.INFO) -> None: ...

    def reload_keys(self) -> bool: ...

    def open_xdp(self, ingress: str | None = None) -> XdpIO | None: ...



def run(d: Operated, call: ControlCall) -> None:
    try:
        call.answer(COMMANDS[call.cmd](d, call))
    except ControlError as e:
        call.fail(e.code, e.message)
    except Exception as e:  # noqa: BLE001 - an operator's command must not end the daemon
        call.fail("INTERNAL", f"{type(e).__name__}: {e}")


@dataclass(frozen=True)
class _EngineState:
    """One engine's line of `status`."""
    slot: EngineSlot
    running: int
    waiting: int
    kv_usage: float
    in_flight: int

    def as_json(self) -> JSONObject:
        s = self.slot
        return {"engine": s.index, "state": "dead" if s.dead else "serving",
                "cpus": sorted(s.cpus) if s.cpus else None, "threads": s.threads,
                "device": None if s.spec is None or s.spec.device < 0 else s.spec.device,
                "running": self.running, "waiting": self.waiting,
                "in_flight": self.in_flight, "kv_usage": self.kv_usage,
                **({"error": s.dead} if s.dead else {})}


def _engines(d: Operated) -> list[_EngineState]:
    """Each engine's state, in the configuration's order ([[engines]]; one engine: one)."""
    out = []
    for s in d.engines:
        # an engine thread publishes (0, 0, 0) until it runs; a dead one holds nothing
        running, waiting, kv_held = (0, 0, 0) if s.dead or s.thread is None else s.thread.stats
        _, blocks = s.held_blocks()
        out.append(_EngineState(s, running, waiting + len(s.admissions),
                                round(kv_held / blocks, 4) if blocks and not s.dead else 0.0,
                                d.in_flight.on_engine(s.index)))
    return out


def status(d: Operated, call: ControlCall) -> JSONObject:
    engines = _engines(d)
    running = sum(e.running for e in engines)
    waiting = sum(e.waiting for e in engines)
    dead = [e.slot.index for e in engines if e.slot.dead]
    return {
        "engines": [e.as_json() for e in engines],
        "degraded": bool(dead),
        "state": _state(d), "version": __version__, "pid": os.getpid(),
        "uptime_s": round(time.monotonic() - d.started, 3),
        "drain": d.lifecycle.phase.drain,
        "ingress": "udp" if d.carriers.xdp is None else "xdp",
        "requests": {"in_flight": len(d.in_flight), "running": running, "waiting": waiting},
        "keys": len(d.keys),
    }


def drain(d: Operated, call: ControlCall) -> JSONObject:
    """Refuse new work with DRAINING; keep serving what is in flight and every control
    message; stay up. `undrain` ends it."""
    _move(d, Event.DRAIN)
    return {"state": _state(d), "in_flight": len(d.in_flight)}


def undrain(d: Operated, call: ControlCall) -> JSONObject:
    _move(d, Event.UNDRAIN)
    return {"state": _state(d)}


def _move(d: Operated, event: Event) -> None:
    try:
        d.lifecycle.handle(event, time.monotonic())
    except LifecycleError:
        why = ("the daemon is stopping (SIGTERM); it cannot undrain"
               if d.lifecycle.phase.drain == "stopping" else
               f"the daemon is {d.lifecycle.phase.value}")
        raise ControlError("UNAVAILABLE", why) from None


def _state(d: Operated) -> str:
    return d.lifecycle.phase.wire.name.lower()


def reload_keys(d: Operated, call: ControlCall) -> JSONObject:
    ok = d.reload_keys()
    if not ok:
        raise ControlError("BAD_ARGUMENT", f"keys file refused, old keys kept: "
                                           f"{d.keys.last_error}")
    return {"keys": len(d.keys)}


def config(d: Operated, call: ControlCall) -> JSONObject:
    """The effective configuration (defaults < file < environment < flags). Nothing in it is
    secret: the keys file is a path, its contents are never read out."""
    return config_mod.as_dict(d.cfg)


def cache_stats(d: Operated, call: ControlCall) -> JSONObject:
    c = d.cache
    return {"entries": len(c), "running": c.running, "bytes": c.nbytes,
            "max_entries": c.max_entries, "max_bytes": c.max_bytes, "ttl_s": c.ttl_s,
            **c.stats}


def cache_flush(d: Operated, call: ControlCall) -> JSONObject:
    """Forget every finished result (a duplicate of one then runs the model again); running
    requests keep their entries, or they could not be resumed or cancelled."""
    return {"flushed": d.cache.flush_finished(), "entries": len(d.cache)}


def kv_stats(d: Operated, call: ControlCall) -> JSONObject:
    """Summed over the engines; each engine's own under "engines" (its own arena and
    prefix cache)."""
    per: list[dict[str, int]] = []
    arenas = []
    for s in d.engines:
        if s.model is None or s.thread is None or s.thread.engine is None:
            continue  # not loaded: no arena, no prefix cache (the daemon answers once all are)
        a = s.model.arena
        arenas.append(a)
        per.append({"engine": s.index, "blocks": a.n_blocks, "free_blocks": a.free_blocks,
                    "prefix_cache_blocks": s.thread.engine.prefix.blocks})
    if not arenas:
        raise ControlError("UNAVAILABLE", "no engine has loaded its model yet")
    a = arenas[0]
    return {"blocks": sum(e["blocks"] for e in per),
            "free_blocks": sum(e["free_blocks"] for e in per),
            "prefix_cache_blocks": sum(e["prefix_cache_blocks"] for e in per),
            "bytes_per_block": a.bytes_per_block, "max_seq_len": a.max_seq_len,
            "engines": per}


def xdp_status(d: Operated, call: ControlCall) -> JSONObject:
    if d.carriers.xdp is None:
        return {"attached": False, "ingress": d.cfg.network.ingress}
    return d.carriers.xdp.status()


def prepare(d: Operated, cmd: str, args: JSONObject) -> XdpIO | None:
    """Run on the control thread before a command is handed to the I/O thread: the part
    that takes long. xdp-attach compiles, loads and attaches the XDP program and opens the
    AF_XDP sockets here (a second or so: BCC runs in a helper process), so the data plane
    never waits for it; the I/O thread then only adopts them."""
    if cmd != "xdp-attach":
        return None
    if d.carriers.xdp is not None:
        raise ControlError("UNAVAILABLE",
                           f"already attached to {d.carriers.xdp.ifname}")
    try:
        io = d.open_xdp("xdp")
    except (OSError, ValueError) as e:
        raise ControlError("UNAVAILABLE", str(e)) from None
    return io


def xdp_attach(d: Operated, call: ControlCall) -> JSONObject:
    """Adopt the XDP program and AF_XDP sockets that prepare() opened, as at start with
    ingress = "xdp". The UDP socket kept serving meanwhile."""
    io = call.prepared
    if io is None:
        raise ControlError("BAD_REQUEST", "xdp-attach was not prepared")
    if d.carriers.xdp is not None:  # attached meanwhile by another call: keep that one
        io.close()
        raise ControlError("UNAVAILABLE",
                           f"already attached to {d.carriers.xdp.ifname}")
    d.carriers.attach_xdp(io)
    startup.publish_xdp_keys(io, d.keys, d.cfg, d.in_flight)   # a reload may have come since
    d.metrics.carriers.new_xdp_program()
    return xdp_status(d, call)


def xdp_detach(d: Operated, call: ControlCall) -> JSONObject:
    """Detach the program and close the AF_XDP sockets: invoke traffic goes to the kernel's
    UDP path, which the daemon serves too; replies to clients that came over XDP go back
    through the UDP socket."""
    x = d.carriers.detach_xdp()
    if x is None:
        raise ControlError("UNAVAILABLE", "the XDP fast path is not attached")
    x.close()
    d.metrics.carriers.xdp_attached.set(0)
    d.log(f"XDP detached from {x.ifname} by the operator; serving over UDP",
          logging.WARNING)
    return {"attached": False}


def rate_limit(d: Operated, call: ControlCall) -> JSONObject:
    """The XDP program's per-source token bucket, in the kernel: with args rate_pps (0 =
    off) and optionally burst, set it first (at once, no restart; sources keep their
    state). UNAVAILABLE without the XDP fast path."""
    return _xdp_budget(d, call, untagged=False)


def untagged_rate(d: Operated, call: ControlCall) -> JSONObject:
    """The XDP program's budget of requests without the XDP tag (per receiving CPU, all
    sources together; [network] xdp_untagged_pps / xdp_untagged_burst at start): read or
    set as rate-limit."""
    return _xdp_budget(d, call, untagged=True)


def _xdp_budget(d: Operated, call: ControlCall, untagged: bool) -> JSONObject:
    if d.carriers.xdp is None:
        raise ControlError("UNAVAILABLE", "the XDP fast path is not attached (ingress udp)")
    xdp = d.carriers.xdp
    args = call.args
    if "rate_pps" in args or "burst" in args:
        try:
            rate = _int_arg(args.get("rate_pps", xdp.rate(untagged)[0]))
            burst = _int_arg(args.get("burst", 0))
            xdp.set_rate(rate, burst, untagged)
        except ValueError as e:
            raise ControlError("BAD_ARGUMENT", f"rate_pps and burst: integers >= 0 ({e})") \
                from None
        what = "budget of untagged requests" if untagged else "rate limit"
        d.log(f"XDP {what} set to {rate}/s, burst {burst} (by the operator)", logging.WARNING)
    rate, burst = xdp.rate(untagged)
    return {"rate_pps": rate, "burst": burst}


def _int_arg(v: JSONValue) -> int:
    """int() of a JSON argument; TypeError for an array, object or null (as int() says)."""
    if isinstance(v, (str, int, float)):
        return int(v)
    raise TypeError(f"int() argument must be a string or a number, not '{type(v).__name__}'")


def log_level(d: Operated, call: ControlCall) -> JSONObject:
    """The log level now; with args {"level": "debug|info|warning|error"} set it first."""
    args = call.args
    if "level" in args:
        try:
            logs.set_level(str(args["level"]))
        except ValueError as e:
            raise ControlError("BAD_ARGUMENT", str(e)) from None
        d.log(f"log level {logs.level()} (set by the operator)", logging.WARNING)
    return {"level": logs.level()}


COMMANDS: dict[str, Callable[[Operated, ControlCall], JSONObject]] = {
    "status": status, "drain": drain, "undrain": undrain, "reload-keys": reload_keys,
    "config": config, "cache-stats": cache_stats, "cache-flush": cache_flush,
    "kv-stats": kv_stats, "xdp-status": xdp_status, "xdp-attach": xdp_attach,
    "xdp-detach": xdp_detach, "rate-limit": rate_limit, "untagged-rate": untagged_rate,
    "log-level": log_level,
}
