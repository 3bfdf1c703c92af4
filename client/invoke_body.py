"""The signed INVOKE body both clients send: payload kind, sampling parameters, limits."""
from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence

from zerolayer.protocol.constraint import ResponseFormat, from_response_format
from zerolayer.protocol.errors import PayloadTooLargeError
from zerolayer.protocol.sampling_params import SamplingParams
from zerolayer.protocol.wire import (
    MAX_MESSAGE_BYTES,
    REQUEST_ID_LEN,
    ChatMessage,
    PayloadKind,
    encode_chat,
    encode_invoke_body,
    encode_token_ids,
)


def build_invoke_body(prompt: str | None, messages: Sequence[ChatMessage] | None,
                      token_ids: Iterable[int] | None, *, max_tokens: int, temperature: float,
                      top_k: int, top_p: float, seed: int | None,
                      stop: Sequence[str], repetition_penalty: float = 1.0,
                      presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                      logprobs: bool = False, top_logprobs: int = 0,
                      response_format: ResponseFormat | None = None,
                      speculative: bool = True) -> bytes:
    """Exactly one of prompt, messages, token_ids. Raises ValueError for a wrong call,
    MalformedError for out-of-range parameters and PayloadTooLargeError past 1 MiB, all
    before anything is sent. response_format: OpenAI's shape (protocol/constraint.py).
    speculative=False: the daemon decodes without drafts (the same answer; for measuring)."""
    given = [x is not None for x in (prompt, messages, token_ids)]
    if sum(given) != 1:
        raise ValueError("give exactly one of prompt, messages, token_ids")
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, stop=tuple(stop),
                            repetition_penalty=repetition_penalty,
                            presence_penalty=presence_penalty,
                            frequency_penalty=frequency_penalty, logprobs=logprobs,
                            top_logprobs=top_logprobs,
                            constraint=from_response_format(response_format),
                            speculative=speculative)
    if prompt is not None:
        kind, payload = PayloadKind.PROMPT, prompt.encode("utf-8")
    elif messages is not None:
        kind, payload = PayloadKind.CHAT, encode_chat(list(messages))
    else:
        assert token_ids is not None
        kind, payload = PayloadKind.TOKEN_IDS, encode_token_ids(token_ids)
    body = encode_invoke_body(params, kind, payload)  # validates params (MalformedError)
    if len(body) > MAX_MESSAGE_BYTES:
        raise PayloadTooLargeError(
            f"request body of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return body


def request_id_bytes(rid: bytes | str | None) -> bytes:
    """16 random bytes, or the caller's id (bytes, or 32 hex characters)."""
    if rid is None:
        return secrets.token_bytes(REQUEST_ID_LEN)
    b = bytes.fromhex(rid) if isinstance(rid, str) else bytes(rid)
    if len(b) != REQUEST_ID_LEN:
        raise ValueError("request_id must be 16 bytes (or 32 hex characters)")
    return b
