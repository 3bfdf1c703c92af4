"""zerolayerd: the daemon. One pinned thread owns the rings/socket, the protocol and the engine.

    loop:  AF_XDP RX ring (xdp_io) and recvmmsg (udp_io) → Ingress (verify, reassemble)
           → result cache (idempotency) → tokenize → Engine.submit
           Engine.step (one forward pass for every running request)
           → TOKEN / DONE / ERROR frames → result cache → back the way the request came:
             written into UMEM TX frames for an AF_XDP peer, sendmmsg for a UDP address

There is no second thread and no lock: while a step runs, datagrams wait in the socket
buffer (sized for a 1 MiB request), and they are read as soon as it ends. Frames are
stored in the result cache before they are sent, so RESEND and duplicate requests are
served from there and never run the model again.
"""
from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass

import numpy as np

from zerolayer.gpu.errors import RuntimeModelError
from zerolayer.gpu.generate import encode_prompt

from . import config as config_mod
from .auth import KeyFileError, KeyStore, ReplayConfig, ReplayGuard
from .engine import Engine, EngineRequest
from .errors import ERROR_INFO, ErrorCode, OverloadedError, ZerolayerError
from .ingress import ControlRequest, Ingress, InvokeRequest, Rejected, check_context
from .metrics import Metrics
from .reassembly import Reassembler
from .result_cache import EntryStatus, ResultCache
from .udp_io import BatchedUDP
from .xdp_frames import Peer
from .wire import (MAX_TEXT, NO_SEQ, FinishReason, MsgType, ResponseSigner, RunState, ServerState,
                   Timings, Usage, split_utf8)

HOUSEKEEPING_S = 0.25
# Receive batches drained before each engine step: enough that a flood of garbage can't fill
# the socket buffer between two steps and push out a client's keepalives, bounded so that a
# flood can't starve the running requests either.
MAX_RX_BATCHES = 32
RESEND_LIMIT = 64  # frames per RESEND answer (docs/PROTOCOL.md)


def log(msg: str) -> None:
    print(f"zerolayerd: {msg}", file=sys.stderr, flush=True)


@dataclass(eq=False)
class Running:
    """The daemon's handle on one request: where its frames go and how they are signed."""
    key: tuple[int, bytes]
    addr: tuple
    signer: ResponseSigner
    run_id: int
    received_at: float
    tokenize_us: int = 0
    engine_req: EngineRequest | None = None
    cancel_reason: str = ""   # set when the daemon (not the client) stops it: lease, drain
    ingress_us: int = 0
    seq: int = 0


