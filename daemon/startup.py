"""What the daemon opens and starts before it serves, each a function of the configuration:
the CPU plan, the UDP socket, the AF_XDP fast path, the engine threads.

Ordered by what can fail cheaply: the socket (a port in use, a bad address) and the shm path
are opened before the model loads, so a bad start fails in milliseconds, not after a minute
of kernel builds; datagrams that arrive meanwhile wait in the socket buffer.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, NoReturn

from . import config as config_mod
from . import fault_hooks, sched_deadline, test_hooks
from .carriers import xdp_setup
from .config import DaemonConfig
from .engine import Engine
from .engine_thread import EngineThread
from .engines import EngineSlot, load_sibling
from .ops.logs import Log
from .ops.metrics import Metrics
from .ops.sd_notify import Notifier

if TYPE_CHECKING:
    from zerolayer.gpu.draft_model import DraftModel
    from zerolayer.gpu.model_api import Model

    from .auth import KeyStore
    from .carriers import ShmCarrier
    from .carriers.xdp_io import XdpIO
    from .in_flight import InFlight



class LoadTimeoutError(TimeoutError):
    """The engine thread's load and warm-up outlived [model] load_timeout_s."""


# SCHED_DEADLINE's period for the I/O thread ([cpu] io_runtime_us of each): a throttled
# thread waits at most this long for its next budget
IO_PERIOD_US = 1000

def apply_switch_interval(cfg: DaemonConfig, log: Log) -> float:
    """[cpu] switch_interval_us: how long a thread that wants the GIL waits before it asks the
    holder to drop it. While the engine thread runs Python between its nogil kernels, an I/O
    thread woken by a datagram waits up to this long; CPython's default is 5 ms. Returns the
    interval now in force, in seconds."""
    sys.setswitchinterval(cfg.cpu.switch_interval_us / 1e6)
    now = sys.getswitchinterval()
    log(f"GIL switch interval {now * 1e6:.0f} µs")
    return now


def cpu_plan(cfg: DaemonConfig, log: Log) -> tuple[set[int] | None, set[int] | None]:
    """[cpu]: cpus = the whole process; io_cpu = the I/O thread; engine_cpus = the engine
    thread, which pins itself before it loads the model, so that the kernel threads it
    starts inherit its CPUs."""
    c = cfg.cpu
    apply_switch_interval(cfg, log)
    if c.cpus:
        os.sched_setaffinity(0, config_mod.parse_cpus(c.cpus))
        log(f"pinned to CPUs {c.cpus}")
    io = config_mod.parse_cpus(c.io_cpu) if c.io_cpu else None
    eng = config_mod.parse_cpus(c.engine_cpus) if c.engine_cpus else None
    return io, eng


def pin_io(cfg: DaemonConfig, engines: list[EngineSlot], io_cpus: set[int] | None,
           log: Log) -> None:
    c = cfg.cpu
    if io_cpus:
        os.sched_setaffinity(0, io_cpus)  # this (the I/O) thread only, from here on
    mine = sorted(os.sched_getaffinity(0))
    if len(engines) == 1:
        t = engines[0].thread
        log(f"I/O thread on CPUs {mine}, engine thread on "
            f"{sorted(t.cpus) if t is not None and t.cpus else 'the same'}")
    else:
        log(f"I/O thread on CPUs {mine}; "
            + "; ".join(f"engine {s.index} on "
                        f"{sorted(s.cpus) if s.cpus else 'the same'} ({s.threads} threads)"
                        for s in engines))
    if c.io_runtime_us:
        try:
            sched_deadline.set_deadline(c.io_runtime_us, IO_PERIOD_US)
            log(f"SCHED_DEADLINE {c.io_runtime_us} µs every {IO_PERIOD_US} µs (I/O thread)")
        except OSError as e:
            log(f"SCHED_DEADLINE refused ({e.strerror or e}: it needs CAP_SYS_NICE and an I/O "
                f"thread on every CPU of its domain); running with normal scheduling",
                logging.WARNING)
    if c.sched_fifo:
        try:  # the I/O thread's latency is the one that real-time priority buys
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(c.sched_fifo))
            log(f"SCHED_FIFO priority {c.sched_fifo} (I/O thread)")
        except PermissionError:
            log("SCHED_FIFO refused (needs CAP_SYS_NICE); running with normal scheduling",
                logging.WARNING)


