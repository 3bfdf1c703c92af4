"""The one SamplingParams: what a request asks of the sampler and the stopping rules.

The wire format (protocol/wire.py) encodes exactly these fields, the runtime's Generator and
the daemon's engine run them, and `validate` is the one rule set for all of them. It lives
in the protocol package because every side uses it (the SDK validates before sending, the
daemon after parsing, the runtime when generating); the daemon turns InvalidSamplingParams
into its MALFORMED error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .constraint import Constraint
from .errors import MalformedError

MAX_STOP = 8
MAX_TEMPERATURE = 100.0  # beyond this sampling is uniform noise; also keeps f32 finite
MAX_STOP_BYTES = 128
MAX_REPETITION_PENALTY = 10.0  # past this a seen token is all but banned; keeps f32 finite
MAX_ADDITIVE_PENALTY = 2.0     # OpenAI's range for presence and frequency penalties
MAX_TOP_LOGPROBS = 20          # OpenAI's limit for top_logprobs; bounds a token's entries


class InvalidSamplingParams(ValueError):
    """A parameter outside its documented range."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0     # 0 = greedy
    top_k: int = 0               # 0 = off
    top_p: float = 1.0           # 1 = off
    seed: int | None = None      # None = the server picks
    stop: tuple[str, ...] = ()
    # Penalties on the logits before sampling (greedy too), as vLLM defines them:
    # repetition (llama.cpp's repeat_penalty): each token id in the prompt or the output so
    # far has its logit divided by it when positive, multiplied when negative; 1 = off.
    # presence / frequency (OpenAI's): each token id in the output so far has its logit
    # lowered by presence once, and by frequency times its count; 0 = off.
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # The sampled token's logprob with each token, and the top_logprobs most likely tokens
    # at its position (0..20), of the distribution after penalties, before temperature,
    # top-k and top-p (vLLM's default; protocol/logprobs.py). Off: nothing extra is sent.
    logprobs: bool = False
    top_logprobs: int = 0
    # Structured output: what the generated text must be (protocol/constraint.py), enforced
    # by a token mask before sampling, greedy included. None: free text.
    constraint: Constraint | None = None
    # Speculative decoding (drafts from the request's own text, checked by the model): the
    # same tokens greedy, the same distribution sampled; False decodes one token a step.
    speculative: bool = True

    @property
    def penalized(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def validate(self) -> None:
        if not 1 <= self.max_tokens <= 0xFFFFFFFF:
            raise InvalidSamplingParams(f"max_tokens must be in 1..2^32-1, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise InvalidSamplingParams(
                f"temperature must be in [0, {MAX_TEMPERATURE}], got {self.temperature}")
        if not 0 <= self.top_k <= 0xFFFFFFFF:
            raise InvalidSamplingParams(f"top_k must be in 0..2^32-1, got {self.top_k}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise InvalidSamplingParams(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed < 1 << 64:
            raise InvalidSamplingParams(f"seed must be a u64, got {self.seed}")
        if not (math.isfinite(self.repetition_penalty)
                and 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY):
            raise InvalidSamplingParams(f"repetition_penalty must be in (0, "
                                        f"{MAX_REPETITION_PENALTY}], got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (math.isfinite(v) and abs(v) <= MAX_ADDITIVE_PENALTY):
                raise InvalidSamplingParams(
                    f"{name} must be in [-{MAX_ADDITIVE_PENALTY}, {MAX_ADDITIVE_PENALTY}], got {v}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidSamplingParams(
                f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {self.top_logprobs}")
        if self.top_logprobs and not self.logprobs:
            raise InvalidSamplingParams("top_logprobs needs logprobs=True")
        if self.constraint is not None:
            try:
                self.constraint.check()
            except MalformedError as e:
                raise InvalidSamplingParams(str(e)) from None
        if len(self.stop) > MAX_STOP:
            raise InvalidSamplingParams(f"at most {MAX_STOP} stop strings, got {len(self.stop)}")
        for s in self.stop:
            if not 1 <= len(s.encode("utf-8")) <= MAX_STOP_BYTES:
                raise InvalidSamplingParams(f"stop strings must be 1..{MAX_STOP_BYTES} UTF-8 bytes")
