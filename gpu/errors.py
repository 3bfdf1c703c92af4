"""Typed errors of the model runtime. The daemon maps each to a wire error code."""
from __future__ import annotations

from zerolayer.protocol import errors as wire


class RuntimeModelError(Exception):
    """Base class for model-runtime errors."""


class ModelFormatError(RuntimeModelError):
    """The model file is unreadable, truncated, or not a GGUF we can run."""


class UnsupportedModelError(ModelFormatError):
    """The GGUF is well-formed but uses an architecture or tensor type we don't implement."""


class ContextOverflowError(RuntimeModelError, wire.ContextOverflowError):
    """A sequence would grow past the model's (or the configured) context limit.

    It is the wire's CONTEXT_OVERFLOW (code, message) with the numbers that decided it, so
    whoever refuses a request with it (ingress, the engine thread) sends it as it is.
    """

    def __init__(self, needed: int, limit: int, at_least: bool = False):
        super().__init__(f"context overflow: {'at least ' if at_least else ''}{needed} tokens "
                         f"needed, limit is {limit}")
        self.needed = needed
        self.limit = limit


class KVCacheFullError(RuntimeModelError, wire.OverloadedError):
    """The KV arena has no free blocks left: the wire's OVERLOADED, not a crash. The engine
    keeps such a request waiting until blocks free up; where one escapes, it is sent as it is.
    """