def prune_model_cache(path: str, max_bytes: int, log: Log) -> None:
    """[model] cache_max_bytes: the repacked-model cache pruned, the model just loaded kept
    (gpu/model_cache_prune.py). A cache that cannot be read or written only costs disk."""
    from zerolayer.gpu import gguf_loader, model_cache
    try:
        gone = model_cache.prune_to(path or gguf_loader.default_model_path(), max_bytes)
    except OSError as e:
        log(f"model cache not pruned: {e}", logging.WARNING)
        return
    if gone:
        log(f"model cache pruned to {max_bytes} bytes: removed {', '.join(gone)}")


def engine_cpus(slot: EngineSlot, default: set[int] | None) -> set[int] | None:
    if slot.spec is None:
        return default
    return config_mod.parse_cpus(slot.spec.cpus) if slot.spec.cpus else None


def load_drafter(path: str, target: Model, max_running: int, warmup: bool,
                 log: Log) -> DraftModel:
    """[engine] draft_model, loaded on the engine thread beside the target (its kernels
    are that thread's too). A file that cannot be loaded, or whose vocabulary is not the
    target's, is a configuration error naming the setting: the daemon does not start."""
    from zerolayer.gpu.draft_model import DraftModel, VocabMismatchError
    from zerolayer.gpu.errors import ModelFormatError
    t0 = time.monotonic()
    try:
        d = DraftModel.load(path, target, max_sequences=max_running, warmup=warmup)
    except (VocabMismatchError, ModelFormatError, OSError) as err:
        raise config_mod.ConfigError([f"engine.draft_model ({path}): {err}"]) from None
    c = d.model.cfg
    log(f"draft model {c.name} ({c.n_layer} layers, d={c.d_model}, same vocabulary) "
        f"loaded in {time.monotonic() - t0:.2f} s: speculative drafts come from it")
    return d


def start_engine(cfg: DaemonConfig, slot: EngineSlot, first: EngineSlot, multi: bool,
                 cpus: set[int] | None, metrics: Metrics, sd: Notifier, log: Log) -> None:
    """Start an engine thread; it loads the model and warms it up itself (see
    engine_thread.py: the kernels' threads must be that thread's), and this waits.
    Engines after the first share the first's weights (engines.py)."""
    m, e = cfg.model, cfg.engine
    spec = slot.spec
    threads = (spec.threads if spec else 0) or m.threads or None
    kv_blocks = (spec.kv_blocks if spec else 0) or e.kv_blocks or None

    def load() -> Engine:
        test_hooks.before_load()
        import numba

        from zerolayer.gpu import backend
        from zerolayer.gpu.generate import Generator
        from zerolayer.gpu.ops import cpu_features
        cpu_features.use_activations(cfg.cpu.activations)  # before the weights are laid out
        if spec is not None and spec.device >= 0 and backend.ON_DEVICE:
            from numba import cuda  # this thread's current device, before any upload
            cuda.select_device(spec.device)
        if slot is first:
            gen = Generator.load(m.path or None, threads=threads,
                                 max_seq_len=m.max_seq_len, kv_blocks=kv_blocks,
                                 warmup=cfg.lifecycle.warmup, log=log)
            metrics.backend.labels(backend.NAME, getattr(gen.model, "device", "cpu")).set(1)
            prune_model_cache(m.path, m.cache_max_bytes, log)
        else:
            if first.model is None:  # started after engine 0 has loaded, or not at all
                raise RuntimeError("engine 0 has no model to share")
            gen = load_sibling(first.model, threads=threads, kv_blocks=kv_blocks,
                               warmup=cfg.lifecycle.warmup,
                               log=lambda msg: log(f"engine {slot.index}: {msg}"))
        fault_hooks.after_warmup(slot.index)
        fault_hooks.wrap_model(gen.model)
        slot.model, slot.threads = gen.model, numba.get_num_threads()
        eng = Engine(gen.model, gen.tokenizer, emit=lambda ev: None,
                     max_running=e.max_running, max_waiting=e.max_waiting,
                     step_tokens=e.step_tokens, overlap=e.overlap,
                     speculative=e.speculative, speculative_max_batch=e.speculative_max_batch)
        if e.draft_model:
            if eng.speculative:
                eng.drafter = load_drafter(e.draft_model, gen.model, e.max_running,
                                           cfg.lifecycle.warmup, log)
            else:
                log("engine.draft_model ignored: this engine decodes without drafts "
                    "(engine.speculative off, or a backend that overlaps steps)",
                    logging.WARNING)
        return eng

    slot.cpus = cpus
    t = slot.thread = EngineThread(
        load, slot.admissions, slot.events, cpus=cpus, log=log, index=slot.index,
        name=f"zerolayer-engine-{slot.index}" if multi else "zerolayer-engine")
    t.start()
    t0 = time.monotonic()
    limit = m.load_timeout_s
    sd.notify("STATUS=warming: loading the model")
    while True:
        left = t0 + limit - time.monotonic() if limit else 5.0
        if t.ready.wait(max(0.0, min(5.0, left))) or not t.is_alive():
            break
        if limit and time.monotonic() - t0 >= limit:
            # A load that hangs without raising (a stuck device, a file system that never
            # answers) would otherwise hold the start forever outside systemd's
            # TimeoutStartSec; the caller ends the process at once (failed_start), thread
            # and all.
            raise LoadTimeoutError(f"the model did not load and warm up within {limit:g} s "
                                   f"(model.load_timeout_s)")
        # the first start in a fresh cache compiles kernels for about a minute: tell
        # systemd the start is alive, 30 s at a time, as long as it goes on
        sd.notify("EXTEND_TIMEOUT_USEC=30000000",
                  f"STATUS=warming: loading the model and compiling kernels "
                  f"({time.monotonic() - t0:.0f} s)")
    if t.start_error is not None:
        raise t.start_error
    if not t.is_alive():
        raise RuntimeError("the engine thread failed to start (see above)")


