"""zerolayerd: the daemon. Two threads: I/O on one pinned CPU, the engine on the others.

    I/O thread (this one, the main thread):
        carriers (carriers/: AF_XDP rings, recvmmsg, shm rings) → Front (front.py): Ingress
        (verify, reassemble) → Admission (result cache, in-flight record, routing) → Admitted
        + body → admissions hand-off ─────────────────────────────────────────────────┐
        PING, ACK, RESEND, CANCEL, lease and drain answered here, at once             │
        engine events → Streams: TOKEN / DONE / ERROR frames → result cache → back    │
        through the carrier that owns the request's address                           │
                                                                                      ▼
    engine thread (engine_thread.py): tokenize → Engine.submit → Engine.step (the forward
        pass without the GIL) → typed events → events hand-off ─────► I/O thread

The hand-offs (handoff.py) are bounded single-producer/single-consumer queues, each with an
eventfd the other side sleeps on; no lock on the hot path. A full admissions queue is
OVERLOADED (counted), never a silent drop. The I/O thread never waits for a step: a step in
progress delays nothing it does. Frames are stored in the result cache before they are sent,
so RESEND and duplicate requests are served from there and never run the model again.

With [[engines]] there are several engine threads, each with its own pair of hand-offs: the
I/O thread routes each admitted request to one (routing.py: prefix affinity, then load),
waits on every events fd and drains them all. The result cache stays global, on this thread,
so a duplicate request id attaches to its run whichever engine runs it.

This module is the wiring and the loop: it moves datagrams, events and the time into Front
(front.py, sans-IO: what the daemon does with a datagram, an engine's event or the passing
of time) and the frames it returns out through the carriers; when the daemon starts, drains
and stops is lifecycle.py's table, which this loop and the control commands drive and read.
"""
from __future__ import annotations

import argparse
import logging
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from zerolayer.protocol.wire import ServerState

from . import config as config_mod
from . import engines as engines_mod
from . import startup
from .auth import KeyFileError, KeyStore, ReplayConfig, ReplayGuard
from .carriers import Carriers, Frames, open_carriers
from .engines import EngineSlot
from .event_size import event_bytes
from .front import Front
from .handoff import Handoff
from .in_flight import InFlight
from .ingress import Ingress
from .lifecycle import Event, Lifecycle, LifecycleError, Phase
from .lifecycle_events import Publisher
from .ops import collector_pauses, control_commands, logs, rollup
from .ops import control as control_mod
from .ops.control import ControlCall, ControlServer
from .ops.metrics import Metrics
from .ops.phase_report import PhaseReport
from .ops.sd_notify import Notifier, Watchdog
from .reassembly import Reassembler
from .request import EngineDied, EngineEvent
from .result_cache import ResultCache
from .version import package_version
from .xdp_tag_check import XdpTagCheck

if TYPE_CHECKING:
    from .carriers.xdp_io import XdpIO
    from .config import EngineSpec

HOUSEKEEPING_S = 0.25
# Receive batches drained before the engine's events are turned into frames: enough that a
# flood of garbage can't fill the socket buffer meanwhile, bounded so that it can't starve
# the streams either.
MAX_RX_BATCHES = 32
EVENTS_CAPACITY = 1 << 16  # engine → I/O events in flight (the engine waits when full)
EXIT_BAD_START = 2        # systemd's RestartPreventExitStatus: a start that cannot work


def log(msg: str, level: int = logging.INFO) -> None:
    logs.LOGGER.log(level, msg)


