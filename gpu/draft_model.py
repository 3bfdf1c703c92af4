"""Draft tokens for speculative decoding from a second, smaller model (a draft model).

Where the answer does not copy its context, the request's own text has nothing to look up
(gpu/drafting.py). A small model that shares the target's vocabulary can still guess: its
greedy continuation of the request's text is the draft, which the target checks in its
batched step exactly as it checks a lookup (engine.py). The guess never changes the answer:
each checked position's token is the target's own draw there, and the draft only decides
how many positions one step may keep. That holds for sampled output too, because the guess
is a function of the text so far (the draft model's argmax), never of the draws the target
takes for this step.

The draft model runs on the engine thread, between the target's steps, with its own small
KV arena: one draft sequence per drafting request, holding the K/V of a prefix of that
request's text. Each step it is brought up to the request's text (the tokens the target
kept since, in one batched pass, the draft sequences of all drafting requests together)
and then run k - 1 more single-token steps, batched the same way. Guesses the target
rejected are forgotten by shortening the draft sequence to the longest prefix it shares
with the request's text: the positions past that are overwritten before anything reads
them, as the target's own rejected positions are.

A draft model is refused at start unless its vocabulary is the target's, token for token
(`check_vocab`): a draft in another vocabulary guesses ids that mean other text, and
acceptance would collapse without any error to show for it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .errors import ContextOverflowError, KVCacheFullError
from .kv_cache import Sequence
from .model import LlamaModel
from .model_api import Model, StepInput

CATCH_UP_CHUNK = 512  # draft positions per forward call while catching up (bounds activations)


class VocabMismatchError(ValueError):
    """The draft model's vocabulary is not the target's."""


def vocab_digest(meta: dict | None, n_vocab: int) -> str:
    """SHA-256 over the vocabulary size and every token's text, in id order."""
    h = hashlib.sha256(str(n_vocab).encode())
    for t in (meta or {}).get("tokens", ()):
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(4, "little") + b)
    return h.hexdigest()


def check_vocab(target: object, draft: object) -> None:
    """Raises VocabMismatchError unless both models (LlamaModels: their tokenizer metadata
    and config) have the same token count and the same token strings, and the same
    embedding/LM-head size (a GGUF may pad it)."""
    tm: dict = getattr(target, "tokenizer_meta", None) or {"tokens": []}
    dm: dict | None = getattr(draft, "tokenizer_meta", None)
    if dm is None:
        raise VocabMismatchError("the draft model's GGUF has no tokenizer to compare")
    tn, dn = len(tm["tokens"]), len(dm["tokens"])
    tv: int = getattr(getattr(target, "cfg", None), "vocab", 0)
    dv: int = getattr(getattr(draft, "cfg", None), "vocab", 0)
    if (tn, tv) != (dn, dv):
        raise VocabMismatchError(f"the draft model has {dn} tokens (embedding rows {dv}), "
                                 f"the target {tn} ({tv})")
    if vocab_digest(tm, tv) != vocab_digest(dm, dv):
        first = next(i for i, (a, b) in enumerate(zip(tm["tokens"], dm["tokens"])) if a != b)
        raise VocabMismatchError(f"the draft model's token {first} is "
                                 f"{dm['tokens'][first]!r}, the target's "
                                 f"{tm['tokens'][first]!r}: a different vocabulary")


@dataclass(eq=False)
class DraftSeq:
    """One request's draft sequence: the K/V of `fed[:seq.length]`, the tokens it was given."""
    seq: Sequence
    fed: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))

    def release(self) -> None:
        self.seq.release()


class DraftModel:
    """A draft model and its KV arena, driven by the engine thread."""

    def __init__(self, model: LlamaModel, path: str = ""):
        self.model = model
        self.path = path
        self.forward_tokens = 0  # positions run through the draft model (tests, benchmarks)

    @classmethod
    def load(cls, path: str, target: Model, *, max_sequences: int,
             warmup: bool = True) -> DraftModel:
        """Load the GGUF at `path` for drafting against `target`: its context is the
        target's, its arena room for `max_sequences` full contexts (backed lazily, as the
        target's). Raises VocabMismatchError (and the loader's errors) before any warm-up."""
        from .ops.attention import BLOCK_TOKENS
        blocks = max_sequences * -(-target.max_seq_len // BLOCK_TOKENS)
        model = LlamaModel.load(path, max_seq_len=target.max_seq_len, kv_blocks=blocks)
        check_vocab(target, model)
        d = cls(model, path)
        if warmup:  # its kernels (its own quant formats) built before the first request
            s = d.new_state()
            try:
                d.propose([(s, np.zeros(3, np.int32), 2)])
            finally:
                s.release()
            d.forward_tokens = 0
        return d

    def new_state(self) -> DraftSeq:
        return DraftSeq(self.model.new_sequence())

    def propose(self, jobs: list[tuple[DraftSeq, npt.NDArray[np.int32], int]]
                ) -> list[npt.NDArray[np.int32]]:
        """For each (draft sequence, the request's text so far, k): the draft model's k
        greedy next tokens, or none where its sequence cannot hold them (its arena full,
        its context shorter). All jobs advance together: a catch-up pass, then k - 1
        single-token passes over the jobs still short of their k."""
        out = [np.zeros(0, np.int32) for _ in jobs]
        live: list[tuple[int, DraftSeq, npt.NDArray[np.int32]]] = []
        for i, (d, ctx, k) in enumerate(jobs):
            if k <= 0 or len(ctx) == 0:
                continue
            n = self._rewind(d, ctx)
            try:  # room for the catch-up and k - 1 guesses, taken before anything runs
                d.seq.reserve(len(ctx) - n + k - 1)
            except (KVCacheFullError, ContextOverflowError):
                continue
            while len(ctx) - n > CATCH_UP_CHUNK:  # a long catch-up: all but the last chunk
                self._run([(d, ctx[n:n + CATCH_UP_CHUNK])], logits=False)
                n += CATCH_UP_CHUNK
            live.append((i, d, ctx[n:]))
        want = {i: jobs[i][2] for i, _, _ in live}
        while live:
            guesses = self._run([(d, toks) for _, d, toks in live])
            nxt = []
            for (i, d, _), g in zip(live, guesses):
                out[i] = np.append(out[i], np.int32(g))
                if len(out[i]) < want[i]:
                    nxt.append((i, d, out[i][-1:]))
            live = nxt
        return out

    @staticmethod
    def _rewind(d: DraftSeq, ctx: npt.NDArray[np.int32]) -> int:
        """Shorten d to the longest prefix of ctx it holds, leaving at least one token of
        ctx to feed (its logits give the first guess); returns that length."""
        m = min(d.seq.length, len(ctx) - 1)
        diff = np.flatnonzero(d.fed[:m] != ctx[:m])
        n = int(diff[0]) if diff.size else m
        d.seq.length = n
        d.fed = d.fed[:n]
        return n

    def _run(self, feed: list[tuple[DraftSeq, npt.NDArray[np.int32]]],
             logits: bool = True) -> npt.NDArray[np.intp]:
        """One forward pass of the draft model over each sequence's new tokens; the argmax
        of each one's last position (when logits)."""
        inputs = [StepInput(d.seq, np.ascontiguousarray(t, np.int32), logits=logits)
                  for d, t in feed]
        rows = self.model.step(inputs)
        for d, t in feed:
            d.fed = np.concatenate((d.fed, np.asarray(t, np.int32)))
        self.forward_tokens += sum(len(t) for _, t in feed)
        return np.argmax(rows, axis=1) if logits else np.zeros(0, np.intp)