class Daemon:
    def __init__(self, cfg: config_mod.DaemonConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.state = ServerState.WARMING
        self.out: list[tuple[bytes, tuple]] = []
        self._stop_at: float | None = None
        self._reload = False
        self._draining = False

    # ---- start-up ------------------------------------------------------------------------
    def start(self) -> None:
        c = self.cfg
        self._pin_cpus()
        self.keys = KeyStore(c.security.keys_file)  # refuses a group/world-readable file
        self.replay = ReplayGuard(ReplayConfig(skew_s=c.security.max_skew_s,
                                               capacity=c.security.nonce_capacity,
                                               per_key=c.security.nonce_per_key))
        self.ingress = Ingress(self.keys, self.replay, Reassembler(), max_seq_len=c.model.max_seq_len)
        self.cache = ResultCache(ttl_s=c.cache.ttl_s, max_entries=c.cache.max_entries,
                                 max_bytes=c.cache.max_bytes)
        self.ingress.is_known = lambda key: self.cache.get(key) is not None
        self._load_model()
        self.sock = self._open_socket()
        self.udp = BatchedUDP(self.sock, batch=c.network.batch)
        self.xdp = self._open_xdp()
        self.metrics.serve(c.metrics.host, c.metrics.port)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, lambda *_: setattr(self, "_reload", True))
        self.state = ServerState.READY
        host, port = self.sock.getsockname()[:2]
        path = "udp" if self.xdp is None else f"xdp on {c.network.interface} + udp fallback"
        log(f"ready on {host}:{port}, ingress {path} "
            f"(metrics {c.metrics.host}:{c.metrics.port or 'off'})")
        _sd_notify(b"READY=1")

    def _pin_cpus(self) -> None:
        c = self.cfg.cpu
        if c.cpus:
            cpus = config_mod.parse_cpus(c.cpus)
            os.sched_setaffinity(0, cpus)
            log(f"pinned to CPUs {sorted(cpus)}")
        if c.sched_fifo:
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(c.sched_fifo))
                log(f"SCHED_FIFO priority {c.sched_fifo}")
            except PermissionError:
                log("SCHED_FIFO refused (needs CAP_SYS_NICE); running with normal scheduling")

    def _load_model(self) -> None:
        from zerolayer.gpu.generate import Generator
        m = self.cfg.model
        gen = Generator.load(m.path or None, threads=m.threads or None, max_seq_len=m.max_seq_len,
                             warmup=self.cfg.lifecycle.warmup, log=log)
        e = self.cfg.engine
        if e.kv_blocks:
            from zerolayer.gpu.kv_cache import KVArena
            cfgm = gen.model.cfg
            gen.model.arena = KVArena(cfgm.n_layer, cfgm.n_kv, cfgm.head_dim, e.kv_blocks,
                                      gen.model.max_seq_len)
        self.model, self.tokenizer = gen.model, gen.tokenizer
        from zerolayer.gpu import backend
        self.metrics.backend.labels(backend.NAME, getattr(self.model, "device", "cpu")).set(1)
        self.engine = Engine(self.model, self.tokenizer, on_text=self._on_text, on_done=self._on_done,
                             on_error=self._on_engine_error, max_running=e.max_running,
                             max_waiting=e.max_waiting, step_tokens=e.step_tokens)

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

    def _open_xdp(self):
        """The AF_XDP fast path (network.ingress xdp|auto). The UDP socket stays open either
        way: it serves whatever the XDP program passes on (no socket registered yet, another
        device, a host without XDP), so both paths always answer."""
        n = self.cfg.network
        if n.ingress not in ("udp", "xdp", "auto"):
            raise ValueError(f"network.ingress must be udp, xdp or auto, not {n.ingress!r}")
        if n.ingress == "udp":
            return None
        if not n.interface:
            if n.ingress == "xdp":
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
            if n.ingress == "xdp":
                raise OSError(f"XDP ingress on {n.interface}: {e}") from e
            log(f"ingress auto: XDP unavailable on {n.interface} ({e}); using udp")
            return None
        log(f"XDP attached to {n.interface} ({n.xdp_attach}), {len(io.socks)} AF_XDP socket(s), "
            f"{'zero-copy' if io.zerocopy else 'copy mode'}; BCC compile (helper process) "
            f"{io.compile_seconds:.2f} s" + (f"; maps pinned in {n.xdp_pin_dir}" if io.pins else ""))
        self.metrics.xdp_attached.set(1)
        return io

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> int:
        next_house = 0.0
        wait_fds = [self.sock] + (self.xdp.fileno_list() if self.xdp else [])
        busy = self.cfg.network.busy_poll
        xdp = self.xdp
        spin = 0
        while True:
            spin += 1
            # With XDP serving, the UDP socket only gets what the program passes on: a
            # busy-polling loop checks it every 8th turn, not paying a syscall per turn.
            poll_udp = xdp is None or not busy or not spin & 7
            for _ in range(MAX_RX_BATCHES):
                batch = self.udp.recv_batch() if poll_udp else []
                more = len(batch) == self.udp.batch
                if xdp is not None:
                    xb = xdp.recv_batch()
                    more = more or len(xb) >= xdp.batch
                    batch += xb
                for data, addr in batch:
                    self._on_datagram(data, addr)
                if not more:
                    break
            if self.out or (xdp is not None and xdp.tx_backlog):
                self._flush()  # ACKs and replies first: a step can take longer than a client waits
            if self.engine.has_work:
                try:
                    self.engine.step()
                except Exception as e:  # noqa: BLE001 - a bug in a callback must not end the daemon
                    self._internal("engine step", e)
                self._flush()
            now = time.monotonic()
            if now >= next_house:
                self._housekeeping(now)
                next_house = now + HOUSEKEEPING_S
            if self._draining and (not self.engine.has_work or now >= self._stop_at):
                break
            if not self.engine.has_work and not self.cfg.network.busy_poll:
                select.select(wait_fds, [], [], HOUSEKEEPING_S)
        self._shutdown()
        return 0

    def _flush(self) -> None:
        if self.xdp is not None and self.xdp.tx_backlog:
            self.xdp.poll_tx()  # frames a busy kernel left on a TX ring last time
        if not self.out:
            return
        if self.xdp is None:
            self.udp.send_batch(self.out)
        else:  # each frame goes back the way its request came
            xo = [item for item in self.out if type(item[1]) is Peer]
            if xo:
                self.xdp.send_batch(xo)
            if len(xo) < len(self.out):
                self.udp.send_batch([item for item in self.out if type(item[1]) is not Peer])
        self.out = []

    def _housekeeping(self, now: float) -> None:
        if self._reload:
            self._reload = False
            ok = self.keys.reload()
            log("keys reloaded" if ok else f"keys reload failed, old keys kept: {self.keys.last_error}")
        self.ingress.tick()
        for e in self.cache.expired_leases(self.cfg.cache.lease_s):
            self._cancel(e.handle, "lease expired: no keepalive from the client")
        self.metrics.running.set(len(self.engine.running))
        self.metrics.waiting.set(len(self.engine.waiting))
        a = self.model.arena
        # blocks held by running requests (cached prefixes are reclaimable, not in use)
        self.metrics.kv_usage.set((a.n_blocks - a.free_blocks - self.engine.prefix.blocks) / a.n_blocks)
        if self.xdp is not None:
            self.metrics.update_xdp(self.xdp)

    def _on_term(self, *_):
        if not self._draining:
            self._draining = True
            self.state = ServerState.DRAINING
            self.ingress.draining = True
            self._stop_at = time.monotonic() + self.cfg.lifecycle.drain_timeout_s
            log(f"draining: {len(self.engine.running) + len(self.engine.waiting)} requests in flight")

    def _cancel(self, h: "Running | None", reason: str) -> None:
        """Stop a request on the daemon's initiative: its client gets ERROR CANCELLED."""
        if h is not None and h.engine_req is not None and not h.cancel_reason:
            h.cancel_reason = reason
            self.engine.cancel(h.engine_req)

    def _shutdown(self) -> None:
        for r in list(self.engine.running) + list(self.engine.waiting):
            self._cancel(r.key, "drain timeout: the daemon is stopping")  # tell, never vanish
        self.engine.step()
        self._flush()
        if self.xdp is not None:
            from .xdp_io import wait_tx_drained
            wait_tx_drained(self.xdp)
            self.xdp.close()  # detach: invoke traffic goes to the kernel stack from here on
        self.sock.close()
        log("stopped")

    # ---- requests ------------------------------------------------------------------------
    def _send(self, frame: bytes, addr: tuple) -> None:
        self.out.append((frame, addr))

    def _internal(self, where: str, e: Exception) -> None:
        self.metrics.errors.labels(ErrorCode.INTERNAL.name).inc()
        log(f"internal error in {where}: {type(e).__name__}: {e}")

    def _on_datagram(self, data: bytes, addr: tuple) -> None:
        try:
            self._handle(data, addr)
        except Exception as e:  # noqa: BLE001 - one bad request must not end the daemon
            self._internal("request handling", e)

    def _handle(self, data: bytes, addr: tuple) -> None:
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

    def _on_invoke(self, req: InvokeRequest, addr: tuple) -> None:
        key = req.cache_key
        e = self.cache.lookup(key)
        if e is not None:  # a duplicate: never run the model twice
            self.cache.touch(key)
            if e.status is EntryStatus.RUNNING:
                self.metrics.idempotent.labels("attached").inc()
                e.handle.addr = addr  # the client may have moved (new socket on retry)
                self._send(e.handle.signer.ack(e.next_seq, e.run_id, RunState.RUNNING,
                                               int(self.cfg.cache.lease_s * 1000)), addr)
            else:
                self.metrics.idempotent.labels("replayed").inc()
            for f in e.frames:
                self._send(f, addr)
            return
        try:
            entry = self.cache.start(key)
        except OverloadedError as ex:
            return self._refuse(req, addr, ErrorCode.OVERLOADED, str(ex))
        h = Running(key, addr, req.signer, entry.run_id, req.received_at)
        entry.handle = h
        t0 = time.monotonic()
        try:
            ids = self._prompt_ids(req)
            h.tokenize_us = int((time.monotonic() - t0) * 1e6)
            p = req.body.params
            check_context(len(ids), p.max_tokens, self.model.max_seq_len)
            er = EngineRequest(h, ids, _sampling(p), arrival=req.received_at)
            self.engine.submit(er)
        except ZerolayerError as ex:
            return self._fail(h, ex.code, str(ex))
        except RuntimeModelError as ex:  # ContextOverflowError, KVCacheFullError from the runtime
            return self._fail(h, ErrorCode[ex.code], str(ex))
        except ValueError as ex:  # the tokenizer refuses a message (e.g. a special token as role)
            return self._fail(h, ErrorCode.MALFORMED, str(ex))
        except Exception as ex:  # noqa: BLE001 - a bug must not kill the loop
            return self._fail(h, ErrorCode.INTERNAL, f"{type(ex).__name__}: {ex}")
        h.engine_req = er
        h.ingress_us = int((time.monotonic() - req.received_at) * 1e6)
        self.metrics.model_runs.inc()
        self._send(h.signer.ack(0, h.run_id, RunState.QUEUED, int(self.cfg.cache.lease_s * 1000)), addr)

    def _prompt_ids(self, req: InvokeRequest) -> np.ndarray:
        b = req.body
        messages = None if b.messages is None else [{"role": m.role, "content": m.content}
                                                    for m in b.messages]
        return encode_prompt(self.tokenizer, self.model.cfg.vocab, b.prompt, messages, b.token_ids)

    def _refuse(self, req: InvokeRequest, addr: tuple, code: ErrorCode, msg: str) -> None:
        self.metrics.errors.labels(code.name).inc()
        self._send(req.signer.error(code, msg), addr)

    def _on_control(self, c: ControlRequest, addr: tuple) -> None:
        if c.msg_type == MsgType.PING:
            self._send(c.signer.pong(c.timestamp_us, time.time_ns() // 1000, self.state), addr)
            return
        e = self.cache.get(c.cache_key)
        if e is None:
            return  # unknown request: stay silent (docs/PROTOCOL.md)
        self.cache.touch(c.cache_key)
        h: Running = e.handle
        if e.status is EntryStatus.RUNNING and h is not None:
            h.addr = addr
        if c.msg_type == MsgType.CANCEL:
            if e.status is EntryStatus.RUNNING and h is not None and h.engine_req is not None:
                self.engine.cancel(h.engine_req)
            return
        # RESEND (or keepalive)
        frames = e.frames_from(c.from_seq, RESEND_LIMIT) if c.from_seq != NO_SEQ else []
        for f in frames:
            self._send(f, addr)
        if not frames:
            state = RunState.RUNNING if e.status is EntryStatus.RUNNING else RunState.FINISHED
            self._send(c.signer.ack(e.next_seq, e.run_id, state, int(self.cfg.cache.lease_s * 1000)), addr)

    # ---- engine callbacks ----------------------------------------------------------------
    def _emit(self, h: Running, make) -> None:
        frame = make(h.seq)
        h.seq += 1
        self.cache.append(h.key, frame)
        self._send(frame, h.addr)

    def _on_text(self, er: EngineRequest, text: str, n_tokens: int) -> None:
        h: Running = er.key
        pieces = split_utf8(text.encode("utf-8"), MAX_TEXT)
        for i, piece in enumerate(pieces):
            n = n_tokens if i == len(pieces) - 1 else 0
            self._emit(h, lambda seq, p=piece, n=n: h.signer.token(seq, h.run_id, p, n))

    def _on_done(self, er: EngineRequest, reason: str, usage: Usage, t: Timings) -> None:
        h: Running = er.key
        now = time.monotonic()
        if h.cancel_reason:  # lease expired or drain timeout: an error, not a cached result
            return self._fail(h, ErrorCode.CANCELLED, h.cancel_reason)
        t = Timings(queue_us=t.queue_us, prefill_us=t.prefill_us,
                    decode_per_token_us=t.decode_per_token_us,
                    total_us=int((now - h.received_at) * 1e6), ingress_us=h.ingress_us,
                    tokenize_us=h.tokenize_us, decode_us=t.decode_us,
                    decode_step_max_us=t.decode_step_max_us)
        fr = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}.get(reason, FinishReason.CANCELLED)
        self._emit(h, lambda seq: h.signer.done(seq, h.run_id, fr, usage, t))
        self.cache.finish(h.key, cacheable=True)
        m = self.metrics
        m.requests.labels(fr.label).inc()
        m.prompt_tokens.inc(usage.prompt_tokens)
        m.generated_tokens.inc(usage.completion_tokens)
        m.e2e.observe(now - h.received_at)
        if er.t_first:
            m.ttft.observe(er.t_first - h.received_at)
        if usage.completion_tokens > 1:
            m.itl.observe(t.decode_per_token_us / 1e6)

    def _on_engine_error(self, er: EngineRequest, code: str, msg: str) -> None:
        self._fail(er.key, ErrorCode[code], msg)

    def _fail(self, h: Running, code: ErrorCode, msg: str) -> None:
        self.metrics.errors.labels(code.name).inc()
        self.metrics.requests.labels("error").inc()
        self._emit(h, lambda seq: h.signer.error(code, msg, seq, h.run_id))
        self.cache.finish(h.key, cacheable=ERROR_INFO[code].cacheable)


def _sampling(p):
    from zerolayer.gpu.generate import SamplingParams
    return SamplingParams(max_tokens=p.max_tokens, temperature=p.temperature, top_k=p.top_k,
                          top_p=p.top_p, seed=p.seed, stop=tuple(p.stop))


def _sd_notify(msg: bytes) -> None:
    """systemd readiness (Type=notify), without a libsystemd dependency."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(msg, path)
        except OSError as e:
            log(f"sd_notify failed: {e}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="zerolayerd", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    config_mod.add_flags(ap)
    args = ap.parse_args(argv)
    try:
        cfg = config_mod.load(args)
        d = Daemon(cfg)
        d.start()
    except (KeyFileError, ValueError, OSError) as e:
        log(f"cannot start: {e}")
        return 2
    except Exception as e:  # noqa: BLE001 - a model error etc.: say it plainly
        log(f"cannot start: {type(e).__name__}: {e}")
        return 2
    return d.run()


if __name__ == "__main__":
    sys.exit(main())
