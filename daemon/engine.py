"""The engine loop: continuous batching of many requests over one model, in the daemon's thread.

Each ``step()`` makes one forward pass over
  * one new token for every running sequence (decode), and
  * prompt chunks of newly admitted requests (chunked prefill), up to a token budget,
so new requests join between decode steps without stalling the others for a whole prompt,
and tokens stream out as soon as they are sampled. No scheduler process, no locks: the
network loop calls submit/cancel/step from one thread.

Admission reserves the KV blocks for prompt + max_tokens up front, so a request that was
accepted can never fail later for lack of memory; one that doesn't fit yet waits (and the
wait queue is bounded: past it, OVERLOADED).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from zerolayer.gpu.errors import ContextOverflowError, KVCacheFullError
from zerolayer.gpu.generate import SamplingParams
from zerolayer.gpu.kv_cache import Sequence
from zerolayer.gpu.model import LlamaModel, StepInput
from zerolayer.gpu.prefix_cache import PrefixCache
from zerolayer.gpu.stopping import StopChecker
from zerolayer.gpu.tokenizer import IncrementalDetokenizer, Tokenizer

from .errors import OverloadedError
from .wire import Timings, Usage


@dataclass(eq=False)
class EngineRequest:
    key: object                     # opaque to the engine: the daemon's (key id, request id)
    prompt_ids: np.ndarray
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)
    # state, owned by the engine
    seq: Sequence | None = None
    prefilled: int = 0
    cached: int = 0                 # prompt positions reused from the prefix cache
    tokens: list[int] = field(default_factory=list)
    detok: IncrementalDetokenizer | None = None
    stops: StopChecker | None = None
    rng: np.random.Generator | None = None
    cancelled: bool = False
    t_admit: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    step_max: float = 0.0           # slowest gap between two tokens (jitter)
    done: bool = False


# sinks: on_text(req, text, n_tokens), on_done(req, finish_reason, usage, timings),
#        on_error(req, code, message)
TextSink = Callable[[EngineRequest, str, int], None]
DoneSink = Callable[[EngineRequest, str, Usage, Timings], None]
ErrorSink = Callable[[EngineRequest, str, str], None]


class Engine:
    def __init__(self, model: LlamaModel, tokenizer: Tokenizer, *, on_text: TextSink,
                 on_done: DoneSink, on_error: ErrorSink, max_running: int = 16,
                 max_waiting: int = 256, step_tokens: int = 256, prefix_entries: int = 4):
        self.model = model
        self.tok = tokenizer
        self.on_text, self.on_done, self.on_error = on_text, on_done, on_error
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.step_tokens = step_tokens
        self.prefix = PrefixCache(model.arena, max_entries=prefix_entries)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.steps = 0
        self.forward_passes_tokens = 0  # tokens run through the model, for tests and metrics

    # ---- called by the network loop ------------------------------------------------------
    def submit(self, req: EngineRequest) -> None:
        """Queue a request. Raises ContextOverflowError or OverloadedError (nothing queued)."""
        need = len(req.prompt_ids) + req.params.max_tokens
        if need > self.model.max_seq_len:
            raise ContextOverflowError(need, self.model.max_seq_len)
        if len(self.waiting) >= self.max_waiting:
            raise OverloadedError(f"{len(self.waiting)} requests already waiting")
        req.detok = self.tok.detokenizer()
        req.stops = StopChecker(req.params.stop)
        req.rng = np.random.default_rng(req.params.seed)
        self.waiting.append(req)

    def cancel(self, req: EngineRequest) -> None:
        """Stop a request at the next step boundary; its KV blocks are freed then."""
        req.cancelled = True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one iteration -------------------------------------------------------------------
    def step(self) -> None:
        self._reap_cancelled()
        self._admit()
        if not self.running:
            return
        inputs: list[StepInput] = []
        owners: list[EngineRequest] = []
        budget = self.step_tokens
        for r in self.running:  # decodes first: they are what users are waiting on
            if r.prefilled == len(r.prompt_ids):
                inputs.append(StepInput(r.seq, np.array([r.tokens[-1]], np.int32)))
                owners.append(r)
                budget -= 1
        for r in self.running:  # then prompt chunks, oldest first
            left = len(r.prompt_ids) - r.prefilled
            if left and budget > 0:
                n = min(left, budget)
                chunk = r.prompt_ids[r.prefilled:r.prefilled + n]
                inputs.append(StepInput(r.seq, chunk, logits=(n == left)))
                owners.append(r)
                r.prefilled += n
                budget -= n
        # one draw per logit row, from each request's own seeded generator
        draws = [(r.params.temperature, r.params.top_k, r.params.top_p, r.rng.random())
                 for inp, r in zip(inputs, owners) if inp.logits]
        try:
            tokens = self.model.step_tokens(inputs, draws)  # sampled where the logits are
        except Exception as e:  # never let one bad step take the daemon down
            for r in owners:
                self._finish_error(r, "INTERNAL", f"forward pass failed: {e}")
            return
        self.steps += 1
        self.forward_passes_tokens += sum(len(i.tokens) for i in inputs)
        now = time.monotonic()
        row = 0
        for inp, r in zip(inputs, owners):
            if not inp.logits:
                continue
            self._emit_token(r, int(tokens[row]), now)
            row += 1
        self.running = [r for r in self.running if not r.done]

    # ---- internals -----------------------------------------------------------------------
    def _reap_cancelled(self) -> None:
        for r in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(r)
            self._finish(r, "cancelled")
        for r in self.running:
            if r.cancelled and not r.done:
                self._finish(r, "cancelled")
        self.running = [r for r in self.running if not r.done]

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running:
            r = self.waiting[0]
            seq = self.model.new_sequence()
            while True:
                try:
                    seq.reserve(len(r.prompt_ids) + r.params.max_tokens)
                    break
                except KVCacheFullError:
                    if not self.prefix.evict_one():  # cached prefixes go first
                        seq.release()
                        return  # wait for a running request to free its blocks
            self.waiting.popleft()
            r.cached = r.prefilled = self.prefix.reuse(r.prompt_ids, seq)
            r.seq = seq
            r.t_admit = time.monotonic()
            self.running.append(r)

    def _emit_token(self, r: EngineRequest, tok: int, now: float) -> None:
        p = r.params
        if not r.tokens:
            r.t_first = now
        elif r.t_last:
            r.step_max = max(r.step_max, now - r.t_last)
        r.t_last = now
        if tok in self.tok.eos_ids:
            return self._finish(r, "stop")
        r.tokens.append(tok)
        text = r.stops.push(r.detok.push(tok))
        if text:
            self.on_text(r, text, 1)
        if r.stops.stopped:
            return self._finish(r, "stop")
        if len(r.tokens) >= p.max_tokens:
            return self._finish(r, "length")

    def _release(self, r: EngineRequest, keep_prefix: bool = False) -> None:
        r.done = True
        if r.seq is not None:
            if keep_prefix:  # its KV may serve the next prompt that starts the same way
                self.prefix.store(r.seq, np.concatenate([r.prompt_ids, np.asarray(r.tokens, np.int32)]))
            else:
                r.seq.release()
            r.seq = None

    def _finish(self, r: EngineRequest, reason: str) -> None:
        if reason != "cancelled":
            tail = r.stops.push(r.detok.flush()) + r.stops.flush()
            if tail:
                self.on_text(r, tail, 0)
        self._release(r, keep_prefix=reason != "cancelled")
        end = time.monotonic()
        first = r.t_first or end
        n = len(r.tokens)
        us = lambda s: max(0, int(s * 1e6))  # noqa: E731
        decode = (r.t_last or first) - first
        t = Timings(
            queue_us=us((r.t_admit or end) - r.arrival),
            prefill_us=us(first - (r.t_admit or end)),
            decode_per_token_us=us(decode / (n - 1)) if n > 1 else 0,
            total_us=us(end - r.arrival),
            decode_us=us(decode),
            decode_step_max_us=us(r.step_max),
        )
        self.on_done(r, reason, Usage(len(r.prompt_ids), r.cached, n), t)

    def _finish_error(self, r: EngineRequest, code: str, msg: str) -> None:
        if r.done:
            return
        self._release(r)
        if r in self.waiting:
            self.waiting.remove(r)
        self.on_error(r, code, msg)
