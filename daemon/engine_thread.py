"""The engine thread: takes admitted requests from the I/O thread, tokenizes them, runs the
engine's steps, and hands typed events back. It never touches a socket.

    I/O thread ──admissions (Handoff[Submission])──► engine thread
    I/O thread ◄──events (Handoff[EngineEvent])── engine thread

The forward pass runs with the GIL released (every Numba kernel is nogil; on a GPU the
thread sleeps in the driver on the step's event), so while it computes the I/O thread keeps
receiving, verifying, answering PING/ACK/RESEND/CANCEL and sending frames.

The model is loaded, warmed up and run on this thread only (`load` is called first thing in
`run`): Numba's kernel-thread count is per calling thread, and each thread that enters a
parallel region gets an OpenMP team of its own. One team is the point: with more OpenMP
threads alive than CPUs, libgomp stops spinning at barriers and sleeps on a futex at each
of the ~200 parallel regions of a step (measured: a third of the throughput gone).

Tokenization (chat template + BPE) is here, not on the I/O thread: its cost grows with the
request, and the I/O thread's must not. So the engine thread is where a text prompt's length
is first known: each request taken is either accepted (an AcceptedEvent: from then on it is
a model run) or refused as a request that never started (a FailedEvent with started=False:
a text over the context, an id outside the vocabulary), before any step sees it.

The events of a step are queued together and the I/O thread is woken once. The events
queue is bounded; when it is full the engine waits for room (counted), it never drops a
token. An exception that escapes the loop (a bug in the engine, not in one request) ends
the thread with an EngineDied event; the daemon then fails that engine's requests (with one
engine, every request) and exits non-zero when no engine is left.

A daemon may run several of these ([[engines]]), each with its own hand-offs, CPUs, kernel
thread count, KV arena, prefix cache and Engine; `index` tells them apart (thread name,
test hooks).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from zerolayer.gpu.errors import KVCacheFullError
from zerolayer.gpu.generate import encode_prompt
from zerolayer.protocol.errors import ErrorCode, OverloadedError, ZerolayerError

from . import test_hooks
from .engine import Engine
from .handoff import Handoff
from .request import AcceptedEvent, Admitted, EngineDied, EngineEvent, FailedEvent, Submission

IDLE_WAIT_S = 0.5      # an idle engine sleeps on the admissions fd this long at most
FULL_WAIT_S = 0.0005   # back-off while the events queue is full


class EngineThread(threading.Thread):
    """load: called on this thread before anything else; returns the Engine (model loaded
    and warm). Until `ready` is set, `engine` is None; if loading fails, `start_error` holds
    the exception and the thread ends."""

    def __init__(self, load: Callable[[], Engine], admissions: Handoff[Submission],
                 events: Handoff[EngineEvent], *, cpus: set[int] | None = None,
                 log: Callable[[str], None] = print,
                 index: int = 0, name: str = "zerolayer-engine"):
        super().__init__(name=name, daemon=True)
        self.index = index
        self.load = load
        self.engine: Engine | None = None
        self.start_error: BaseException | None = None
        self.admissions = admissions
        self.events = events
        self.cpus = cpus
        self.log = log
        self.ready = threading.Event()
        self.events_full_waits = 0
        self.taken_bytes = 0        # body bytes taken off the admissions queue
        self.waiting_full = 0       # admissions refused OVERLOADED: the wait queue was full
        self.held_requests = 0
        self.held_tokens = 0
        self._stopping = False
        self.beat = time.monotonic()  # the last turn of the loop (sd_notify.Watchdog reads it)
        self._out: list[EngineEvent] = []
        # what the I/O thread reads for metrics: one tuple, replaced whole (atomic)
        self.stats = (0, 0, 0)  # running, waiting, KV blocks held by requests

    def stop(self) -> None:
        self._stopping = True
        self.admissions.wake()

    def run(self) -> None:
        try:
            if self.cpus:
                os.sched_setaffinity(0, self.cpus)  # this thread only (and the kernel
                # threads it starts, which inherit it)
            engine = self.load()
            engine.emit = self._out.append
            self.engine = engine
        except BaseException as e:  # noqa: BLE001 - the daemon reports it and does not start
            self.start_error = e
            self.ready.set()
            return
        self.ready.set()
        try:
            self._loop(engine)
        except BaseException as e:  # noqa: BLE001 - report, never die silently
            msg = f"{type(e).__name__}: {e}"
            self.log(f"engine thread died: {msg}" if self.name == "zerolayer-engine"
                     else f"engine thread died ({self.name}): {msg}")
            self._out.clear()
            self._push(EngineDied(msg))

    def _loop(self, eng: Engine) -> None:
        while not self._stopping:
            self.beat = time.monotonic()
            taken = self._take_admissions(eng)
            self._flush()
            if taken:  # the gauges show what was just accepted, before a step (or a hold)
                self._publish(eng)
            if eng.has_work:
                test_hooks.before_step(self.index)
                eng.step()
                self._flush()
                self._publish(eng)
            else:
                self._publish(eng)
                self.admissions.wait(IDLE_WAIT_S)

    def _take_admissions(self, eng: Engine) -> bool:
        """Submit what the I/O thread handed over; whether there was any. The bodies go
        with this call's locals: the ids are all the engine keeps (a body may be 3 MiB)."""
        taken = self.admissions.drain()
        for sub in taken:
            self._admit(eng, sub)
        return bool(taken)

    def _admit(self, eng: Engine, sub: Submission) -> None:
        req, b = sub.admitted, sub.body
        self.taken_bytes += req.body_bytes  # written by this thread only (memory_bounds.py)
        if req.cancel.reason is not None:
            return  # cancelled (and answered) before it got here
        t0 = time.monotonic()
        try:
            messages = None if b.messages is None else [{"role": m.role, "content": m.content}
                                                        for m in b.messages]
            ids = encode_prompt(eng.tok, eng.vocab, b.prompt, messages, b.token_ids,
                                max_tokens=req.params.max_tokens,
                                max_seq_len=eng.model.max_seq_len)
            run = eng.submit(req, ids, int((time.monotonic() - t0) * 1e6))
        except ZerolayerError as ex:  # the runtime's refusals are the wire's errors
            if isinstance(ex, OverloadedError) and not isinstance(ex, KVCacheFullError):
                self.waiting_full += 1    # the wait queue was full, not the KV arena
            self._refuse(req, ex.code or ErrorCode.INTERNAL, str(ex))
        except ValueError as ex:  # the tokenizer refuses a message, an id outside the
            # vocabulary; a response_format schema (SchemaError) that cannot be used
            self._refuse(req, ErrorCode.MALFORMED, str(ex), getattr(ex, "detail", ""))
        except Exception as ex:  # noqa: BLE001 - one request's bug fails that request
            self._refuse(req, ErrorCode.INTERNAL, f"{type(ex).__name__}: {ex}")
        else:
            self._out.append(AcceptedEvent(req, len(run.prompt_ids), run.tokenize_us))

    def _refuse(self, req: Admitted, code: ErrorCode, message: str, detail: str = "") -> None:
        """Refused before the engine accepted it: no step ever saw it, so it never
        started (no model run, no place in a stream)."""
        self._out.append(FailedEvent(req, code, message, started=False, detail=detail))

    def _flush(self) -> None:
        if self._out:
            for ev in self._out:
                if isinstance(ev, FailedEvent) and ev.detail:  # what the client is not told
                    self.log(f"request failed {ev.code.name}: {ev.message}: "
                             f"{' '.join(ev.detail.split())[:2000]}")
                self._push(ev, wake=False)
            self._out.clear()
            self.events.wake()

    def _push(self, ev: EngineEvent, wake: bool = True) -> None:
        while not self.events.put(ev, wake=wake):
            self.events_full_waits += 1
            self.events.wake()
            time.sleep(FULL_WAIT_S)

    def _publish(self, e: Engine) -> None:
        a = e.model.arena
        self.stats = (len(e.running), len(e.waiting), a.n_blocks - a.free_blocks - e.prefix.blocks)
        # what the requests in the engine hold (memory_bounds.py): O(requests), ~20 µs at
        # the default 272
        self.held_requests = len(e.running) + len(e.waiting)
        self.held_tokens = sum(len(r.prompt_ids) + len(r.tokens)
                               for q in (e.running, e.waiting) for r in q)

