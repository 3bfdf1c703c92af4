"""OpenAI's two logprobs shapes, from the SDK's TokenLogprobs (protocol/logprobs.py).

Chat completions: `logprobs.content[]`, one object per token with its text, logprob, UTF-8
bytes and `top_logprobs` (the same three fields per alternative). Legacy completions:
parallel lists `tokens`, `token_logprobs`, `top_logprobs` (per token a {text: logprob} map
holding the alternatives and the sampled token itself, as vLLM and OpenAI return it) and
`text_offset`, each token's offset in characters into the completion.

A constrained request's logprobs are of its masked distribution, where a token the grammar
forbids has -inf (an alternative when top_logprobs asks for more than the grammar allows):
JSON has no -inf, so those are OpenAI's own floor for "as good as impossible", -9999.0.

A stream sends each chunk's tokens with it, so the offsets carry on from chunk to chunk:
`CompletionLogprobs` is one per answer, fed in order. An offset counts the characters the
tokens before it completed; a token that is the first part of a character does not move the
next token's offset.
"""
from __future__ import annotations

import codecs
from collections.abc import Sequence

from zerolayer.client import TokenLogprob
from zerolayer.daemon.json_value import JSONValue

FLOOR = -9999.0


def _lp(v: float) -> float:
    return v if v > FLOOR else FLOOR


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, JSONValue]:
    return {"content": [{"token": t.token, "logprob": _lp(t.logprob),
                         "bytes": list(t.token_bytes),
                         "top_logprobs": [{"token": a.token, "logprob": _lp(a.logprob),
                                           "bytes": list(a.token_bytes)}
                                          for a in t.top_logprobs]}
                        for t in tokens],
            "refusal": None}


class CompletionLogprobs:
    def __init__(self) -> None:
        self._chars = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def next(self, tokens: Sequence[TokenLogprob]) -> dict[str, JSONValue]:
        """The logprobs object of the next tokens of the answer."""
        offsets = []
        for t in tokens:
            offsets.append(self._chars)
            self._chars += len(self._utf8.decode(t.token_bytes))
        return {"tokens": [t.token for t in tokens],
                "token_logprobs": [_lp(t.logprob) for t in tokens],
                "top_logprobs": [_top_map(t) for t in tokens],
                "text_offset": offsets}


def _top_map(t: TokenLogprob) -> dict[str, float]:
    """The alternatives best first, then the sampled token if it is not among them. (Two
    ids whose bytes decode to one text share a key: the better one is kept.)"""
    out: dict[str, float] = {}
    for a in t.top_logprobs:
        out.setdefault(a.token, _lp(a.logprob))
    out.setdefault(t.token, _lp(t.logprob))
    return out
