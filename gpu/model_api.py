"""The model interface the engine and the Generator drive, declared once.

`LlamaModel` (gpu/model.py, Numba CPU kernels) and `CudaModel` (gpu/cuda/forward.py, Numba
CUDA kernels) both satisfy `Model`; nothing else about them is assumed. A step's inputs are
`StepInput`s (one per sequence), flattened by `step_arrays` into a `StepArrays`; a draw for
the sampler is a `Draw`.

`launch_tokens` is the asynchronous form of `step_tokens`: it queues a step and returns a
`PendingTokens` whose `wait()` gives the ids. On the CPU it runs the step at once (`overlaps`
is False); on a GPU it returns while the device works, so the engine can plan and stage the
next step meanwhile. An input may then take its one token from a row of the previous step's
sampled ids, still on the device (`StepInput.from_prev`), which is what lets step N+1 be
queued before step N's tokens have reached the host.

Logprobs (gpu/ops/logprobs.py) are asked per logit row: `logprobs[r]` is the number of
alternatives row r wants (0..20), or -1 for none. A step in which no row asks is given
`logprobs=None` and does exactly what it did without them; `PendingTokens.logprobs()` then
answers None for every row.

Token masks (constrained decoding, gpu/grammar.py) are given per logit row too: `masks[r]`
is row r's allowed tokens as uint32 words (one bit per id, gpu/ops/token_mask.py), or None
for a free row; a step with no constrained row is given `masks=None`. A masked row's token
is drawn among the allowed ids only, and its logprobs are of that masked distribution (the
mask is applied to the logits after the penalties, before the sampler, as vLLM does).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .kv_cache import KVArena, Sequence

if TYPE_CHECKING:
    from .ops.logprobs import RowLogprobs
    from .ops.penalties import Penalty
    from .tokenizer import Tokenizer

I32 = npt.NDArray[np.int32]


class Draw(NamedTuple):
    """One sampler draw: the request's parameters and a uniform u in [0, 1)."""
    temperature: float
    top_k: int
    top_p: float
    u: float


GREEDY = Draw(0.0, 0, 1.0, 0.0)


@dataclass
class StepInput:
    """One sequence's part of a step: the new tokens to append (a prompt chunk, or 1).

    logits=False skips the LM head for it (a prompt chunk that isn't the last one): the
    head is 28M multiply-adds per row, a quarter of the whole model.
    from_prev >= 0: the one token is row `from_prev` of the previous launched step's sampled
    ids (only for a model that overlaps steps; `tokens` then holds a placeholder).
    every_logit: a logit row for every token, not only the last (speculative decoding
    verifies a draft by sampling each of its positions; only for a model whose
    `verifies_drafts` is True).
    """
    seq: Sequence
    tokens: I32
    logits: bool = True
    from_prev: int = -1
    every_logit: bool = False


@dataclass
class StepArrays:
    """A step flattened for the kernels: per token its id, sequence (index into `tables`),
    position, and previous-step row (-1: the id is in `tokens`); the rows whose logits are
    wanted; one block-table row per input."""
    tokens: I32
    tok_seq: I32
    tok_pos: I32
    logit_rows: I32
    tables: I32
    prev_rows: I32

    @property
    def is_decode(self) -> bool:
        """One new token per sequence, each with logits: the shape a CUDA graph replays."""
        n = len(self.tokens)
        return n == len(self.tables) == len(self.logit_rows)

    @property
    def uses_prev(self) -> bool:
        return bool(self.prev_rows.size) and int(self.prev_rows.max()) >= 0


class PendingTokens(Protocol):
    def wait(self) -> I32:
        """The sampled ids, int32 [rows with logits], once the step is done."""
        ...

    def logprobs(self) -> list[RowLogprobs | None]:
        """After wait(): per row a gpu/ops/logprobs.RowLogprobs, or None where the row did
        not ask (every row, when the step was launched without `logprobs`)."""
        ...


class ReadyTokens:
    """A step that already ran (the CPU model): wait() returns at once."""

    def __init__(self, ids: I32, lps: list[RowLogprobs | None] | None = None):
        self.ids = ids
        self.lps = lps

    def wait(self) -> I32:
        return self.ids

    def logprobs(self) -> list[RowLogprobs | None]:
        return self.lps if self.lps is not None else [None] * len(self.ids)


@runtime_checkable
class Model(Protocol):
    @property
    def cfg(self) -> object: ...  # gguf_loader.ModelConfig (read, never replaced)

    max_seq_len: int
    arena: KVArena
    overlaps: bool              # launch_tokens returns before the step is done
    verifies_drafts: bool       # takes StepInput.every_logit (speculative decoding)

    def tokenizer(self) -> Tokenizer: ...

    def new_sequence(self) -> Sequence: ...

    def step(self, inputs: list[StepInput]) -> npt.NDArray[np.float32]: ...

    # penalties: per logit row a gpu/ops/penalties.Penalty or None, applied before the draw
    def step_tokens(self, inputs: list[StepInput], draws: list[Draw],
                    penalties: list[Penalty | None] | None = None) -> I32: ...

    # logprobs: per logit row the alternatives wanted (0..20) or -1; None: no row asks
    def launch_tokens(self, inputs: list[StepInput], draws: list[Draw],
                      penalties: list[Penalty | None] | None = None,
                      logprobs: list[int] | None = None,
                      masks: list | None = None) -> PendingTokens: ...


def step_arrays(inputs: list[StepInput], vocab: int) -> StepArrays:
    """A step's inputs as flat arrays, after reserving each sequence's room. Raises before
    any state changes if a sequence can't grow or a token id is outside the vocabulary."""
    for inp in inputs:
        inp.seq.reserve(len(inp.tokens))
    tokens = np.concatenate([np.asarray(i.tokens, np.int32) for i in inputs])
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"token id out of range [0, {vocab})")
    tok_seq = np.concatenate([np.full(len(i.tokens), s, np.int32) for s, i in enumerate(inputs)])
    tok_pos = np.concatenate([np.arange(i.seq.length, i.seq.length + len(i.tokens), dtype=np.int32)
                              for i in inputs])
    ends = np.cumsum([len(i.tokens) for i in inputs]).astype(np.int32)
    logit_rows = np.concatenate(
        [np.arange(e - len(i.tokens), e, dtype=np.int32) if i.every_logit
         else np.array([e - 1] if i.logits else [], np.int32) for e, i in zip(ends, inputs)])
    tables = np.stack([i.seq.table for i in inputs])
    prev_rows = np.concatenate([np.full(len(i.tokens), i.from_prev, np.int32) for i in inputs])
    if (prev_rows >= 0).any() and any(i.from_prev >= 0 and len(i.tokens) != 1 for i in inputs):
        raise ValueError("from_prev is for single-token inputs")
    return StepArrays(tokens, tok_seq, tok_pos, logit_rows, tables, prev_rows)
