"""The engine: continuous batching of many requests over one model, on the engine thread.

Each ``step()`` makes one forward pass over
  * one new token for every running sequence (decode), and
  * prompt chunks of newly admitted requests (chunked prefill), up to a token budget,
so new requests join between decode steps without stalling the others for a whole prompt,
and tokens stream out as soon as they are sampled. No scheduler process: the engine thread
(engine_thread.py) calls submit/step; the I/O thread only ever sets a request's
`CancelFlag`.

What happens to a request is reported as typed events (request.py) through `emit`: text,
done (FinishReason, Usage, Timings) or failed (ErrorCode). The engine never touches sockets.

Logprobs are asked of the model only for the rows of requests that want them, and a step
with no such row is launched exactly as before. A token's entries are encoded here, where
the tokenizer is, and held with the request until the text they belong to goes out: the
detokenizer and the stop-string rule may hold a token's text back, and a client reading
`logprobs` next to the text should find each token no later than its text. What is still
held when the request ends goes out with the tail, before DONE; EOS gets no entry (it is
no part of the answer).

Structured output: a request with a constraint (a JSON schema, any JSON object) gets a
matcher when it is submitted, from a grammar compiled once per distinct schema and cached
(gpu/grammar.py); this runs on the engine thread, never the I/O thread, and a schema that
cannot be compiled or satisfied is refused there like a prompt over the context (a request
that never started, MALFORMED, with the reason). Each step the constrained rows' allowed
tokens go to the sampler as bit masks (a step with none is launched as before), and the
sampled token advances the matcher. When the grammar is complete and allows nothing more,
the request ends there (stop, as at EOS) rather than spend a step to sample the only token
left. With overlap a constrained row waits a step instead of taking its token from the
device: its next mask depends on that token.

Admission reserves the KV blocks for prompt + max_tokens up front (the one context rule,
gpu/context_rule.check_context), so a request that was accepted can never fail later for
lack of memory; one that doesn't fit yet waits. An engine holds at most `capacity` =
max_running + max_waiting requests (running or waiting): the I/O thread refuses the next one
before it hands it over (OVERLOADED, a request that never started), so the refusal in
`submit` is a backstop that the daemon never reaches (see `submit`).

Overlap (a model whose ``overlaps`` is True: the CUDA backend). Step N+1 is planned, staged
and queued before step N's tokens are read back: a sequence whose last token is still on the
device takes it from there (StepInput.from_prev). Then step N's tokens are emitted while
step N+1 runs. A sequence that finishes at step N (EOS, a stop string, max_tokens) has
already been given one speculative token in step N+1; that token is thrown away, and its KV
slot lies past the positions anyone reads (the reservation has room for it). The tokens and
the KV of the positions kept are those of the plain path (tests/test_cuda_sim.py).
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from zerolayer.gpu.context_rule import check_context
from zerolayer.gpu.drafting import DraftLength, lookup, speculates
from zerolayer.gpu.errors import KVCacheFullError
from zerolayer.gpu.grammar import Grammars, mask_words
from zerolayer.gpu.model_api import Draw, Model, PendingTokens, StepInput
from zerolayer.gpu.ops.logprobs import RowLogprobs
from zerolayer.gpu.ops.penalties import PenaltyState
from zerolayer.gpu.prefix_cache import PrefixCache
from zerolayer.gpu.stopping import StopChecker
from zerolayer.gpu.tokenizer import IncrementalDetokenizer, Tokenizer
from zerolayer.protocol.errors import ErrorCode, OverloadedError
from zerolayer.protocol.logprobs import encode_position
from zerolayer.protocol.sampling_params import SamplingParams
from zerolayer.protocol.wire import FinishReason, Timings, Usage

from . import engine_capacity
from .request import Admitted, CancelReason, DoneEvent, EngineEvent, FailedEvent, TextEvent

if TYPE_CHECKING:
    from zerolayer.gpu.draft_model import DraftModel, DraftSeq
    from zerolayer.gpu.grammar import Matcher
    from zerolayer.gpu.kv_cache import Sequence

Emit = Callable[[EngineEvent], None]


@dataclass(eq=False)
class Run:
    """The engine's record of one request, from submit to its end: made when the engine
    takes it (tokenized, within the context), dropped when it ends. Only the engine thread
    reads or writes it; the I/O side hears of it through events. Its KV sequence `seq`
    holds no blocks while it waits, and belongs to the prefix cache or the arena once it is
    `done` (nothing reads it then). `matcher`, `spec`, `draft` and `draft_seq` are None
    where the request has no constraint, does not draft, or drafted nothing this step."""
    req: Admitted
    prompt_ids: npt.NDArray[np.int32]
    tokenize_us: int
    seq: Sequence
    detok: IncrementalDetokenizer
    stops: StopChecker
    rng: np.random.Generator
    penalty: PenaltyState
    matcher: Matcher | None = None        # its constraint's state (structured output)
    spec: DraftLength | None = None       # speculative decoding's draft length
    prefilled: int = 0
    cached: int = 0                       # prompt positions reused from the prefix cache
    tokens: list[int] = field(default_factory=list)
    pending_row: int = -1                 # its token's row in the step in flight (overlap)
    pending_step: int = 0                 # ... and that step's number
    kv_step: int = 0                      # the last step that wrote its KV (prefix entries)
    lp_held: list[tuple[bytes, ...]] = field(default_factory=list)  # logprob entries of
                                          # tokens whose text is not out yet
    draft: npt.NDArray[np.int32] | None = None  # the tokens guessed in the step in flight
    draft_seq: DraftSeq | None = None     # its sequence in the draft model's KV (if one)
    t_admit: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    step_max: float = 0.0                 # slowest gap between two tokens (jitter)
    done: bool = False

    @property
    def params(self) -> SamplingParams:
        return self.req.params


@dataclass(eq=False)
class Batch:
    """One launched step: its requests (one per input) and which had a logit row."""
    owners: list[Run]
    with_logits: list[Run]
    pending: PendingTokens
    n_tokens: int
    step: int
    logprobs: bool = False  # some row asked: pending.logprobs() has them


class Engine:
    def __init__(self, model: Model, tokenizer: Tokenizer, *, emit: Emit, max_running: int = 16,
                 max_waiting: int = 256, step_tokens: int = 256, prefix_entries: int = 4,
                 overlap: bool | None = None, speculative: bool = True,
                 drafter: DraftModel | None = None, speculative_max_batch: int = 0):
        self.model = model
        self.tok = tokenizer
        self.emit = emit
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.step_tokens = step_tokens
        self.overlap = model.overlaps if overlap is None else (overlap and model.overlaps)
        # drafts need each checked position's token before the next step is planned: a model
        # that overlaps steps decodes plainly
        self.speculative = (speculative and not self.overlap
                            and getattr(model, "verifies_drafts", False))
        # a draft model, when one is named, guesses for every drafting request; without one
        # the guesses are lookups in the request's own text (_draft_with_model says why not
        # both)
        self.drafter = drafter if self.speculative else None
        # a step drafts only while at most this many requests decode in it (0: any number):
        # a guess is nearly free where a step waits on the weight bytes, as at batch 1, but in
        # a big batch its row costs compute the other requests' rows are already using
        self.speculative_max_batch = speculative_max_batch
        self.prefix = PrefixCache(model.arena, max_entries=prefix_entries)
        self.vocab: int = model.cfg.vocab  # type: ignore[attr-defined]  # (Model.cfg: object)
        self.grammars = Grammars(tokenizer, self.vocab)  # grammars compiled on first use
        self.waiting: deque[Run] = deque()
        self.running: list[Run] = []
        self._inflight: Batch | None = None
        self.steps = 0
        self.forward_passes_tokens = 0  # tokens run through the model, for tests and metrics
        self.drafted_tokens = 0         # speculative decoding: tokens guessed, and kept
        self.accepted_tokens = 0
        self.draft_failures = 0         # draft-model passes that raised (those steps: no drafts)
        self.undrafted_steps = 0        # steps that did not draft: too many requests decoding

    # ---- called by the engine thread -----------------------------------------------------
    @property
    def capacity(self) -> int:
        """Requests this engine holds at most, running and waiting together."""
        return engine_capacity.capacity(self.max_running, self.max_waiting)

    def submit(self, req: Admitted, prompt_ids: npt.ArrayLike, tokenize_us: int = 0) -> Run:
        """Queue a request, its prompt tokenized; returns its run record. Raises
        ContextOverflowError, OverloadedError or (a constraint that cannot be compiled)
        SchemaError, nothing queued.

        The daemon's I/O thread hands an engine a request only while fewer than `capacity`
        of the requests it handed are unfinished on its side. Every request held here that
        is not cancelled is one of those (a request the engine ended is gone from here
        before the I/O thread hears of it; one the I/O thread ended early was cancelled
        first), so once the cancelled ones are reaped the OverloadedError below cannot
        happen under the daemon. It stays for the engine's other callers."""
        ids = np.asarray(prompt_ids, np.int32)
        if len(ids) == 0:
            raise ValueError("empty prompt (a request is submitted tokenized)")
        p = req.params
        check_context(len(ids), p.max_tokens, self.model.max_seq_len)
        if len(self.waiting) + len(self.running) >= self.capacity:
            self._reap_cancelled()  # what the next step would free anyway
        held = len(self.waiting) + len(self.running)
        if held >= self.capacity:
            raise OverloadedError(engine_capacity.full_text(held, self.max_running,
                                                            self.max_waiting))
        run = Run(req, ids, tokenize_us, self.model.new_sequence(), self.tok.detokenizer(),
                  StopChecker(p.stop),
                  np.random.default_rng(p.seed), PenaltyState.of(p, ids),
                  matcher=(self.grammars.matcher(p.constraint) if p.constraint is not None
                           else None),
                  spec=DraftLength() if self.speculative and speculates(p) else None)
        self.waiting.append(run)
        return run

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._inflight)

    def step(self) -> None:
        """Plan and launch one step; complete the step before it (overlap) or this one."""
        self._reap_cancelled()
        self._admit()
        batch = self._launch() if self.running else None
        done, self._inflight = (self._inflight, batch) if self.overlap else (batch, None)
        if done is not None:
            self._complete(done)
        self.running = [r for r in self.running if not r.done]

    # ---- internals -----------------------------------------------------------------------
    def _launch(self) -> Batch | None:
        inputs: list[StepInput] = []
        owners: list[Run] = []
        budget = self.step_tokens
        drafts = self._drafts_this_step()
        if drafts and self.drafter is not None:
            self._draft_with_model(budget)
        for r in self.running:  # decodes first: they are what users are waiting on
            if r.prefilled == len(r.prompt_ids):
                if r.pending_row >= 0:  # its last token is still on the device (overlap)
                    if r.penalty.active or r.matcher is not None:
                        continue  # its penalties, its mask, depend on that token: a step later
                    inputs.append(StepInput(r.seq, np.zeros(1, np.int32), from_prev=r.pending_row))
                else:
                    if drafts and self.drafter is None:
                        r.draft = self._draft(r, budget)
                    elif r.draft is None:
                        r.draft = np.zeros(0, np.int32)
                    toks = np.concatenate(([r.tokens[-1]], r.draft)).astype(np.int32)
                    inputs.append(StepInput(r.seq, toks, every_logit=len(toks) > 1))
                owners.append(r)
                budget -= len(inputs[-1].tokens)
        for r in self.running:  # then prompt chunks, oldest first
            left = len(r.prompt_ids) - r.prefilled
            if left and budget > 0:
                n = min(left, budget)
                chunk = r.prompt_ids[r.prefilled:r.prefilled + n]
                inputs.append(StepInput(r.seq, chunk, logits=(n == left)))
                owners.append(r)
                r.prefilled += n
                budget -= n
        if not inputs:
            return None
        with_logits = [r for inp, r in zip(inputs, owners) if inp.logits]
        # a row per position checked: a request with a draft has 1 + len(draft) of them
        rows = [r for inp, r in zip(inputs, owners) if inp.logits
                for _ in range(len(inp.tokens) if inp.every_logit else 1)]
        # one draw per logit row, from each request's own seeded generator
        draws = [Draw(r.params.temperature, r.params.top_k, r.params.top_p, r.rng.random())
                 for r in rows]
        # (a request with penalties, a mask or logprobs never drafts: one row each)
        penalties = ([r.penalty.spec() for r in rows]
                     if any(r.penalty.active for r in with_logits) else None)
        lps = ([r.params.top_logprobs if r.params.logprobs else -1 for r in rows]
               if any(r.params.logprobs for r in with_logits) else None)
        masks = self._masks(rows)
        extra = {k: v for k, v in (("logprobs", lps), ("masks", masks)) if v is not None}
        try:  # sampled where the logits are
            pending = self.model.launch_tokens(inputs, draws, penalties, **extra)
        except Exception as e:  # never let one bad step take the daemon down
            for r in owners:
                self._finish_error(r, ErrorCode.INTERNAL, f"forward pass failed: {e}")
            return None
        self.steps += 1
        for row, r in enumerate(with_logits):  # (rows = with_logits here: overlap never drafts)
            r.pending_row, r.pending_step = row, self.steps
        for r in owners:
            r.kv_step = self.steps
        n_tokens = sum(len(i.tokens) for i in inputs)
        self.forward_passes_tokens += n_tokens
        return Batch(owners, with_logits, pending, n_tokens, self.steps, lps is not None)

    def _masks(self, rows: list[Run]) -> list | None:
        """The constrained rows' allowed next tokens (None for the others); None when no
        row is constrained."""
        if all(r.matcher is None for r in rows):
            return None
        n = sum(r.matcher is not None for r in rows)
        buf = np.empty((n, mask_words(self.grammars.vocab)), np.uint32)
        out: list = []
        k = 0
        for r in rows:
            if r.matcher is None:
                out.append(None)
            else:
                r.matcher.fill(buf[k])
                out.append(buf[k])
                k += 1
        return out

    def _complete(self, b: Batch) -> None:
        """Emit a step's tokens. A step that failed on the device (wait raises) emits none:
        its requests end with INTERNAL (retryable) and their sequences are released, and the
        prefix entries it or a later step wrote (a sequence that finished while it was in
        flight) are dropped. The step queued behind it fails its own wait the same way when
        its turn comes (CudaModel judges each step by the kernel that ran it)."""
        try:
            tokens = b.pending.wait()
        except Exception as e:  # noqa: BLE001 - a failed device step fails its requests
            self.prefix.drop_written_since(b.step)
            for r in b.owners:
                self._finish_error(r, ErrorCode.INTERNAL, f"forward pass failed: {e}")
            return
        now = time.monotonic()
        lps = b.pending.logprobs() if b.logprobs else None
        row = 0
        for r in b.with_logits:
            if r.pending_step == b.step:  # not already given a next token in a newer step
                r.pending_row = -1
            draft, r.draft = r.draft, None
            if draft is not None and len(draft):
                row = self._verified(r, draft, tokens, row, now)
                continue
            if not r.done:  # (else finished or cancelled meanwhile: a token past the end, dropped)
                self._emit_token(r, int(tokens[row]), now, lps[row] if lps is not None else None)
            row += 1

    # ---- speculative decoding (gpu/drafting.py) --------------------------------------------
    def _drafts_this_step(self) -> bool:
        """Whether this step drafts: speculation is on, and speculative_max_batch allows the
        number of requests decoding in it."""
        if not self.speculative:
            return False
        limit = self.speculative_max_batch
        if limit and sum(1 for r in self.running if r.prefilled == len(r.prompt_ids)) > limit:
            self.undrafted_steps += 1
            return False
        return True

    def _draft_len(self, r: Run, budget: int) -> int:
        """How many tokens r may guess this step: what its DraftLength wants, short enough
        that every position it writes lies inside r's KV reservation (prompt + max_tokens:
        at most max_tokens - len(tokens) - 1 guesses) and the step's budget."""
        if r.spec is None:
            return 0
        return min(r.spec.want(), r.params.max_tokens - len(r.tokens) - 1, budget - 1)

    @staticmethod
    def _text(r: Run) -> npt.NDArray[np.int32]:
        prompt = r.prompt_ids
        assert prompt is not None
        return np.concatenate((prompt, np.asarray(r.tokens, np.int32))).astype(np.int32)

    def _draft(self, r: Run, budget: int) -> npt.NDArray[np.int32]:
        """The tokens to check after r's last one this step: a guess from its own text."""
        k = self._draft_len(r, budget)
        if k <= 0:
            return np.zeros(0, np.int32)
        return lookup(self._text(r), k)

    def _draft_with_model(self, budget: int) -> None:
        """Set r.draft for every decoding request: the draft model's guesses, made for all
        of them in one batch of draft passes (gpu/draft_model.py).

        The model alone, not n-gram lookup first: the draft model continues the text as the
        target would, copying included (a same-family model copies where the target copies),
        so lookup adds little where a draft model exists, and the two guessers' acceptance
        rates differ so much that one DraftLength cannot track both: after a lookup's
        rejected guess on free text it would pause the model's drafts too. Each k is bounded
        as if every earlier request's draft were full, so the step's budget holds."""
        drafter = self.drafter
        assert drafter is not None
        owners: list[Run] = []
        jobs: list[tuple[DraftSeq, npt.NDArray[np.int32], int]] = []
        for r in self.running:
            prompt = r.prompt_ids
            assert prompt is not None
            if r.prefilled != len(prompt) or r.pending_row >= 0:
                continue
            k = self._draft_len(r, budget)
            budget -= 1 + max(k, 0)
            r.draft = None
            if k > 0:
                if r.draft_seq is None:
                    r.draft_seq = drafter.new_state()
                owners.append(r)
                jobs.append((r.draft_seq, self._text(r), k))
        if not jobs:
            return
        try:
            drafts = drafter.propose(jobs)
        except Exception:  # noqa: BLE001 - a draft is optional: this step decodes plainly
            self.draft_failures += 1
            for r in owners:  # (and their draft sequences start over next time)
                self._drop_draft_seq(r)
            return
        for r, d in zip(owners, drafts):
            r.draft = d

    @staticmethod
    def _drop_draft_seq(r: Run) -> None:
        if r.draft_seq is not None:
            r.draft_seq.release()
            r.draft_seq = None

    def _verified(self, r: Run, draft: npt.NDArray[np.int32],
                  tokens: npt.NDArray[np.int32], row: int, now: float) -> int:
        """Emit what a drafted step decided for r; returns its next row.

        Row j sampled the token after the last token and the first j guesses, with its own
        draw, exactly as a plain step at that position would. So the guesses are kept while
        each equals the token its row sampled, and the first row that disagrees gives the
        token the plain decoder would have emitted there: greedy, the same tokens; sampled,
        the same distribution (for a guess that is a single token, accepting it when the
        draw picks it and otherwise keeping the draw is the standard rejection rule). The
        K/V written for the rejected guesses is forgotten by shortening the sequence: those
        positions lie past its length, so nothing reads them before they are overwritten,
        and the prefix cache stores only positions below the length."""
        k = len(draft)
        if r.done or r.spec is None:  # cancelled meanwhile: nothing to keep
            return row + k + 1
        got = tokens[row:row + k + 1]
        a = int(np.argmin(np.append(got[:k] == draft, False)))  # guesses kept
        r.seq.length -= k - a
        r.spec.update(k, a)
        self.drafted_tokens += k
        self.accepted_tokens += a
        for tok in got[:a + 1]:
            if r.done:  # EOS, a stop string or max_tokens among them: the rest is dropped
                break
            self._emit_token(r, int(tok), now)
        return row + k + 1

    def _reap_cancelled(self) -> None:
        for r in [r for r in self.waiting if r.req.cancel.reason is not None]:
            self.waiting.remove(r)
            self._finish(r, FinishReason.CANCELLED)
        for r in self.running:
            if r.req.cancel.reason is not None and not r.done:
                self._finish(r, FinishReason.CANCELLED)
        self.running = [r for r in self.running if not r.done]

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running:
            r = self.waiting[0]
            while True:
                try:  # (all or nothing: a refused reserve takes no block)
                    r.seq.reserve(len(r.prompt_ids) + r.params.max_tokens)
                    break
                except KVCacheFullError:
                    if not self.prefix.evict_one():  # cached prefixes go first
                        return  # wait for a running request to free its blocks
            self.waiting.popleft()
            r.cached = r.prefilled = self.prefix.reuse(r.prompt_ids, r.seq)
            r.t_admit = time.monotonic()
            self.running.append(r)

    def _emit_token(self, r: Run, tok: int, now: float,
                    lp: RowLogprobs | None = None) -> None:
        p = r.params
        if not r.tokens:
            r.t_first = now
        elif r.t_last:
            r.step_max = max(r.step_max, now - r.t_last)
        r.t_last = now
        if tok in self.tok.eos_ids:
            return self._finish(r, FinishReason.STOP)
        r.tokens.append(tok)
        r.penalty.push(tok)
        if r.matcher is not None and not r.matcher.advance(tok):
            if r.matcher.gave_up:  # a limit of the grammar engine, reached by this schema
                return self._finish_error(r, ErrorCode.MALFORMED,
                                          "response_format: the grammar engine reached a "
                                          "limit on this schema", detail=r.matcher.error)
            return self._finish_error(r, ErrorCode.INTERNAL,
                                      f"constrained decoding: token {tok} refused",
                                      detail=r.matcher.error)
        if lp is not None:
            r.lp_held.append(self._position(tok, lp))
        text = r.stops.push(r.detok.push(tok))
        if text:
            self.emit(TextEvent(r.req, text, 1, self._take_held(r), r.cached))
        if r.stops.stopped or (r.matcher is not None and r.matcher.stopped):
            return self._finish(r, FinishReason.STOP)
        if len(r.tokens) >= p.max_tokens:
            return self._finish(r, FinishReason.LENGTH)

    def _position(self, tok: int, lp: RowLogprobs) -> tuple[bytes, ...]:
        """A sampled token's logprob entries."""
        tb = self.tok.token_bytes
        return encode_position(tok, lp.logprob, tb(tok),
                               [(int(i), float(v), tb(int(i)))
                                for i, v in zip(lp.top_ids, lp.top_logprobs)])

    @staticmethod
    def _take_held(r: Run) -> tuple[tuple[bytes, ...], ...]:
        held = tuple(r.lp_held)
        r.lp_held.clear()
        return held

    def _release(self, r: Run) -> None:
        """It ended: its KV goes to the prefix cache, which may serve the next prompt that
        starts the same way (the positions written: the prompt as far as prefilled, then the
        tokens fed back; a cancelled or speculative step's extra slot is past these)."""
        r.done = True
        self._drop_draft_seq(r)
        fed = np.concatenate([r.prompt_ids[:r.prefilled], np.asarray(r.tokens, np.int32)])
        self.prefix.store(r.seq, fed, written_by=r.kv_step)

    def _finish(self, r: Run, reason: FinishReason) -> None:
        if reason is not FinishReason.CANCELLED:
            tail = r.stops.push(r.detok.flush()) + r.stops.flush()
            if tail or r.lp_held:
                self.emit(TextEvent(r.req, tail, 0, self._take_held(r), r.cached))
        # A cancelled or closed-early stream keeps its prompt's KV too: the same prompt
        # again (a client retrying, or coming back) skips its prefill.
        self._release(r)
        end = time.monotonic()
        first = r.t_first or end
        n = len(r.tokens)
        us = lambda s: max(0, int(s * 1e6))  # noqa: E731
        decode = (r.t_last or first) - first
        # total_us and ingress_us are the I/O side's: it alone sees receive to DONE sent
        # queue: admitted (body complete) -> first scheduled, less the tokenization in it, so
        # that ingress, queue, tokenize, prefill and decode are disjoint stages
        t = Timings(
            queue_us=max(0, us((r.t_admit or end) - r.req.received_at) - r.req.ingress_us
                         - r.tokenize_us),
            prefill_us=us(first - (r.t_admit or end)),
            decode_per_token_us=us(decode / (n - 1)) if n > 1 else 0,
            tokenize_us=r.tokenize_us,
            decode_us=us(decode),
            decode_step_max_us=us(r.step_max),
        )
        spec = r.spec
        stopped_by = r.stops.matched if reason is FinishReason.STOP else None
        self.emit(DoneEvent(r.req, reason, Usage(len(r.prompt_ids), r.cached, n), t,
                            spec.drafted if spec else 0, spec.accepted if spec else 0,
                            r.params.stop.index(stopped_by) + 1 if stopped_by is not None else 0))

    def _finish_error(self, r: Run, code: ErrorCode, msg: str, detail: str = "") -> None:
        if r.done:
            return
        r.done = True
        self._drop_draft_seq(r)
        r.seq.release()
        if r in self.waiting:
            self.waiting.remove(r)
        self.emit(FailedEvent(r.req, code, msg, detail=detail))


__all__ = ["Engine", "Batch", "Run", "CancelReason"]  # CancelReason: what the I/O thread sets
