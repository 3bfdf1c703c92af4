"""Speculative decoding (gpu/drafting.py, the engine's drafted steps) changes no answer.

Greedy: token for token what the plain decoder emits, over grounded and free prompts, with
stop strings, length limits and EOS inside a draft, batched with requests that never draft
(penalties, logprobs, a schema). Sampled: the same distribution, by a two-sample test over
many seeds. The KV of rejected guesses never reaches the prefix cache.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from test_engine import Recorder, run
from zerolayer.daemon.engine import Engine
from zerolayer.daemon.request import Admitted, DoneEvent
from zerolayer.gpu.drafting import MAX_DRAFT, DraftLength, lookup, speculates
from zerolayer.protocol.constraint import from_response_format
from zerolayer.protocol.sampling_params import SamplingParams
from zerolayer.protocol.wire import (
    PARAM_NO_SPECULATION,
    PARAMS,
    PayloadKind,
    decode_invoke_body,
    encode_invoke_body,
)

PASSAGE = ("Alice was beginning to get very tired of sitting by her sister on the bank, and of "
           "having nothing to do: once or twice she had peeped into the book her sister was "
           "reading, but it had no pictures or conversations in it, \"and what is the use of a "
           "book,\" thought Alice \"without pictures or conversations?\"")
LIST = "apples, pears, plums, cherries, grapes, lemons, limes, figs, dates, melons"
CHATS = [
    "Repeat the following text exactly:\n\n" + PASSAGE,
    "Copy this list, replacing plums with peaches: " + LIST,
    "Quote the sentence about the book from this passage: " + PASSAGE,
    "What is the capital of France?",
    "Write a short poem about the sea.",
]


def chat_ids(generator, text: str) -> np.ndarray:
    return np.array(generator.tokenizer.encode_chat([{"role": "user", "content": text}]), np.int32)


class Tally(Recorder):
    """Recorder plus each request's speculative counts."""

    def __init__(self):
        super().__init__()
        self.spec: dict = {}

    def __call__(self, ev):
        super().__call__(ev)
        if isinstance(ev, DoneEvent):
            self.spec[ev.req.key] = (ev.drafted, ev.accepted)


def serve(generator, requests, speculative: bool, max_running: int = 16):
    rec = Tally()
    eng = Engine(generator.model, generator.tokenizer, emit=rec, max_running=max_running,
                 max_waiting=max(len(requests), 1), step_tokens=256, speculative=speculative)
    reqs = {key: eng.submit(Admitted(key, params), ids) for key, ids, params in requests}
    run(eng, limit=20000)
    eng.prefix.clear()
    assert generator.model.arena.free_blocks == generator.model.arena.n_blocks  # nothing leaked
    rec.tokens = {k: list(r.tokens) for k, r in reqs.items()}
    return rec, eng


def test_greedy_speculative_is_token_identical(generator):
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"fruit": {"type": "string"}}, "required": ["fruit"]}}}
    params = [SamplingParams(max_tokens=64), SamplingParams(max_tokens=7),
              SamplingParams(max_tokens=64, stop=("sister",)), SamplingParams(max_tokens=64, stop=(",",)),
              SamplingParams(max_tokens=24, repetition_penalty=1.3),
              SamplingParams(max_tokens=24, logprobs=True, top_logprobs=3),
              SamplingParams(max_tokens=24, constraint=from_response_format(schema))]
    requests = [(i * 10 + j, chat_ids(generator, c), p)
                for i, c in enumerate(CHATS) for j, p in enumerate(params)]
    plain, plain_eng = serve(generator, requests, speculative=False)
    spec, spec_eng = serve(generator, requests, speculative=True)
    assert spec.text == plain.text
    # (prompt tokens served by the prefix cache may differ: requests finish at other steps)
    assert {k: (r, u.completion_tokens) for k, (r, u, _) in spec.done.items()} == \
        {k: (r, u.completion_tokens) for k, (r, u, _) in plain.done.items()}
    assert spec.tokens == plain.tokens
    assert not spec.errors and not plain.errors
    # it did draft, keep and reject guesses, in fewer steps; the ones that may not never did
    assert 0 < spec_eng.accepted_tokens < spec_eng.drafted_tokens
    assert spec_eng.steps < plain_eng.steps
    assert all(spec.spec[k] == (0, 0) for k, _, p in requests if not speculates(p))
    assert sum(spec.spec[k][1] for k in (0, 10, 20)) >= 10  # the copying prompts keep guesses


def test_opted_out_requests_never_draft(generator):
    ids = chat_ids(generator, CHATS[0])
    rec, eng = serve(generator, [(0, ids, SamplingParams(max_tokens=32, speculative=False))], True)
    assert rec.spec[0] == (0, 0) and eng.drafted_tokens == 0


def test_big_batches_decode_without_drafts(generator):
    """speculative_max_batch 2: while four requests decode no step drafts; once the two short
    ones have finished the long ones draft again, and every answer is the plain decoder's."""
    ids = chat_ids(generator, CHATS[0])
    requests = [(k, ids, SamplingParams(max_tokens=n)) for k, n in enumerate((6, 6, 48, 48))]
    plain, _ = serve(generator, requests, speculative=False)
    rec = Tally()
    eng = Engine(generator.model, generator.tokenizer, emit=rec, max_waiting=4,
                 step_tokens=len(ids) * 4, speculative=True, speculative_max_batch=2)
    reqs = {key: eng.submit(Admitted(key, params), ids) for key, ids, params in requests}
    run(eng, limit=20000)
    eng.prefix.clear()
    assert {k: list(r.tokens) for k, r in reqs.items()} == plain.tokens
    assert eng.undrafted_steps >= 5           # the steps where all four decoded
    assert rec.spec[0] == rec.spec[1] == (0, 0)
    assert rec.spec[2][1] > 0 and rec.spec[3][1] > 0  # the copying answers kept guesses after


