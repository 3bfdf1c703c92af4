"""The engine's continuous batching on the real model: concurrency, cancel, admission."""
from __future__ import annotations

import time

import numpy as np
import pytest

from answers import FRANCE_ANSWER, FRANCE_ENDS_TURN, FRANCE_QUESTION
from zerolayer.daemon.engine import Engine
from zerolayer.daemon.request import Admitted, CancelReason, DoneEvent, FailedEvent, TextEvent
from zerolayer.gpu.context_rule import check_context
from zerolayer.gpu.errors import ContextOverflowError
from zerolayer.protocol.errors import OverloadedError
from zerolayer.protocol.sampling_params import SamplingParams

FRANCE = [{"role": "user", "content": FRANCE_QUESTION}]


class Recorder:
    """The engine's typed events, by request key."""

    def __init__(self):
        self.text: dict = {}
        self.done: dict = {}
        self.errors: dict = {}

    def __call__(self, ev):
        k = ev.req.key
        if isinstance(ev, TextEvent):
            self.text[k] = self.text.get(k, "") + ev.text
        elif isinstance(ev, DoneEvent):
            self.done[k] = (ev.reason.label, ev.usage, ev.timings)
        elif isinstance(ev, FailedEvent):
            self.errors[k] = (ev.code, ev.message)


def req(key, ids, params) -> tuple[Admitted, np.ndarray]:
    """What Engine.submit takes: the admitted request and its prompt's ids."""
    return Admitted(key, params), ids


@pytest.fixture()
def engine(generator):
    rec = Recorder()
    eng = Engine(generator.model, generator.tokenizer, emit=rec, max_running=8, step_tokens=64)
    eng.rec = rec
    yield eng
    eng.prefix.clear()
    assert generator.model.arena.free_blocks == generator.model.arena.n_blocks  # nothing leaked


def run(eng, limit=2000):
    for _ in range(limit):
        if not eng.has_work:
            return
        eng.step()
    raise AssertionError("engine did not finish")


def test_concurrent_requests_batch_and_match_solo(engine, generator):
    ids = np.array(generator.tokenizer.encode_chat(FRANCE), np.int32)
    solo = generator.complete(messages=FRANCE, params=SamplingParams(max_tokens=20)).text
    for k in range(6):  # 6 prompts of 37 tokens with a 64-token budget: chunked prefill
        engine.submit(*req(k, ids, SamplingParams(max_tokens=20)))
    run(engine)
    assert set(engine.rec.done) == set(range(6))
    for k in range(6):
        assert engine.rec.text[k] == solo  # batching changes nothing in the answer
        reason, usage, t = engine.rec.done[k]
        assert reason == ("stop" if FRANCE_ENDS_TURN else "length") and usage.prompt_tokens == 37
    # the 6 decodes shared forward passes: far fewer steps than 6 sequential runs
    assert engine.steps < 6 * (usage.completion_tokens + 1)


def test_penalties_batched_match_solo(engine, generator):
    """Requests with and without penalties in one batch: each answer is the Generator's
    alone with the same parameters (the penalties follow each request's own tokens)."""
    from test_penalties import LOOP
    ids = np.array(generator.tokenizer.encode(LOOP), np.int32)
    params = [SamplingParams(max_tokens=16), SamplingParams(max_tokens=16, frequency_penalty=1.0),
              SamplingParams(max_tokens=16, repetition_penalty=1.5, presence_penalty=0.5),
              SamplingParams(max_tokens=16, temperature=0.9, seed=3, repetition_penalty=1.2)]
    solo = [generator.complete(LOOP, params=p).text for p in params]
    assert len(set(solo)) == len(solo)  # every penalty changes this answer
    for k, p in enumerate(params):
        engine.submit(*req(k, ids, p))
    run(engine)
    assert [engine.rec.text[k] for k in range(len(params))] == solo


def test_cancel_frees_the_sequence(engine, generator):
    ids = np.array(generator.tokenizer.encode("Count: 1, 2, 3,"), np.int32)
    a = engine.submit(*req("a", ids, SamplingParams(max_tokens=200)))
    engine.submit(*req("b", ids, SamplingParams(max_tokens=5)))
    for _ in range(3):
        engine.step()
    a.req.cancel.reason = CancelReason.CLIENT  # what the I/O thread does; the engine sees it next step
    run(engine)
    assert engine.rec.done["a"][0] == "cancelled" and engine.rec.done["b"][0] == "length"
    assert engine.rec.done["a"][1].completion_tokens < 10


def test_admission_errors(engine, generator):
    check_context(1900, 148, 2048)  # the one context rule: prompt + max_tokens <= context
    with pytest.raises(ContextOverflowError):
        check_context(1900, 149, 2048)
    with pytest.raises(ContextOverflowError):
        engine.submit(*req("big", np.zeros(2000, np.int32), SamplingParams(max_tokens=100)))
    engine.max_running, engine.max_waiting = 1, 1  # it holds 2 requests, running or not
    for k in range(2):
        engine.submit(*req(k, np.array([1, 2, 3], np.int32), SamplingParams(max_tokens=2)))
    with pytest.raises(OverloadedError):
        engine.submit(*req("x", np.array([1], np.int32), SamplingParams(max_tokens=2)))
    cancelled = engine.waiting[-1]
    cancelled.req.cancel.reason = CancelReason.CLIENT  # a cancelled one does not count against it
    engine.submit(*req("y", np.array([1], np.int32), SamplingParams(max_tokens=2)))
    run(engine)
    assert set(engine.rec.done) == {0, 1, "y"}


