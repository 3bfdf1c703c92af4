"""zerolayerd: the daemon. Two threads: I/O on one pinned CPU, the engine on the others.

    I/O thread (this one, the main thread):
        AF_XDP RX ring (xdp_io) and recvmmsg (udp_io) → Ingress (verify, reassemble)
        → result cache (idempotency) → one Request → admissions hand-off ───────────┐
        PING, ACK, RESEND, CANCEL, lease and drain answered here, at once            │
        engine events → TOKEN / DONE / ERROR frames → result cache → back the way    │
        the request came: UMEM TX frames for an AF_XDP peer, sendmmsg for UDP        │
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
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import select
import signal
import socket
import sys
import time
from typing import NoReturn

from . import config as config_mod
from . import control as control_mod
from . import control_commands, fault_hooks, logs, memory_bounds, test_hooks
from . import shm_ingress  # [shm]: the same-host shared-memory carrier
from .control import ControlCall, ControlServer
from .auth import KeyFileError, KeyStore, ReplayConfig, ReplayGuard
from .engine import Engine
from .engine_thread import EngineThread
from . import engines as engines_mod
from .engines import EngineSlot, load_sibling
from .routing import Router, boundary_hashes
from zerolayer.client.errors import ERROR_INFO, ErrorCode, OverloadedError
from .handoff import Handoff
from .ingress import ControlRequest, Ingress, InvokeRequest, Rejected
from .lifecycle_events import Publisher
from .metrics import Metrics
from .sd_notify import Notifier, Watchdog
from .version import package_version
from .reassembly import Reassembler
from .request import (AcceptedEvent, CancelReason, DoneEvent, EngineDied, EngineEvent,
                      FailedEvent, Request, TextEvent)
from .result_cache import EntryStatus, ResultCache
from .udp_io import BatchedUDP
from .xdp_frames import Peer
from zerolayer.client.wire import (MAX_TEXT, NO_SEQ, FinishReason, MsgType, RunState, ServerState, Timings,
                   Usage, split_utf8)

HOUSEKEEPING_S = 0.25
STATUS_S = 5.0            # STATUS= lines to systemd, at most this often
# Receive batches drained before the engine's events are turned into frames: enough that a
# flood of garbage can't fill the socket buffer meanwhile, bounded so that it can't starve
# the streams either.
MAX_RX_BATCHES = 32
RESEND_LIMIT = 64  # frames per RESEND answer (docs/PROTOCOL.md)
EVENTS_CAPACITY = 1 << 16  # engine → I/O events in flight (the engine waits when full)
EXIT_ENGINE_DIED = 1
EXIT_BAD_START = 2        # systemd's RestartPreventExitStatus: a start that cannot work


def log(msg: str, level: int = logging.INFO) -> None:
    logs.LOGGER.log(level, msg)


class Daemon:
    def __init__(self, cfg: config_mod.DaemonConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.state = ServerState.WARMING
        self.out: list[tuple[bytes, tuple]] = []
        self.live: dict[tuple[int, bytes], Request] = {}   # admitted, last frame not yet sent
        self._stop_at: float | None = None
        self._idle_since: float | None = None   # draining with nothing in flight, since
        self._reload = False
        self._draining = False
        self.exit_code = 0
        self.admitted_bytes = 0     # body bytes handed to the engine thread (memory_bounds.py)
        self.operator_drain = False  # `zerolayer ctl drain`: refuse new work, stay up
        self.io_changed = False      # `xdp-attach` / `xdp-detach`: the loop re-reads its fds
        self.started = time.monotonic()
        self.control: ControlServer | None = None
        self.shm: shm_ingress.ShmIngress | None = None   # [shm]
        self.log = log
        self.sd = Notifier(log=log)
        self.watchdog: Watchdog | None = None
        self._status_at = 0.0
        self._status_tokens = 0
        self.tokens_out = 0          # tokens generated, for the STATUS line's tok/s

    # ---- start-up ------------------------------------------------------------------------
    def start(self) -> None:
        c = self.cfg
        io_cpus, engine_cpus = self._cpu_plan()
        bad = engines_mod.cpu_problems(c)
        if bad:
            raise ValueError("; ".join(bad))
        self.keys = KeyStore(c.security.keys_file)  # refuses a group/world-readable or empty file
        self.metrics.key_reload_success.set_to_current_time()
        self.replay = ReplayGuard(ReplayConfig(skew_s=c.security.max_skew_s,
                                               capacity=c.security.nonce_capacity,
                                               per_key=c.security.nonce_per_key))
        self.ingress = Ingress(self.keys, self.replay, Reassembler())
        self.cache = ResultCache(ttl_s=c.cache.ttl_s, max_entries=c.cache.max_entries,
                                 max_bytes=c.cache.max_bytes)
        self.ingress.is_known = lambda key: self.cache.get(key) is not None
        self.ingress.admitted_mac = lambda key: (r.signer.mac if (r := self.live.get(key))
                                                 is not None else None)
        # one engine ([cpu]/[engine]), or one per [[engines]] table, each with its hand-offs
        specs = c.engines or [None]
        multi = len(specs) > 1
        self.engines: list[EngineSlot] = [
            EngineSlot(i, spec, Handoff(c.engine.queue_depth,
                                        f"admissions-{i}" if multi else "admissions"),
                       Handoff(EVENTS_CAPACITY, f"events-{i}" if multi else "events"))
            for i, spec in enumerate(specs)]
        self.router = Router(len(self.engines), c.engine.route_slack) if multi else None
        # engine 0's, for what reads one engine (older callers)
        self.admissions = self.engines[0].admissions
        self.events = self.engines[0].events
        # A port in use or a bad address fails the start now, not after the model loads;
        # datagrams that arrive meanwhile wait in the socket buffer.
        self.sock = self._open_socket()
        self.udp = BatchedUDP(self.sock, batch=c.network.batch)
        # [shm]: same-host clients over shared-memory rings, same protocol (shm_ingress.py);
        # opened before the model loads, like the UDP socket, so a bad path fails the start now
        self.shm = shm_ingress.open_from_config(c.shm, batch=c.network.batch, log=log)
        if self.shm is not None:
            log(f"shared-memory carrier on {self.shm.path} (mode {c.shm.mode})")
        # /healthz and /readyz answer from here on, through the cold start's kernel builds
        self.metrics.serve(c.metrics.host, c.metrics.port, ready=self._readiness)
        self.metrics.set_state("warming")
        for slot in self.engines:  # loads the model: a bad one fails the start here
            self._start_engine(slot, engine_cpus if slot.spec is None else
                               (config_mod.parse_cpus(slot.spec.cpus) if slot.spec.cpus
                                else None))
        self.engine_thread = self.engines[0].thread
        # every engine has engine 0's context: from here on ingress refuses what cannot fit
        self.ingress.max_seq_len = self.model.max_seq_len
        self.xdp = self._open_xdp()
        self.ctl_calls: Handoff[ControlCall] = Handoff(64, "control")
        path = control_mod.resolve_path(c.control.socket)
        if path or c.control.tcp:
            self.control = ControlServer(
                path, self.ctl_calls, log=log,
                prepare=lambda cmd, args: control_commands.prepare(self, cmd, args),
                tcp=c.control.tcp, curve_dir=c.control.curve_dir)
            self.control.start()
            if path:
                log(f"control socket ipc://{path} (mode 0600)")
            if c.control.tcp:
                log(f"control socket {c.control.tcp} (CURVE, keys in {c.control.curve_dir})")
        self.events_pub: Publisher | None = None
        if c.control.events:
            self.events_pub = Publisher(f"ipc://{c.control.events}", hwm=c.control.events_hwm)
            log(f"lifecycle events on ipc://{c.control.events} (mode 0600)")
        self._pin_io(io_cpus)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, lambda *_: setattr(self, "_reload", True))
        self.state = ServerState.READY
        host, port = self.sock.getsockname()[:2]
        path = "udp" if self.xdp is None else f"xdp on {c.network.interface} + udp fallback"
        log(f"ready on {host}:{port}, ingress {path} "
            f"(metrics {c.metrics.host}:{c.metrics.port or 'off'})")
        self.sd.notify("READY=1", "STATUS=ready")
        # the slowest live engine's beat: any one stuck in a kernel stops the pings
        self.watchdog = Watchdog(self.sd, lambda: min(
            (s.thread.beat for s in self.engines if not s.dead), default=0.0))

    def _cpu_plan(self) -> tuple[set[int] | None, set[int] | None]:
        """[cpu]: cpus = the whole process; io_cpu = the I/O thread; engine_cpus = the engine
        thread, which pins itself before it loads the model, so that the kernel threads it
        starts inherit its CPUs."""
        c = self.cfg.cpu
        if c.cpus:
            os.sched_setaffinity(0, config_mod.parse_cpus(c.cpus))
            log(f"pinned to CPUs {c.cpus}")
        io = config_mod.parse_cpus(c.io_cpu) if c.io_cpu else None
        eng = config_mod.parse_cpus(c.engine_cpus) if c.engine_cpus else None
        return io, eng

    def _pin_io(self, io_cpus: set[int] | None) -> None:
        c = self.cfg.cpu
        if io_cpus:
            os.sched_setaffinity(0, io_cpus)  # this (the I/O) thread only, from here on
        if len(self.engines) == 1:
            log(f"I/O thread on CPUs {sorted(os.sched_getaffinity(0))}, engine thread on "
                f"{sorted(self.engine_thread.cpus) if self.engine_thread.cpus else 'the same'}")
        else:
            log(f"I/O thread on CPUs {sorted(os.sched_getaffinity(0))}; "
                + "; ".join(f"engine {s.index} on "
                            f"{sorted(s.cpus) if s.cpus else 'the same'} ({s.threads} threads)"
                            for s in self.engines))
        if c.sched_fifo:
            try:  # the I/O thread's latency is the one that real-time priority buys
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(c.sched_fifo))
                log(f"SCHED_FIFO priority {c.sched_fifo} (I/O thread)")
            except PermissionError:
                log("SCHED_FIFO refused (needs CAP_SYS_NICE); running with normal scheduling",
                logging.WARNING)

    def _start_engine(self, slot: EngineSlot, engine_cpus: set[int] | None) -> None:
        """Start an engine thread; it loads the model and warms it up itself (see
        engine_thread.py: the kernels' threads must be that thread's), and this waits.
        Engines after the first share engine 0's weights (engines.py)."""
        m, e = self.cfg.model, self.cfg.engine
        spec = slot.spec
        threads = (spec.threads if spec else 0) or m.threads or None
        kv_blocks = (spec.kv_blocks if spec else 0) or e.kv_blocks or None

        def load() -> Engine:
            test_hooks.before_load()
            import numba

            from zerolayer.gpu import backend
            from zerolayer.gpu.generate import Generator
            if spec is not None and spec.device >= 0 and backend.ON_DEVICE:
                from numba import cuda  # this thread's current device, before any upload
                cuda.select_device(spec.device)
            if slot.index == 0:
                gen = Generator.load(m.path or None, threads=threads,
                                     max_seq_len=m.max_seq_len, kv_blocks=kv_blocks,
                                     warmup=self.cfg.lifecycle.warmup, log=log)
                self.model = gen.model
                self.metrics.backend.labels(backend.NAME,
                                            getattr(gen.model, "device", "cpu")).set(1)
            else:
                gen = load_sibling(self.engines[0].model, threads=threads, kv_blocks=kv_blocks,
                                   warmup=self.cfg.lifecycle.warmup,
                                   log=lambda msg: log(f"engine {slot.index}: {msg}"))
            fault_hooks.after_warmup(slot.index)
            fault_hooks.wrap_model(gen.model)
            slot.model, slot.threads = gen.model, numba.get_num_threads()
            return Engine(gen.model, gen.tokenizer, emit=lambda ev: None,
                          max_running=e.max_running, max_waiting=e.max_waiting,
                          step_tokens=e.step_tokens, overlap=e.overlap)

        multi = len(self.engines) > 1
        slot.cpus = engine_cpus
        t = slot.thread = EngineThread(
            load, slot.admissions, slot.events, cpus=engine_cpus, log=log, index=slot.index,
            name=f"zerolayer-engine-{slot.index}" if multi else "zerolayer-engine")
        if slot.index == 0:
            self.engine_thread = t
        t.start()
        t0 = time.monotonic()
        self.sd.notify("STATUS=warming: loading the model")
        while not t.ready.wait(5.0) and t.is_alive():
            # the first start in a fresh cache compiles kernels for about a minute: tell
            # systemd the start is alive, 30 s at a time, as long as it goes on
            self.sd.notify("EXTEND_TIMEOUT_USEC=30000000",
                           f"STATUS=warming: loading the model and compiling kernels "
                           f"({time.monotonic() - t0:.0f} s)")
        if t.start_error is not None:
            raise t.start_error
        if not t.is_alive():
            raise RuntimeError("the engine thread failed to start (see above)")

    def _open_socket(self) -> socket.socket:
        n = self.cfg.network
        fam = socket.AF_INET6 if ":" in n.host else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, n.rcvbuf_bytes)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, n.rcvbuf_bytes)
        if n.busy_poll:
            try:
                s.setsockopt(socket.SOL_SOCKET, 46, 50)  # SO_BUSY_POLL, µs (needs CAP_NET_ADMIN)
            except OSError:
                pass
        s.bind((n.host, n.port))
        s.setblocking(False)
        return s

    def _open_xdp(self, ingress: str | None = None):
        """The AF_XDP fast path (network.ingress xdp|auto; `ingress` overrides it for the
        operator's `xdp-attach`). The UDP socket stays open either way: it serves whatever
        the XDP program passes on (no socket registered yet, another device, a host without
        XDP), so both paths always answer."""
        n = self.cfg.network
        ingress = ingress or n.ingress
        if ingress not in ("udp", "xdp", "auto"):
            raise ValueError(f"network.ingress must be udp, xdp or auto, not {ingress!r}")
        if ingress == "udp":
            return None
        if not n.interface:
            if ingress == "xdp":
                raise ValueError("network.ingress = xdp needs network.interface")
            log("ingress auto: no network.interface set, using udp")
            return None
        from .xdp_io import XdpIO, XdpSettings
        port = self.sock.getsockname()[1]
        try:
            io = XdpIO.open(XdpSettings(n.interface, (port,), attach_mode=n.xdp_attach,
                                        xsk_mode=n.xsk_mode, ring_size=n.xsk_ring_size,
                                        rate_pps=n.xdp_rate_pps, rate_burst=n.xdp_rate_burst,
                                        pin_dir=n.xdp_pin_dir))
        except (OSError, RuntimeError, ValueError) as e:
            if ingress == "xdp":
                raise OSError(f"XDP ingress on {n.interface}: {e}") from e
            log(f"ingress auto: XDP unavailable on {n.interface} ({e}); using udp",
                logging.WARNING)
            return None
        log(f"XDP attached to {n.interface} ({n.xdp_attach}), {len(io.socks)} AF_XDP socket(s), "
            f"{'zero-copy' if io.zerocopy else 'copy mode'}; BCC compile (helper process) "
            f"{io.compile_seconds:.2f} s" + (f"; maps pinned in {n.xdp_pin_dir}" if io.pins else ""))
        self.metrics.xdp_attached.set(1)
        return io

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> int:
        next_house = 0.0
        wait_fds = self._wait_fds()
        busy = self.cfg.network.busy_poll
        xdp = self.xdp
        shm = self.shm
        shm_poll_s = self.cfg.shm.poll_us / 1e6
        spin = 0
        while True:
            spin += 1
            # With XDP serving, the UDP socket only gets what the program passes on: a
            # busy-polling loop checks it every 8th turn, not paying a syscall per turn.
            poll_udp = xdp is None or not busy or not spin & 7
            if shm is not None and (not busy or not spin & 7):
                shm.poll_events()  # [shm] accept, hang-ups, doorbells: one epoll_wait(0)
            for _ in range(MAX_RX_BATCHES):
                batch = self.udp.recv_batch() if poll_udp else []
                more = len(batch) == self.udp.batch
                if xdp is not None:
                    xb = xdp.recv_batch()
                    more = more or len(xb) >= xdp.batch
                    batch += xb
                if shm is not None:  # [shm] the request rings: memory reads, no syscall
                    batch += shm.recv_batch()
                    more = more or shm.more
                for data, addr in batch:
                    self._on_datagram(data, addr)
                if not more:
                    break
            # Drained every turn, not only when items are seen: the engine writes the eventfd
            # after queueing its events, so this thread may take the events first and find
            # the fd still readable afterwards; left set, it would make select() return at
            # once, turn after turn (a spinning I/O thread, competing with the kernels).
            for slot in self.engines:
                for ev in slot.events.drain():
                    self._on_event(ev, slot)
            for call in self.ctl_calls.drain():  # every turn, as the events (its eventfd)
                control_commands.run(self, call)
            if self.io_changed:  # the operator attached or detached XDP: before any select
                self.io_changed = False
                xdp = self.xdp
                wait_fds = self._wait_fds()
            if self.out or (xdp is not None and xdp.tx_backlog):
                self._flush()
            now = time.monotonic()
            if now >= next_house:
                self._housekeeping(now)
                next_house = now + HOUSEKEEPING_S
            if self.exit_code:
                break
            if self._draining and self._drained(now):
                break
            if not busy:
                if (shm is not None and shm_poll_s and shm.conns and self._engine_idle()
                        and shm.spin(shm_poll_s, wait_fds)):
                    continue   # [shm] a client wrote while we looked: no sleep, no wake-up
                # [shm] arm(): clients ring the doorbell only while we sleep; True = records
                # arrived meanwhile, so look again instead of sleeping
                pending = shm is not None and shm.arm()
                select.select(wait_fds, [], [], 0.0 if pending else max(0.0, next_house - now))
        self._shutdown()
        return self.exit_code

    def _engine_idle(self) -> bool:
        """Nothing for the model to do: the I/O thread may spend the core on polling."""
        for s in self.engines:
            if s.dead:
                continue
            running, waiting, _ = s.thread.stats
            if running or waiting or len(s.admissions):
                return False
        return True

    def _readiness(self) -> tuple[bool, str]:
        """/readyz: 200 in READY ("degraded: ..." while some engine is dead and others
        serve), 503 with the state otherwise."""
        if self.state is not ServerState.READY:
            return False, self.state.name.lower()
        dead = [s.index for s in self.engines if s.dead]
        if dead:
            return True, (f"degraded: engine(s) {', '.join(map(str, dead))} of "
                          f"{len(self.engines)} dead")
        return True, "ready"

    def _wait_fds(self) -> list:
        return ([self.sock, *(s.events for s in self.engines), self.ctl_calls]
                + (self.xdp.fileno_list() if self.xdp else [])
                + ([self.shm] if self.shm is not None else []))  # [shm] its epoll fd

    def _flush(self) -> None:
        if self.xdp is not None and self.xdp.tx_backlog:
            self.xdp.poll_tx()  # frames a busy kernel left on a TX ring last time
        if self.shm is not None and self.out:
            # [shm] into response rings (frames for a client gone since are dropped there,
            # even with no client left); the rest below
            self.out = self.shm.send_batch(self.out)
        if not self.out:
            return
        if self.xdp is None:
            out = self.out
            if any(type(a) is Peer for _, a in out):  # came over XDP, now detached
                out = [(f, self._udp_addr(a) if type(a) is Peer else a) for f, a in out]
            self.udp.send_batch(out)
        else:  # each frame goes back the way its request came
            xo = [item for item in self.out if type(item[1]) is Peer]
            if xo:
                self.xdp.send_batch(xo)
            if len(xo) < len(self.out):
                self.udp.send_batch([item for item in self.out if type(item[1]) is not Peer])
        self.out = []

    def _udp_addr(self, peer: Peer) -> tuple:
        """Where the kernel's UDP path reaches an AF_XDP client (after `xdp-detach`)."""
        if self.sock.family == socket.AF_INET6 and not peer.ipv6:
            return ("::ffff:" + peer.host, peer.port)
        return (peer.host, peer.port)

    def _housekeeping(self, now: float) -> None:
        if self._reload:
            self._reload = False
            self.reload_keys()
        self.ingress.tick()
        for e in self.cache.expired_leases(self.cfg.cache.lease_s):
            if isinstance(e.handle, Request):
                self._cancel(e.handle, CancelReason.LEASE)
        for slot in self.engines:
            if not slot.dead and not slot.thread.is_alive() and not self.exit_code:
                for ev in slot.events.drain():  # its last words (EngineDied) first
                    self._on_event(ev, slot)
                if not slot.dead and not self.exit_code:
                    self._on_event(EngineDied("the engine thread is gone"), slot)
        running = waiting = kv_held = kv_blocks = admissions_queued = 0
        m = self.metrics
        for slot in self.engines:  # totals over the live engines, and each engine's own
            if slot.dead:
                m.update_engine(slot.index, 0, 0, 0.0, False)
                continue
            r, w, held = slot.thread.stats
            q = len(slot.admissions)
            _, blocks = slot.held_blocks()
            running, waiting, admissions_queued = running + r, waiting + w, admissions_queued + q
            kv_held, kv_blocks = kv_held + held, kv_blocks + blocks
            m.update_engine(slot.index, r, w + q, held / blocks if blocks else 0.0, True)
        m.running.set(running)
        m.waiting.set(waiting + admissions_queued)
        m.kv_usage.set(kv_held / kv_blocks if kv_blocks else 0.0)  # cached prefixes are reclaimable
        m.update_handoff("admissions", sum(s.admissions.full for s in self.engines))
        m.update_handoff("events", sum(s.thread.events_full_waits for s in self.engines))
        if self.xdp is not None:
            self.metrics.update_xdp(self.xdp)
        if self.shm is not None:
            self.metrics.update_shm(self.shm)  # [shm]
        if self.watchdog is not None:
            self.watchdog.tick()
        if self.sd.enabled and now >= self._status_at + STATUS_S:
            toks = self.tokens_out
            rate = (toks - self._status_tokens) / max(1e-9, now - self._status_at)
            dead = sum(1 for s in self.engines if s.dead)
            degraded = f" (degraded: {dead} of {len(self.engines)} engines dead)" if dead else ""
            self.sd.notify(f"STATUS={self.state.name.lower()}{degraded}: {running} running, "
                           f"{waiting + admissions_queued} waiting, {rate:.1f} tok/s")
            self._status_at, self._status_tokens = now, toks
        m.update_ingress(self.ingress)
        m.update_memory(memory_bounds.buffers(self))
        m.set_state(self.state.name.lower())
        rs, ra = self.replay.stats, self.ingress.reassembler.stats
        if self.events_pub is not None:
            m.update_events("published", self.events_pub.published)
            m.update_events("dropped", self.events_pub.dropped)
        m.update_overloaded({
            "nonce_cache": rs["full"], "nonce_key_share": rs["key_full"],
            "reassembly": ra["refused_budget"], "reassembly_key_share": ra["refused_key_share"],
            "result_cache": self.cache.stats["refused"],
            "admissions": sum(s.admissions.full for s in self.engines),
            "wait_queue": sum(s.thread.waiting_full + s.refused_full for s in self.engines)})
        self._flush()

    def reload_keys(self) -> bool:
        """SIGHUP or `zerolayer ctl reload-keys`: a refused file keeps the old keys."""
        self.sd.reloading()
        ok = self.keys.reload()
        self.sd.notify("READY=1", f"STATUS={self.state.name.lower()}: keys "
                                  f"{'reloaded' if ok else 'reload failed, old keys kept'}")
        self.metrics.key_reloads.labels("ok" if ok else "failed").inc()
        if ok:
            self.metrics.key_reload_success.set_to_current_time()
        log(f"keys reloaded ({len(self.keys)} keys)" if ok
            else f"keys reload failed, old keys kept: {self.keys.last_error}",
            logging.INFO if ok else logging.ERROR)
        return ok

    def _on_term(self, *_):
        if not self._draining:
            self._draining = True
            self.state = ServerState.DRAINING
            self.ingress.draining = True
            self._stop_at = time.monotonic() + self.cfg.lifecycle.drain_timeout_s
            log(f"draining: {len(self.live)} requests in flight")
            self.sd.notify("STOPPING=1", f"STATUS=draining: {len(self.live)} in flight")
        elif self._idle_since is not None:  # a second signal while lingering: exit now
            self._stop_at = time.monotonic()

    def _drained(self, now: float) -> bool:
        """Draining ends at the drain timeout, or `drain_linger_s` after the last request in
        flight ended: until then a client that lost the tail of its stream (or was attached
        as a duplicate) still gets RESEND and keepalive answers from the result cache."""
        if now >= self._stop_at:
            return True
        if self.live:
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = now
            if self.cfg.lifecycle.drain_linger_s > 0:
                log(f"drained; answering RESEND for {self.cfg.lifecycle.drain_linger_s:g} s")
        return now >= self._idle_since + self.cfg.lifecycle.drain_linger_s

    def _shutdown(self) -> None:
        for r in list(self.live.values()):
            self._cancel(r, CancelReason.DRAIN)  # tell, never vanish
        self._flush()
        for slot in self.engines:
            slot.thread.stop()
        for slot in self.engines:
            slot.thread.join(timeout=30)
        if self.xdp is not None:
            from .xdp_io import wait_tx_drained
            wait_tx_drained(self.xdp)
            self.xdp.close()  # detach: invoke traffic goes to the kernel stack from here on
        self.sock.close()
        if self.shm is not None:
            self.shm.close()  # [shm] frees every client's rings, removes the socket file
        if self.control is not None:
            self.control.stop()
        if self.events_pub is not None:
            self.events_pub.close()
        log("stopped" if not self.exit_code else f"stopped (exit {self.exit_code})")

    # ---- requests ------------------------------------------------------------------------
    def _send(self, frame: bytes, addr) -> None:
        self.out.append((frame, addr))

    def _internal(self, where: str, e: Exception) -> None:
        self.metrics.errors.labels(ErrorCode.INTERNAL.name).inc()
        log(f"internal error in {where}: {type(e).__name__}: {e}", logging.ERROR)

    def _on_datagram(self, data: bytes, addr) -> None:
        try:
            self._handle(data, addr)
        except Exception as e:  # noqa: BLE001 - one bad request must not end the daemon
            self._internal("request handling", e)

    def _handle(self, data: bytes, addr) -> None:
        self.metrics.datagrams.inc()
        r = self.ingress.feed(data)
        if isinstance(r, InvokeRequest):
            self._on_invoke(r, addr)
        elif isinstance(r, ControlRequest):
            self._on_control(r, addr)
        elif isinstance(r, Rejected):
            self.metrics.errors.labels(r.code.name).inc()
            if r.reply is not None:
                self._send(r.reply, addr)

    def _lease_ms(self) -> int:
        return int(self.cfg.cache.lease_s * 1000)

    def _on_invoke(self, inv: InvokeRequest, addr) -> None:
        key = inv.cache_key
        e = self.cache.lookup(key)
        if e is not None:  # a duplicate: never run the model twice
            self.cache.touch(key)
            if e.status is EntryStatus.RUNNING:
                self.metrics.idempotent.labels("attached").inc()
                e.handle.addr = addr  # the client may have moved (new socket on retry)
                self._send(inv.signer.ack(e.next_seq, e.run_id, RunState.RUNNING, self._lease_ms()), addr)
            else:
                self.metrics.idempotent.labels("replayed").inc()
            for f in e.frames:
                self._send(f, addr)
            return
        try:
            entry = self.cache.start(key)
        except OverloadedError as ex:
            self.metrics.errors.labels(ErrorCode.OVERLOADED.name).inc()
            self._send(inv.signer.error(ErrorCode.OVERLOADED, str(ex)), addr)
            return
        req = Request(key, inv.body.params, inv.body, inv.signer, entry.run_id, inv.received_at,
                      addr=addr)
        entry.handle = req
        req.ingress_us = int((time.monotonic() - inv.received_at) * 1e6)
        req.body_bytes = memory_bounds.body_bytes(inv.body)
        slot = self._route(req, inv.body)
        if isinstance(slot, str):  # the engine is that far behind: say so, drop nothing
            # refused at admission: no stream was started (no ACK), so the error carries no
            # place in one (seq 0xFFFFFFFF, run id 0, docs/PROTOCOL.md §5.3), and the entry
            # is dropped so that a retry of the same request id is admitted afresh
            self.metrics.errors.labels(ErrorCode.OVERLOADED.name).inc()
            self.cache.finish(key, cacheable=False)
            self._send(inv.signer.error(ErrorCode.OVERLOADED, slot), addr)
            return
        slot.live += 1
        self.admitted_bytes += req.body_bytes
        if self.events_pub is not None:
            self.events_pub.publish("admitted", **_ids(req), fragments=inv.fragments)
        self.live[key] = req
        # a model run is counted when the engine accepts it (AcceptedEvent), not here: the
        # engine may still refuse it as never started (a text over the context)
        self._send(inv.signer.ack(0, req.run_id, RunState.QUEUED, self._lease_ms()), addr)

    def _route(self, req: Request, body) -> EngineSlot | str:
        """Hand the request to an engine: the router's choice (several engines), else the
        next least loaded with room; when every live one is full, why (the OVERLOADED
        message).

        Room is two bounds. An engine holds at most max_running + max_waiting requests
        (Engine.capacity): `slot.live`, the requests handed to it that this thread has not
        closed, counts every one it holds and is not cancelled, so refusing here when
        `live` reaches the capacity means the engine itself never has to refuse for room,
        after the ACK (engine.py, `submit`). Then its hand-off must take it."""
        e = self.cfg.engine
        cap = e.max_running + e.max_waiting
        if self.router is None:
            slot = self.engines[0]
            if slot.live >= cap:
                slot.refused_full += 1
                return _wait_queue_full(cap, e)
            if not slot.admissions.put(req):
                return self._handoff_full()
            self.metrics.engine_routed.labels("0", "load").inc()
            return slot
        hashes = boundary_hashes(body.payload)
        load = [s.live for s in self.engines]
        alive = [not s.dead for s in self.engines]
        i, why = self.router.choose(hashes, load, alive)
        order = ([i] if i >= 0 else []) + sorted(
            (s.index for s in self.engines if not s.dead and s.index != i),
            key=lambda j: (load[j], j))
        roomy = [j for j in order if self.engines[j].live < cap]
        if order and not roomy:
            self.engines[order[0]].refused_full += 1
            return _wait_queue_full(cap, e) + " per engine"
        for j in roomy:
            slot = self.engines[j]
            req.engine = j
            if slot.admissions.put(req):
                self.router.record(j, hashes)
                self.metrics.engine_routed.labels(str(j), why if j == i else "load").inc()
                return slot
        return self._handoff_full()

    def _handoff_full(self) -> str:
        return (f"admission queue full ({self.admissions.capacity} "
                f"requests{' per engine' if self.router else ''})")

    def _on_control(self, c: ControlRequest, addr) -> None:
        if c.msg_type == MsgType.PING:
            self._send(c.signer.pong(c.timestamp_us, time.time_ns() // 1000, self.state), addr)
            return
        e = self.cache.get(c.cache_key)
        if e is None:
            return  # unknown request: stay silent (docs/PROTOCOL.md)
        self.cache.touch(c.cache_key)
        req = e.handle if e.status is EntryStatus.RUNNING else None
        if req is not None:
            req.addr = addr
        if c.msg_type == MsgType.CANCEL and req is not None:
            self._cancel(req, CancelReason.CLIENT)
            return
        # RESEND (or keepalive), or CANCEL of a finished request
        from_seq = c.from_seq if c.msg_type == MsgType.RESEND else NO_SEQ
        frames = e.frames_from(from_seq, RESEND_LIMIT) if from_seq != NO_SEQ else []
        for f in frames:
            self._send(f, addr)
        if not frames:
            state = RunState.RUNNING if e.status is EntryStatus.RUNNING else RunState.FINISHED
            self._send(c.signer.ack(e.next_seq, e.run_id, state, self._lease_ms()), addr)

    def _cancel(self, r: Request, why: CancelReason) -> None:
        """Stop a request now, on the I/O thread: its last frame goes out at once (DONE
        cancelled for the client's own CANCEL, ERROR CANCELLED when the daemon decides), and
        the engine frees its KV at its next step boundary (keeping the prompt's KV for
        reuse). Tokens of a step in flight for it are dropped when they arrive."""
        if r.closed:
            return
        r.cancel = why
        if why is not CancelReason.CLIENT:
            return self._fail(r, ErrorCode.CANCELLED, why.value)
        ids = r.prompt_ids
        usage = Usage(0 if ids is None else len(ids), r.cached, len(r.tokens))
        self._done(r, FinishReason.CANCELLED, usage, Timings(tokenize_us=r.tokenize_us))

    # ---- engine events -------------------------------------------------------------------
    def _on_event(self, ev: EngineEvent, slot: EngineSlot | None = None) -> None:
        if isinstance(ev, EngineDied):
            return self._engine_died(ev.message, slot or self.engines[0])
        r = ev.req
        if isinstance(ev, AcceptedEvent):  # the engine took it: a model run, even if it was
            self.metrics.model_runs.inc()  # cancelled meanwhile (its DONE is in its stream)
            return
        if r.closed:
            return  # answered already (cancelled, lease, drain): the engine caught up
        if isinstance(ev, TextEvent):
            if self.events_pub is not None and r.sent_tokens == 0 and ev.n_tokens:
                self.events_pub.publish("first_token", **_ids(r),
                                        ttft_s=round(time.monotonic() - r.received_at, 6))
            now = time.monotonic()
            if r.t_text and ev.n_tokens:
                gap = (now - r.t_text) / ev.n_tokens
                for _ in range(ev.n_tokens):
                    self.metrics.token_gap.observe(gap)
            if ev.n_tokens:
                r.t_text = now
            pieces = split_utf8(ev.text.encode("utf-8"), MAX_TEXT)
            for i, piece in enumerate(pieces):
                n = ev.n_tokens if i == len(pieces) - 1 else 0
                self._emit(r, r.signer.token(r.next_seq, r.run_id, piece, n))
            r.sent_tokens += ev.n_tokens
        elif isinstance(ev, DoneEvent):
            self._done(r, ev.reason, ev.usage, ev.timings)
        elif isinstance(ev, FailedEvent):
            self._fail(r, ev.code, ev.message, started=ev.started)

    def _engine_died(self, msg: str, slot: EngineSlot) -> None:
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
            mine = [r for r in self.live.values() if r.engine == slot.index]
            log(f"engine {slot.index} failed ({msg}); failing its {len(mine)} request(s); "
                f"{len(alive)} of {len(self.engines)} engines serve on (degraded)",
                logging.CRITICAL)
            self.router.forget(slot.index)
            for r in mine:
                self._fail(r, ErrorCode.INTERNAL, f"the engine failed: {msg}")
            return
        log(f"engine failed ({msg}); failing {len(self.live)} request(s) and exiting",
            logging.CRITICAL)
        for r in list(self.live.values()):
            self._fail(r, ErrorCode.INTERNAL, f"the engine failed: {msg}")
        self.exit_code = EXIT_ENGINE_DIED
        self.state = ServerState.DRAINING
        self.ingress.draining = True

    def _emit(self, r: Request, frame: bytes) -> None:
        r.next_seq += 1
        self.cache.append(r.key, frame)
        self._send(frame, r.addr)

    def _close(self, r: Request, cacheable: bool) -> None:
        r.closed = True
        self.cache.finish(r.key, cacheable=cacheable)
        if self.live.pop(r.key, None) is not None:
            self.engines[r.engine].live -= 1

    def _done(self, r: Request, fr: FinishReason, usage: Usage, t: Timings) -> None:
        now = time.monotonic()
        t = Timings(queue_us=t.queue_us, prefill_us=t.prefill_us,
                    decode_per_token_us=t.decode_per_token_us,
                    total_us=int((now - r.received_at) * 1e6), ingress_us=r.ingress_us,
                    tokenize_us=t.tokenize_us, decode_us=t.decode_us,
                    decode_step_max_us=t.decode_step_max_us)
        self._emit(r, r.signer.done(r.next_seq, r.run_id, fr, usage, t))
        self._close(r, cacheable=True)
        if self.events_pub is not None:
            self.events_pub.publish("finished", **_ids(r), finish_reason=fr.label,
                                    usage=dataclasses.asdict(usage),
                                    timings=dataclasses.asdict(t))
        m = self.metrics
        m.requests.labels(fr.label).inc()
        m.prompt_tokens.inc(usage.prompt_tokens)
        m.generated_tokens.inc(usage.completion_tokens)
        self.tokens_out += usage.completion_tokens
        m.e2e.observe(now - r.received_at)
        if r.t_first:
            m.ttft.observe(r.t_first - r.received_at)
        if usage.completion_tokens > 1 and fr is not FinishReason.CANCELLED:
            m.itl.observe(t.decode_per_token_us / 1e6)
            m.step_max.observe(t.decode_step_max_us / 1e6)
        for stage, us in (("queue", t.queue_us), ("tokenize", t.tokenize_us),
                          ("prefill", t.prefill_us), ("decode", t.decode_us)):
            m.stage.labels(stage).observe(us / 1e6)
        m.prefix_tokens.labels("hit").inc(usage.cached_prompt_tokens)
        m.prefix_tokens.labels("miss").inc(usage.prompt_tokens - usage.cached_prompt_tokens)

    def _fail(self, r: Request, code: ErrorCode, msg: str, started: bool = True) -> None:
        """The request's last frame, an ERROR. started=False (the engine refused it before
        accepting it): framed as a request that never started, seq 0xFFFFFFFF and run id 0
        (docs/PROTOCOL.md §5.3), though its ACK went out; stored like any last frame, so a
        duplicate or a RESEND gets the same answer."""
        self.metrics.errors.labels(code.name).inc()
        self.metrics.requests.labels("error").inc()
        self._emit(r, r.signer.error(code, msg, r.next_seq, r.run_id) if started
                   else r.signer.error(code, msg))
        self._close(r, cacheable=ERROR_INFO[code].cacheable)
        if self.events_pub is not None:
            self.events_pub.publish("failed", **_ids(r), code=code.name, message=msg)


def _wait_queue_full(cap: int, e) -> str:
    return (f"wait queue full: {cap} requests held (max_running {e.max_running} + "
            f"max_waiting {e.max_waiting})")


def _ids(r: Request) -> dict:
    return {"key_id": r.key[0], "request_id": r.key[1].hex(), "run_id": r.run_id}


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
        from . import check
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
    except (KeyFileError, ValueError, OSError) as e:
        log(f"cannot start: {e}", logging.ERROR)
        _failed_start(d)
    except Exception as e:  # noqa: BLE001 - a model error etc.: say it plainly
        log(f"cannot start: {type(e).__name__}: {e}", logging.ERROR)
        _failed_start(d)
    return d.run()


def _failed_start(d: Daemon | None) -> NoReturn:
    """End the process of a start that failed, now, with EXIT_BAD_START; never returns.

    Returning into the interpreter's shutdown is not safe here: a model load that failed
    can leave behind what keeps a process alive after main returns (a library's non-daemon
    thread, an atexit handler waiting on a device in a bad state), and a daemon that said
    why it cannot start must not then sit there, never ready and never gone, while its
    supervisor and its callers wait. Nothing of a daemon that never served needs an
    orderly teardown: the kernel frees its sockets, memory and device contexts; the one
    thing it leaves on disk, the shared-memory carrier's socket file, is removed first."""
    try:
        if d is not None and d.shm is not None:
            d.shm.close()
    finally:
        logging.shutdown()   # every log line out before the process goes
        sys.stdout.flush()
        os._exit(EXIT_BAD_START)


if __name__ == "__main__":
    sys.exit(main())