class Daemon:
    carriers: Carriers   # opened by start() before the model loads; there from then on

    def __init__(self, cfg: config_mod.DaemonConfig,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.clock = clock   # the loop's time, which it passes to Front and the lifecycle
        self.metrics = Metrics()
        self.lifecycle = Lifecycle(cfg.lifecycle.drain_timeout_s, cfg.lifecycle.drain_linger_s)
        self.out: Frames = []
        self._handoffs: list[Handoff] = []   # the loop's hand-offs in (rearmed before a sleep)
        self._reload = False
        self._term_before_ready = False
        self.started = clock()
        self.control: ControlServer | None = None
        self.events_pub: Publisher | None = None
        self.log = log
        self.sd = Notifier(log=log)
        self.status_line = rollup.StatusLine(self.sd)
        self.watchdog: Watchdog | None = None

    # ---- start-up ------------------------------------------------------------------------
    def start(self) -> None:
        c = self.cfg
        self.gc_pauses = collector_pauses.register(self.metrics.registry)
        io_cpus, engine_cpus = startup.cpu_plan(c, log)
        bad = engines_mod.cpu_problems(c)
        if bad:
            raise ValueError("; ".join(bad))
        self.keys = KeyStore(c.security.keys_file)  # refuses a group/world-readable or empty file
        self.metrics.key_reload_success.set_to_current_time()
        self.replay = ReplayGuard(ReplayConfig(skew_s=c.security.max_skew_s,
                                               capacity=c.security.nonce_capacity,
                                               per_key=c.security.nonce_per_key))
        self.cache = ResultCache(ttl_s=c.cache.ttl_s, max_entries=c.cache.max_entries,
                                 max_bytes=c.cache.max_bytes)
        self.metrics.pull_cache(self.cache)
        # one engine ([cpu]/[engine]), or one per [[engines]] table, each with its hand-offs
        specs: list[EngineSpec | None] = [*c.engines] or [None]
        multi = len(specs) > 1
        self.engines: list[EngineSlot] = [
            EngineSlot(i, spec, Handoff(c.engine.queue_depth,
                                        f"admissions-{i}" if multi else "admissions"),
                       Handoff(EVENTS_CAPACITY, f"events-{i}" if multi else "events",
                               sizer=event_bytes))
            for i, spec in enumerate(specs)]
        self.in_flight = InFlight(self.cache, len(self.engines))
        first = self.engines[0]
        self.ingress = Ingress(
            self.keys, self.replay, Reassembler(),
            require_xdp_tag=c.network.xdp_require_tag,
            xdp_tag_valid=XdpTagCheck(),   # compiled (numba's cache after the first)
            refuses_new=lambda: self.lifecycle.phase.refuses_new,
            # every engine has engine 0's context; before it loads, nothing is admitted
            context_len=lambda: first.model.max_seq_len if first.model is not None else 0,
            is_known=lambda key: self.cache.get(key) is not None,
            admitted_mac=lambda key: (r.signer.mac if (r := self.in_flight.get(key)) is not None
                                      and r.signer is not None else None))
        self.metrics.pull_ingress(self.ingress)
        # The UDP socket and the shm path fail a bad start now, not after the model loads;
        # datagrams that arrive meanwhile wait in the socket buffer.
        self.sock = startup.open_socket(c)
        self.carriers = open_carriers(self.sock, c.network, c.shm, log)
        # /healthz and /readyz answer from here on, through the cold start's kernel builds
        self.metrics.serve(c.metrics.host, c.metrics.port, ready=self._readiness)
        self.lifecycle.subscribe(PhaseReport(self.lifecycle, self.in_flight,
                                             self.metrics, self.sd, log))
        self.lifecycle.handle(Event.LOAD, self.clock())
        for slot in self.engines:  # loads the model: a bad one fails the start here
            startup.start_engine(c, slot, self.engines[0], multi,
                                 startup.engine_cpus(slot, engine_cpus), self.metrics,
                                 self.sd, log)
        xdp = self.open_xdp()
        if xdp is not None:
            self.carriers.attach_xdp(xdp)
        self._start_control()
        self.front = Front(c, self.ingress, self.in_flight, self.engines, self.metrics,
                           lambda: self.lifecycle.phase.wire, publisher=self.events_pub, log=log)
        startup.pin_io(c, self.engines, io_cpus, log)
        # what the load built is never garbage: out of the collector's reach, so that a full
        # collection does not stop every thread for tens of ms while serving
        frozen = self.gc_pauses.warm()
        host, port = self.sock.getsockname()[:2]
        path = "udp" if xdp is None else f"xdp on {c.network.interface} + udp fallback"
        # From here on the daemon's own handlers: a signal during the load is the default's
        # (the start is not yet a daemon). They go in before READY=1 and the "ready on" line,
        # which is what systemd and scripts act on; a TERM that lands before WARMED waits
        # for it, so a stop right after the start still drains and exits 0.
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, lambda *_: setattr(self, "_reload", True))
        log(f"ready on {host}:{port}, ingress {path} "
            f"(metrics {c.metrics.host}:{c.metrics.port or 'off'}; {frozen} objects frozen)")
        self.lifecycle.handle(Event.WARMED, self.clock())
        if self._term_before_ready:
            self._on_term()
        # the slowest live engine's beat: any one stuck in a kernel stops the pings
        self.watchdog = Watchdog(self.sd, lambda: min(
            (s.thread.beat for s in self.engines if not s.dead and s.thread), default=0.0))

    def _start_control(self) -> None:
        c = self.cfg.control
        self.ctl_calls: Handoff[ControlCall] = Handoff(64, "control")
        path = control_mod.resolve_path(c.socket)
        if path or c.tcp:
            self.control = ControlServer(
                path, self.ctl_calls, log=log,
                prepare=lambda cmd, args: control_commands.prepare(self, cmd, args),
                tcp=c.tcp, curve_dir=c.curve_dir)
            self.control.start()
            if path:
                log(f"control socket ipc://{path} (mode 0600)")
            if c.tcp:
                log(f"control socket {c.tcp} (CURVE, keys in {c.curve_dir})")
        if c.events:
            self.events_pub = Publisher(f"ipc://{c.events}", hwm=c.events_hwm)
            log(f"lifecycle events on ipc://{c.events} (mode 0600)")

    def open_xdp(self, ingress: str | None = None) -> XdpIO | None:
        return startup.open_xdp(self.cfg, self.sock.getsockname()[1], self.metrics, log,
                                ingress, self.keys, self.in_flight)

    # ---- the lifecycle's consequences ----------------------------------------------------
    def _on_term(self, *_: object) -> None:
        if self.lifecycle.phase is Phase.WARMING:
            self._term_before_ready = True   # handled once WARMED (see start)
            return
        try:  # a second signal while lingering stops at once; while streaming, nothing
            self.lifecycle.handle(Event.TERM, self.clock())
        except LifecycleError:
            pass  # already stopped: the shutdown is under way

    def _readiness(self) -> tuple[bool, str]:
        """/readyz: 200 in READY ("degraded: ..." while some engine is dead and others
        serve), 503 with the state otherwise."""
        state = self.lifecycle.phase.wire
        if state is not ServerState.READY:
            return False, state.name.lower()
        dead = [s.index for s in self.engines if s.dead]
        if dead:
            return True, (f"degraded: engine(s) {', '.join(map(str, dead))} of "
                          f"{len(self.engines)} dead")
        return True, "ready"

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> int:
        carriers = self.carriers
        next_house = 0.0
        wait_fds = self._wait_fds()
        busy = self.cfg.network.busy_poll
        turn = 0
        while True:
            turn += 1
            for _ in range(MAX_RX_BATCHES):
                batch, more = carriers.recv(turn, busy)
                if batch:
                    now = self.clock()   # one clock read a batch: received together
                    receive = self.front.receive
                    for data, addr in batch:
                        self.out += receive(data, addr, now)
                if not more:
                    break
            # Looked at every turn; an empty hand-off costs no system call. Its eventfd may
            # be left readable by a write that came after its items were taken: the sleep
            # below clears each fd it found readable, or select() would return at once,
            # turn after turn (a spinning I/O thread, competing with the kernels).
            for slot in self.engines:
                evs = slot.events.drain()
                if evs:
                    now = self.clock()
                    for ev in evs:
                        self._on_event(ev, slot, now)
            for call in self.ctl_calls.drain():  # every turn, as the events (its eventfd)
                control_commands.run(self, call)
            if carriers.changed:  # the operator attached or detached XDP: before any select
                carriers.changed = False
                wait_fds = self._wait_fds()
            if self.out or carriers.backlog:
                self._flush()
            now = self.clock()
            if now >= next_house:
                self._housekeeping(now)
                next_house = now + HOUSEKEEPING_S
            if self.lifecycle.tick(now, len(self.in_flight)) is Phase.STOPPED:
                break
            if not busy:
                # A hand-off's fd is cleared when select() finds it readable, not before every
                # sleep: two eventfd reads (each an EAGAIN exception) per sleep were paid again
                # for every lone PING. No wake-up is lost: an item is queued
                # before its fd is written, and every clear is followed by a look at the queue
                # (drain pops what is there; a clear after select() goes round the loop).
                pending = any([len(h) for h in self._handoffs])
                if not pending and carriers.may_spin and engines_mod.idle(self.engines):
                    # the spin's select(0) must not find a stale hand-off fd: cleared first
                    pending = any([h.rearm() for h in self._handoffs])
                    if not pending and carriers.spin(wait_fds):
                        continue   # a same-host client wrote while we looked: no sleep
                pending = carriers.before_sleep() or pending
                ready = select.select(wait_fds, [], [],
                                      0.0 if pending else max(0.0, next_house - now))[0]
                if len(ready) > 1 or (ready and type(ready[0]) is Handoff):
                    for h in self._handoffs:
                        if h in ready:
                            h.rearm()
        self._shutdown()
        return self.lifecycle.exit_code

    def _wait_fds(self) -> list:
        self._handoffs = [*(s.events for s in self.engines), self.ctl_calls]
        return [*self._handoffs, *self.carriers.fds()]

    def _flush(self) -> None:
        self.carriers.flush()  # frames a busy kernel left on a TX ring last time
        if self.out:
            out, self.out = self.out, []
            self.carriers.send(out)

    def _on_event(self, ev: EngineEvent, slot: EngineSlot, now: float) -> None:
        if isinstance(ev, EngineDied):
            self._engine_died(ev.message, slot, now)
        else:
            self.out += self.front.on_event(ev, now)

    def _engine_died(self, msg: str, slot: EngineSlot, now: float) -> None:
        """An engine is gone: its requests in flight end with INTERNAL (never silence). With
        other engines alive the daemon serves on with them (degraded: /readyz says so, the
        dead engine is never routed to again); when none is left (with one engine: at
        once) every request fails and the daemon exits non-zero so that systemd restarts
        it; it never runs with no engine."""
        if slot.dead:
            return
        slot.dead = msg
        self.metrics.engine_up.labels(str(slot.index)).set(0)
        alive = [s for s in self.engines if not s.dead]
        if alive:
            mine = self.in_flight.of_engine(slot.index)
            log(f"engine {slot.index} failed ({msg}); failing its {len(mine)} request(s); "
                f"{len(alive)} of {len(self.engines)} engines serve on (degraded)",
                logging.CRITICAL)
            self.out += self.front.engine_failed(slot.index, msg)
            return
        log(f"engine failed ({msg}); failing {len(self.in_flight)} request(s) and exiting",
            logging.CRITICAL)
        self.out += self.front.engine_failed(None, msg)
        self.lifecycle.handle(Event.ENGINES_DIED, now)

    def _housekeeping(self, now: float) -> None:
        if self._reload:
            self._reload = False
            self.reload_keys()
        self.out += self.front.tick(now)
        if self.carriers.xdp is not None and self.carriers.xdp.auth is not None:
            self.carriers.xdp.auth.refresh_clock(now)   # at most once a second
        for slot in self.engines:
            if (not slot.dead and slot.thread is not None and not slot.thread.is_alive()
                    and self.lifecycle.phase is not Phase.STOPPED):
                for ev in slot.events.drain():  # its last words (EngineDied) first
                    self._on_event(ev, slot, now)
                if not slot.dead and self.lifecycle.phase is not Phase.STOPPED:
                    self._on_event(EngineDied("the engine thread is gone"), slot, now)
        totals = rollup.engines(self.metrics, self.engines)
        if self.watchdog is not None:
            self.watchdog.tick()
        self.status_line.tick(now, self.lifecycle.phase.wire.name.lower(), totals,
                              len(self.engines), self.front.tokens_out)
        rollup.buffers(self.metrics, self.cfg, self.ingress, self.replay, self.in_flight,
                       self.engines, self.carriers, self.events_pub)
        self._flush()

    def reload_keys(self) -> bool:
        """SIGHUP or `zerolayer ctl reload-keys`: a refused file keeps the old keys."""
        self.sd.reloading()
        # The XDP program's copy follows in two steps around the swap (bpf/kernel_keys.py).
        xdp = self.carriers.xdp
        ok = self.keys.reload(xdp.auth if xdp is not None else None)
        self.sd.notify("READY=1", f"STATUS={self.lifecycle.phase.wire.name.lower()}: keys "
                                  f"{'reloaded' if ok else 'reload failed, old keys kept'}")
        self.metrics.key_reloads.labels("ok" if ok else "failed").inc()
        if ok:
            self.metrics.key_reload_success.set_to_current_time()
        log(f"keys reloaded ({len(self.keys)} keys)" if ok
            else f"keys reload failed, old keys kept: {self.keys.last_error}",
            logging.INFO if ok else logging.ERROR)
        return ok

    def _shutdown(self) -> None:
        self.out += self.front.drain(self.clock())  # tell, never vanish
        self._flush()
        for slot in self.engines:
            if slot.thread is not None:
                slot.thread.stop()
        for slot in self.engines:
            if slot.thread is not None:
                slot.thread.join(timeout=30)
        self.carriers.close()  # AF_XDP detached first: the kernel's UDP path takes over
        if self.control is not None:
            self.control.stop()
        if self.events_pub is not None:
            self.events_pub.close()
        code = self.lifecycle.exit_code
        log("stopped" if not code else f"stopped (exit {code})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="zerolayerd", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"zerolayerd {package_version()}")
    ap.add_argument("--check", action="store_true",
                    help="dry run: check the configuration, keys file, model (one forward "
                         "pass) and XDP program (verifier, not attached), print a summary, "
                         "exit 0 or 2 with every problem listed")
    config_mod.add_flags(ap, config_mod.setting_comments())
    args = ap.parse_args(argv)
    logs.setup()
    if args.check:
        from .ops import check
        return check.run(args)
    try:
        cfg = config_mod.load(args)
    except config_mod.ConfigError as e:
        for p in e.problems:
            log(f"bad configuration: {p}", logging.ERROR)
        return 2
    d: Daemon | None = None
    try:
        d = Daemon(cfg)
        d.start()
    except Exception as e:  # noqa: BLE001 - a model error etc.: say it plainly
        plain = isinstance(e, (KeyFileError, ValueError, OSError))
        log(f"cannot start: {e if plain else f'{type(e).__name__}: {e}'}", logging.ERROR)
        carriers: Carriers | None = getattr(d, "carriers", None)   # None: failed before
        startup.failed_start(carriers.shm if carriers is not None else None, EXIT_BAD_START)
    return d.run()


if __name__ == "__main__":
    sys.exit(main())