def test_prefix_reuse_skips_the_shared_prompt(engine, generator):
    tok = generator.tokenizer
    ids = np.array(tok.encode_chat(FRANCE), np.int32)
    engine.submit(*req("a", ids, SamplingParams(max_tokens=20)))
    run(engine)
    before = engine.forward_passes_tokens
    engine.submit(*req("b", ids, SamplingParams(max_tokens=20)))  # the same question
    run(engine)
    italy = [{"role": "user", "content": "What is the capital of Italy?"}]
    other = np.array(tok.encode_chat(italy), np.int32)
    engine.submit(*req("c", other, SamplingParams(max_tokens=20)))  # same system prompt
    run(engine)
    rec = engine.rec
    assert rec.text["b"] == rec.text["a"] and FRANCE_ANSWER in rec.text["b"]
    assert rec.done["a"][1].cached_prompt_tokens == 0
    assert rec.done["b"][1].cached_prompt_tokens == len(ids) - 1  # all but the last token
    shared = int(np.flatnonzero(other[:len(ids)] != ids[:len(other)])[0])
    assert rec.done["c"][1].cached_prompt_tokens == shared and shared >= 16
    solo = generator.complete(messages=[{"role": "user", "content": "What is the capital of Italy?"}],
                              params=SamplingParams(max_tokens=20)).text
    assert rec.text["c"] == solo  # reused KV gives exactly the answer of a full prefill
    # b prefilled one token instead of 37
    assert engine.forward_passes_tokens - before < 2 * 20 + len(other)


def test_prefix_cache_gives_way_under_memory_pressure(generator):
    from zerolayer.gpu.kv_cache import KVArena
    m = generator.model
    saved = m.arena
    m.arena = KVArena(m.cfg.n_layer, m.cfg.n_kv, m.cfg.head_dim, 3, m.max_seq_len)  # 3 blocks
    try:
        rec = Recorder()
        eng = Engine(m, generator.tokenizer, emit=rec, max_running=4)
        for k in range(4):  # each needs 2 blocks; cached prefixes must be evicted to admit
            eng.submit(*req(k, np.arange(100, 160 + k, dtype=np.int32), SamplingParams(max_tokens=20)))
            run(eng)
        assert sorted(rec.done) == [0, 1, 2, 3] and not rec.errors
        eng.prefix.clear()
        assert m.arena.free_blocks == 3
    finally:
        m.arena = saved


def test_cancelled_stream_keeps_its_prompt_kv_for_the_next_request(engine, generator):
    """A client that leaves after the first tokens (CANCEL, or closing the stream) leaves its
    prompt's KV in the prefix cache: the same prompt again prefills one token, not all."""
    ids = np.array(generator.tokenizer.encode_chat(FRANCE), np.int32)
    a = engine.submit(*req("a", ids, SamplingParams(max_tokens=100)))
    while not a.tokens:
        engine.step()
    a.req.cancel.reason = CancelReason.CLIENT
    run(engine)
    assert engine.rec.done["a"][0] == "cancelled"
    engine.submit(*req("b", ids, SamplingParams(max_tokens=8)))
    run(engine)
    assert engine.rec.done["b"][1].cached_prompt_tokens == len(ids) - 1


def test_cancel_in_the_middle_of_a_prefill_keeps_what_was_prefilled(engine, generator):
    ids = np.arange(200, 400, dtype=np.int32)  # 200 tokens: 4 chunks of 64 at step_tokens 64
    a = engine.submit(*req("a", ids, SamplingParams(max_tokens=4)))
    engine.step()
    engine.step()
    assert a.prefilled == 128 and not a.tokens
    a.req.cancel.reason = CancelReason.CLIENT
    run(engine)
    engine.submit(*req("b", ids, SamplingParams(max_tokens=4)))
    run(engine)
    assert engine.rec.done["b"][1].cached_prompt_tokens == 128


def test_timings_are_disjoint_stages(engine, generator):
    """queue_us is admission (body complete) to first scheduled: the first datagram's arrival
    less the body's reassembly (ingress_us) and the tokenization (tokenize_us), both their
    own stages."""
    ids = np.array(generator.tokenizer.encode_chat(FRANCE), np.int32)
    adm = Admitted("t", SamplingParams(max_tokens=2),
                   received_at=time.monotonic() - 1.0,  # its first datagram came a second ago,
                   ingress_us=400_000)                  # its body was complete 0.6 s ago,
    r = engine.submit(adm, ids, tokenize_us=300_000)    # and tokenizing took 0.3 s of what followed
    run(engine)
    _, _, t = engine.rec.done["t"]
    since_first = int((r.t_admit - adm.received_at) * 1e6)
    assert t.queue_us == since_first - 400_000 - 300_000 >= 300_000
    assert t.ingress_us == 0 and t.tokenize_us == 300_000   # ingress_us: the I/O side's to fill
