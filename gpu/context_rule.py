"""The CONTEXT_OVERFLOW rule (prompt + requested completion must fit the context)."""
from __future__ import annotations


def check_context(prompt_tokens: int, max_tokens: int, max_seq_len: int,
                  at_least: bool = False) -> None:
    """The CONTEXT_OVERFLOW rule, the one place it is written: the prompt plus the whole
    requested completion must fit the context. Deterministic, so the error can be cached.
    Admission reserves exactly this much KV, so an admitted request never overflows later.
    at_least: `prompt_tokens` is a lower bound (the message says so)."""
    from .errors import ContextOverflowError
    if prompt_tokens + max_tokens > max_seq_len:
        raise ContextOverflowError(prompt_tokens + max_tokens, max_seq_len, at_least=at_least)