def open_socket(cfg: DaemonConfig) -> socket.socket:
    n = cfg.network
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


def open_xdp(cfg: DaemonConfig, port: int, metrics: Metrics, log: Log,
             ingress: str | None = None, keys: KeyStore | None = None,
             in_flight: InFlight | None = None) -> XdpIO | None:
    """The AF_XDP carrier (carriers/xdp_setup.py), with the keys published into its maps."""
    io = xdp_setup.open_xdp(cfg.network, port, metrics.carriers, log, ingress)
    if io is not None and keys is not None:
        publish_xdp_keys(io, keys, cfg, in_flight)
    return io


def running_xdp_keys(in_flight: InFlight | None) -> dict[int, list[bytes]]:
    """key id -> the XDP tag keys of the requests running under it (most have one)."""
    out: dict[int, list[bytes]] = {}
    for r in in_flight or ():
        if r.signer is not None:
            keys = out.setdefault(r.key[0], [])
            if r.signer.mac.xdp_key not in keys:
                keys.append(r.signer.mac.xdp_key)
    return out


def publish_xdp_keys(io: XdpIO, keys: KeyStore, cfg: DaemonConfig,
                     in_flight: InFlight | None = None) -> None:
    """The keys, the clock and the running requests' tag keys into the XDP program's maps
    (carriers/xdp_setup.publish_keys)."""
    xdp_setup.publish_keys(io, keys.xdp_keys(), cfg.security.max_skew_s,
                           cfg.network.xdp_require_tag, lambda: running_xdp_keys(in_flight))


def failed_start(shm: ShmCarrier | None, code: int) -> NoReturn:
    """End the process of a start that failed, now, with `code`; never returns.

    Returning into the interpreter's shutdown is not safe here: a model load that failed
    can leave behind what keeps a process alive after main returns (a library's non-daemon
    thread, an atexit handler waiting on a device in a bad state), and a daemon that said
    why it cannot start must not then sit there, never ready and never gone, while its
    supervisor and its callers wait. Nothing of a daemon that never served needs an
    orderly teardown: the kernel frees its sockets, memory and device contexts; the one
    thing it leaves on disk, the shared-memory carrier's socket file, is removed first."""
    try:
        if shm is not None:
            shm.close()
    finally:
        logging.shutdown()   # every log line out before the process goes
        sys.stdout.flush()
        os._exit(code)
