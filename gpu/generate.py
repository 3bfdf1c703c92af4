"""The runtime's Python API: load a model, generate text from messages, a prompt or ids.

    gen = Generator.load()                       # bundled SmolLM2-135M-Instruct
    for chunk in gen.generate(messages=[{"role": "user", "content": "Hi"}]):
        print(chunk, end="")
    gen.last                                     # GenerationResult: text, usage, timings

Single-sequence and synchronous; the daemon's engine batches many sequences with the same
pieces (LlamaModel.step, the sampler, the detokenizer, StopChecker).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn, overload

import numpy as np
import numpy.typing as npt

from zerolayer.protocol.sampling_params import SamplingParams  # noqa: F401 (API)

from . import backend
from .context_rule import check_context
from .kv_cache import Sequence as KVSequence
from .model import LlamaModel, set_threads
from .model_api import GREEDY, Draw, Model, StepInput
from .ops import cpu_features
from .ops.penalties import Penalty, PenaltyState
from .stopping import StopChecker
from .tokenizer import Message, Tokenizer

if TYPE_CHECKING:
    from .cuda.forward import CudaModel

# prompt ids as a caller gives them
TokenIds = Sequence[int] | npt.NDArray[np.int32] | npt.NDArray[np.int64]

PREFILL_CHUNK = 512  # prompt tokens per forward call: bounds the activations' memory


@dataclass
class GenerationResult:
    text: str = ""
    finish_reason: str = ""  # "stop" (EOS or a stop string) or "length"
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0


def encode_prompt(tokenizer: Tokenizer, vocab: int, prompt: str | None = None,
                  messages: Sequence[Message] | None = None, token_ids: TokenIds | None = None,
                  max_tokens: int | None = None,
                  max_seq_len: int | None = None) -> npt.NDArray[np.int32]:
    """Prompt ids from exactly one of: raw text, chat messages (the GGUF's template), or ids.
    Raises ValueError for an empty prompt or an id outside the vocabulary.

    With max_tokens and max_seq_len, a text or chat that cannot fit (a lower bound on its
    tokens, linear in its bytes, already overflows) raises ContextOverflowError *before* it is
    tokenized: a huge request costs a scan of its bytes, never a template render or a BPE
    run over a megabyte."""
    if sum(x is not None for x in (prompt, messages, token_ids)) != 1:
        raise ValueError("give exactly one of prompt, messages, token_ids")
    if max_seq_len is not None and token_ids is None:
        fitted = _refuse_what_cannot_fit(tokenizer, prompt, messages,
                                         max_seq_len - (max_tokens or 0), max_seq_len)
        if fitted is not None:  # a long prompt, already tokenized while it was bounded
            return np.asarray(tokenizer.with_bos(fitted), np.int32)
    if messages is not None:
        ids = np.asarray(tokenizer.with_bos(tokenizer.encode_chat(messages)), np.int64)
    elif prompt is not None:
        text_ids = tokenizer.encode(prompt)
        ids = np.asarray(tokenizer.with_bos(text_ids) if text_ids else [], np.int64)
    else:
        ids = np.asarray(token_ids, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"token id outside the vocabulary (0..{vocab - 1})")
    if ids.size == 0:
        raise ValueError("empty prompt")
    return ids.astype(np.int32)


def _refuse_what_cannot_fit(tokenizer: Tokenizer, prompt: str | None,
                            messages: Sequence[Message] | None, room: int,
                            max_seq_len: int) -> list[int] | None:
    """ContextOverflowError when the prompt is sure to need more than `room` tokens, decided
    at a cost bounded by the room, not by the request's size: first a bound from the length
    and the message count, then the tokens of the long texts, tokenized only until they pass
    the room. Every count is a lower bound, so nothing that fits is ever refused. Returns the
    ids of a long plain prompt that fits (tokenized on the way), else None."""
    from .errors import ContextOverflowError

    def refuse(n: int) -> NoReturn:
        raise ContextOverflowError(n + max_seq_len - room, max_seq_len, at_least=True)

    if prompt is not None:
        if len(prompt) <= LONG_TEXT:
            return None
        bound = tokenizer.plain_bound(prompt)  # >= min_tokens(prompt), one pass either way
        if bound > room:
            refuse(bound)
        ids = tokenizer.encode_until(prompt, room)
        if len(ids) > room:
            refuse(len(ids))
        return ids if ids else None
    bound = tokenizer.min_tokens(None, messages)
    if bound > room:
        refuse(bound)
    # A chat: its control tokens, plus the tokens of each long content's interior (from its
    # first word start to its last), which no template glue can touch.
    n = tokenizer.control_tokens(messages or ())
    for m in messages or ():
        c = m.get("content")
        if isinstance(c, str) and len(c) > LONG_TEXT:
            n += len(tokenizer.encode_until(tokenizer.interior(c), room - n))
            if n > room:
                refuse(n)
    return None


LONG_TEXT = 4096  # characters; shorter texts are cheaper to tokenize whole than to bound


def on_backend(model: LlamaModel) -> Model:
    """The model as the chosen backend runs it (gpu/backend.py): the CPU model itself, or a
    CudaModel over the same weights. Both have the same step/new_sequence/arena interface."""
    if not backend.ON_DEVICE:
        return model
    if not backend.USABLE:
        raise backend.BackendUnavailable(backend.REASON)
    from .cuda.forward import CudaModel
    return CudaModel(model)


@overload
def prefill(model: Model, seq: KVSequence, ids: npt.NDArray[np.int32], draw: None = None,
            penalty: Penalty | None = None) -> npt.NDArray[np.float32]: ...
@overload
def prefill(model: Model, seq: KVSequence, ids: npt.NDArray[np.int32], draw: Draw,
            penalty: Penalty | None = None) -> int: ...
def prefill(model: Model, seq: KVSequence, ids: npt.NDArray[np.int32], draw: Draw | None = None,
            penalty: Penalty | None = None) -> int | npt.NDArray[np.float32]:
    """Run a prompt through the model in chunks: the logits of its last token, or, given a
    draw, the token id drawn from them (``step_tokens``, after ``penalty``, a
    gpu/ops/penalties.Penalty, if given)."""
    for i in range(0, len(ids), PREFILL_CHUNK):
        chunk = ids[i:i + PREFILL_CHUNK]
        last = i + PREFILL_CHUNK >= len(ids)
        if last and draw is not None:
            return int(model.step_tokens([StepInput(seq, chunk)], [draw], [penalty])[0])
        logits = model.step([StepInput(seq, chunk, logits=last)])
    return logits[0]


class Generator:
    def __init__(self, model: Model, tokenizer: Tokenizer):
        self.model = model
        self.tokenizer = tokenizer
        self.last = GenerationResult()

    @classmethod
    def load(cls, path: str | None = None, *, threads: int | None = None, max_seq_len: int | None = None,
             kv_blocks: int | None = None, warmup: bool = True,
             log: Callable[[str], None] | None = None) -> Generator:
        """kv_blocks: the KV arena's size in blocks of 64 positions (None: 16 full contexts).
        The arena is made here, once, by the model that owns it (on a GPU its pools are
        device memory), never replaced afterwards."""
        log = log or (lambda msg: None)
        t0 = time.perf_counter()
        n = set_threads(threads)
        llama = LlamaModel.load(path, max_seq_len=max_seq_len, kv_blocks=kv_blocks or None)
        model = on_backend(llama)
        tok = model.tokenizer()
        c = llama.cfg  # the device model runs the same config
        where = f"{n} CPU threads ({cpu_features.describe()})"
        cuda: CudaModel | None = None
        if backend.ON_DEVICE:
            from .cuda.forward import CudaModel
            assert isinstance(model, CudaModel)  # on_backend's model on a device
            cuda = model
            where = f"{backend.NAME} ({model.device})"
        log(f"loaded {c.name} ({c.n_layer} layers, d={c.d_model}, vocab {c.vocab}, "
            f"context {model.max_seq_len}) in {time.perf_counter() - t0:.2f} s, on {where}")
        gen = cls(model, tok)
        if warmup:
            t1 = time.perf_counter()
            from .jit_progress import report_compiles
            with report_compiles(log) as built:
                gen.warmup()
            log(f"kernels warm in {time.perf_counter() - t1:.2f} s"
                + (f" ({built.slow} compiled, the rest from the JIT cache)" if built.slow else ""))
        if cuda is not None:
            from .cuda._cuda_shim import MEMORY
            fwd = getattr(model, "fwd", None)
            log(f"CUDA graphs {cuda.graphs}; device memory: {MEMORY}; steps: "
                f"{getattr(fwd, 'kernel_path', '?')}; prefill GEMMs: "
                f"{getattr(fwd, 'prefill_path', '?')}")
        return gen

    def warmup(self) -> None:
        """Compile (or load from the JIT cache) every kernel path the engine takes: a prefill
        and a decode step through step_tokens (on a GPU: the sampler, and the batch-1 decode
        graph captured and checked)."""
        seq = self.model.new_sequence()
        try:
            tok = prefill(self.model, seq, np.array([self.tokenizer.eos_id] * 2, np.int32),
                          Draw(1.0, 40, 0.9, 0.5))
            self.model.step_tokens([StepInput(seq, np.array([tok], np.int32))], [GREEDY])
        finally:
            seq.release()

    def prompt_ids(self, prompt: str | None = None, messages: Sequence[Message] | None = None,
                   token_ids: TokenIds | None = None) -> npt.NDArray[np.int32]:
        return encode_prompt(self.tokenizer, self.model.cfg.vocab, prompt, messages, token_ids)

    def generate(self, prompt: str | None = None, *, messages: Sequence[Message] | None = None,
                 token_ids: TokenIds | None = None, params: SamplingParams = SamplingParams(),
                 ) -> Iterator[str]:
        """Yield text chunks as they complete (never a partial UTF-8 character)."""
        params.validate()
        ids = self.prompt_ids(prompt, messages, token_ids)
        check_context(len(ids), params.max_tokens, self.model.max_seq_len)
        res = self.last = GenerationResult(prompt_tokens=len(ids))
        rng = np.random.default_rng(params.seed)
        detok = self.tokenizer.detokenizer()
        stops = StopChecker(params.stop)
        eos = self.tokenizer.eos_ids
        seq = self.model.new_sequence()
        try:
            t0 = time.perf_counter()
            def draw() -> Draw:
                return Draw(params.temperature, params.top_k, params.top_p, rng.random())
            pen = PenaltyState.of(params, ids)
            tok = prefill(self.model, seq, ids, draw(), pen.spec())
            res.prefill_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            while True:
                if tok in eos:
                    res.finish_reason = "stop"
                    break
                res.token_ids.append(tok)
                pen.push(tok)
                chunk = stops.push(detok.push(tok))
                if chunk:
                    res.text += chunk
                    yield chunk
                if stops.stopped:
                    res.finish_reason, res.stop_sequence = "stop", stops.matched
                    break
                if len(res.token_ids) >= params.max_tokens:
                    res.finish_reason = "length"
                    break
                tok = int(self.model.step_tokens([StepInput(seq, np.array([tok], np.int32))],
                                                 [draw()], [pen.spec()])[0])
            tail = stops.push(detok.flush()) + stops.flush()
            if tail:
                res.text += tail
                yield tail
            res.decode_s = time.perf_counter() - t1
            res.completion_tokens = len(res.token_ids)
        finally:
            seq.release()

    def complete(self, prompt: str | None = None, *, messages: Sequence[Message] | None = None,
                 token_ids: TokenIds | None = None, params: SamplingParams = SamplingParams(),
                 ) -> GenerationResult:
        for _ in self.generate(prompt, messages=messages, token_ids=token_ids, params=params):
            pass
        return self.last


def stderr_log(msg: str) -> None:
    print(f"[zerolayer] {msg}", file=sys.stderr, flush=True)