def _chi2_p(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test of homogeneity (categories under 10 expected pooled into
    one); p from the Wilson-Hilferty normal approximation of the chi-square tail."""
    na, nb = sum(a.values()), sum(b.values())
    cats = sorted(set(a) | set(b), key=lambda c: -(a[c] + b[c]))
    big = [c for c in cats if (a[c] + b[c]) * min(na, nb) / (na + nb) >= 10]
    rest = [c for c in cats if c not in big]
    rows = [(a[c], b[c]) for c in big] + ([(sum(a[c] for c in rest), sum(b[c] for c in rest))]
                                           if rest else [])
    if len(rows) < 2:
        return 1.0
    x2 = 0.0
    for ca, cb in rows:
        tot = ca + cb
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        x2 += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    k = len(rows) - 1
    z = ((x2 / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_sampled_speculative_keeps_the_distribution(generator):
    """Over many seeds, the tokens at drafted positions follow the plain sampler's
    distribution. Accepting every guess, or drawing the correction from the unadjusted
    distribution after a rejection, shifts it by far more than this test allows."""
    ids = np.array(generator.tokenizer.encode(
        "one two three four five six seven eight, one two three four five six seven eight, "
        "one two three four five six seven eight, one two three"), np.int32)
    n = 400
    params = [SamplingParams(max_tokens=4, temperature=1.5, seed=s) for s in range(n)]
    plain, _ = serve(generator, [(s, ids, p) for s, p in enumerate(params)], False)
    spec, eng = serve(generator, [(s, ids, p) for s, p in enumerate(params)], True)
    assert 0 < eng.accepted_tokens < eng.drafted_tokens  # both outcomes were exercised
    tp, ts = plain.tokens, spec.tokens
    for pos in (1, 2):  # position 0 comes from the prompt's last row, never a draft
        a = Counter(tuple(t[:pos + 1]) for t in tp.values() if len(t) > pos)
        b = Counter(tuple(t[:pos + 1]) for t in ts.values() if len(t) > pos)
        assert _chi2_p(a, b) > 1e-3, (pos, a.most_common(5), b.most_common(5))


def test_prefix_cache_holds_only_kept_positions(generator):
    """A request whose drafts were partly rejected leaves its KV in the prefix cache; a
    follow-up sharing its text then answers exactly as a cold run does."""
    first = chat_ids(generator, CHATS[4])
    rec = Tally()
    eng = Engine(generator.model, generator.tokenizer, emit=rec, speculative=True)
    r0 = eng.submit(Admitted(0, SamplingParams(max_tokens=48)), first)
    run(eng)
    assert rec.spec[0][1] < rec.spec[0][0]  # some guesses were rejected
    follow = np.concatenate([first, np.asarray(r0.tokens, np.int32),
                             chat_ids(generator, "Again, shorter.")[1:]]).astype(np.int32)
    eng.submit(Admitted(1, SamplingParams(max_tokens=24)), follow)
    run(eng)
    assert rec.done[1][1].cached_prompt_tokens >= len(first) + len(r0.tokens) - 1  # all it wrote
    eng.prefix.clear()
    cold, _ = serve(generator, [(1, follow, SamplingParams(max_tokens=24))], speculative=False)
    assert rec.text[1] == cold.text[1]


def test_lookup_takes_the_longest_most_recent_match():
    ctx = np.array([5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2], np.int32)
    assert lookup(ctx, 3, min_n=2).tolist() == [4, 7, 1]   # "1 2" last seen before 4 7 1
    ctx2 = np.array([8, 1, 2, 3, 6, 6, 0, 2, 3, 5, 1, 2, 3], np.int32)
    assert lookup(ctx2, 2, min_n=2).tolist() == [6, 6]     # "1 2 3" beats the later "2 3"
    assert lookup(np.array([1, 2, 3, 4], np.int32), 4).size == 0
    assert lookup(ctx, 0).size == 0


def test_draft_length_adapts():
    d = DraftLength()
    assert d.want() == 4
    d.update(4, 4)
    assert d.want() == 8
    d.update(8, 8)
    assert d.want() == MAX_DRAFT
    d.update(8, 2)
    assert d.want() == 3
    d.update(3, 0)  # nothing kept: plain steps for a while, then a single guess
    assert [d.want() for _ in range(2)] == [0, 0] and d.want() == 1
    assert (d.drafted, d.accepted) == (23, 14)


def test_no_speculation_flag_on_the_wire():
    plain = encode_invoke_body(SamplingParams(), PayloadKind.PROMPT, b"hi")
    off = encode_invoke_body(SamplingParams(speculative=False), PayloadKind.PROMPT, b"hi")
    assert PARAMS.unpack_from(plain, 0)[7] == 0  # the default is the old layout, unchanged
    assert PARAMS.unpack_from(off, 0)[7] == PARAM_NO_SPECULATION and len(off) == len(plain)
    assert decode_invoke_body(off).params.speculative is False
    assert decode_invoke_body(plain).params.speculative is True


@pytest.mark.parametrize("params", [SamplingParams(presence_penalty=0.5),
                                    SamplingParams(logprobs=True),
                                    SamplingParams(speculative=False)])
def test_who_drafts(params):
    assert speculates(SamplingParams()) and not speculates(params)
