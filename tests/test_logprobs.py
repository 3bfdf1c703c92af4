"""Logprobs: the numbers against a float64 log-softmax of the model's own logits, the wire
(the INVOKE block, TOKEN frames' entries, the bounds), and a stream that did not ask being
byte for byte what it was. The SDK against a real daemon and the OpenAI edge with the real
`openai` package: test_http_edge.py; the device sampler's twin: test_cuda_sim.py.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolayer.daemon.engine import Engine
from zerolayer.daemon.request import Admitted, DoneEvent, TextEvent
from zerolayer.gpu.ops.logprobs import row_logprobs, top_ids
from zerolayer.gpu.ops.penalties import apply_ref
from zerolayer.protocol import logprobs as lp
from zerolayer.protocol import wire
from zerolayer.protocol.errors import ErrorCode, MalformedError
from zerolayer.protocol.sampling_params import MAX_TOP_LOGPROBS, SamplingParams

SECRET = b"s" * 32
RID = bytes(range(16))
PROMPT = "The three primary colours are"


def log_softmax64(row) -> np.ndarray:
    z = np.asarray(row, np.float64)
    return z - (z.max() + np.log(np.exp(z - z.max()).sum()))


def ref_top(lsm: np.ndarray, n: int) -> np.ndarray:
    """The n best ids, logprob descending, lower id first on ties: a full stable sort."""
    return np.lexsort((np.arange(len(lsm)), -lsm))[:n]


# ---------------------------------------------------------------- the CPU op

def test_top_ids_order_and_ties():
    z = np.array([1.0, 3.0, 3.0, 2.0, 3.0, -1.0])
    assert top_ids(z, 2).tolist() == [1, 2]            # a tie at the cut: lowest ids
    assert top_ids(z, 4).tolist() == [1, 2, 4, 3]
    assert top_ids(z, 0).tolist() == []
    assert top_ids(z, 99).tolist() == [1, 2, 4, 3, 0, 5]
    rng = np.random.default_rng(1)
    for _ in range(50):
        z = rng.integers(-3, 3, int(rng.integers(1, 60))).astype(np.float32)  # many ties
        n = int(rng.integers(0, 21))
        assert top_ids(z, n).tolist() == ref_top(z.astype(np.float64), n).tolist()


def test_row_logprobs_is_a_float64_log_softmax():
    rng = np.random.default_rng(2)
    row = (rng.standard_normal(49152) * 6).astype(np.float32)
    r = row_logprobs(row, 17, 20)
    ref = log_softmax64(row)
    assert r.logprob == pytest.approx(ref[17], abs=1e-9)
    assert r.top_ids.tolist() == ref_top(ref, 20).tolist()
    np.testing.assert_allclose(r.top_logprobs, ref[r.top_ids], atol=1e-9)


# ---------------------------------------------------------------- the engine, on the real model

class Steps:
    """Records every logit row the model returns (a copy: penalties change it in place
    afterwards), in order."""

    def __init__(self, model, monkeypatch):
        self.rows: list[np.ndarray] = []
        self.launch_kw: list[dict] = []
        step, launch = model.step, model.launch_tokens

        def spy_step(inputs, *a, **kw):
            out = step(inputs, *a, **kw)
            self.rows.extend(out.copy())
            return out

        def spy_launch(*a, **kw):
            self.launch_kw.append(kw)
            return launch(*a, **kw)
        monkeypatch.setattr(model, "step", spy_step)
        monkeypatch.setattr(model, "launch_tokens", spy_launch)


def run_one(generator, params: SamplingParams):
    events: list = []
    eng = Engine(generator.model, generator.tokenizer, emit=events.append, max_running=2)
    ids = np.array(generator.tokenizer.with_bos(generator.tokenizer.encode(PROMPT)), np.int32)
    r = eng.submit(Admitted(1, params), ids)
    while eng.has_work:
        eng.step()
    eng.prefix.clear()
    assert isinstance(events[-1], DoneEvent)
    return r, ids, [e for e in events if isinstance(e, TextEvent)]


def wire_positions(texts: list[TextEvent]) -> tuple[list[bytes], list[lp.TokenLogprob]]:
    """The events as the daemon frames them (streams.py), decoded as the SDK does."""
    signer = wire.ResponseSigner(1, SECRET, RID)
    frames, pos = [], lp.Positions()
    for ev in texts:
        pieces = wire.split_utf8(ev.text.encode(), wire.MAX_TEXT)
        for text, entries, n in lp.pack_frames(pieces, ev.n_tokens, ev.logprobs, wire.MAX_TEXT):
            dg = signer.token(len(frames), 1, text, n, entries)
            frames.append(dg)
            f = wire.decode_response(dg, SECRET)
            assert isinstance(f, wire.TokenFrame)
            pos.feed(f.logprobs)
    return frames, pos.done


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=12, logprobs=True, top_logprobs=5),
    SamplingParams(max_tokens=12, logprobs=True, top_logprobs=MAX_TOP_LOGPROBS,
                   temperature=0.9, top_k=40, top_p=0.9, seed=11),
    SamplingParams(max_tokens=8, logprobs=True),
], ids=["greedy-top5", "sampled-top20", "no-alternatives"])
def test_values_are_a_float64_log_softmax_of_the_models_logits(generator, monkeypatch, params):
    steps = Steps(generator.model, monkeypatch)
    r, _, texts = run_one(generator, params)
    _, got = wire_positions(texts)
    assert len(got) == len(r.tokens) <= len(steps.rows)   # (EOS's row: no entry)
    tb = generator.tokenizer.token_bytes
    for i, (t, row) in enumerate(zip(got, steps.rows)):
        ref = log_softmax64(row)          # raw: before temperature, top-k and top-p
        assert t.token_id == r.tokens[i] and t.token_bytes == tb(t.token_id)
        assert t.logprob == pytest.approx(ref[t.token_id], abs=1e-5)   # f32 on the wire
        assert [a.token_id for a in t.top_logprobs] == ref_top(ref, params.top_logprobs).tolist()
        for a in t.top_logprobs:
            assert a.logprob == pytest.approx(ref[a.token_id], abs=1e-5)
            assert a.token_bytes == tb(a.token_id)
        if params.temperature == 0.0 and t.top_logprobs:
            assert t.top_logprobs[0].token_id == t.token_id   # greedy took the best
    # the text the entries spell is the answer's
    assert b"".join(t.token_bytes for t in got).decode() == "".join(e.text for e in texts)


def test_logprobs_are_of_the_penalised_logits(generator, monkeypatch):
    params = SamplingParams(max_tokens=10, logprobs=True, top_logprobs=3,
                            repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.7)
    steps = Steps(generator.model, monkeypatch)
    r, prompt, texts = run_one(generator, params)
    _, got = wire_positions(texts)
    for i, (t, row) in enumerate(zip(got, steps.rows)):
        pen = apply_ref(row, prompt, np.array(r.tokens[:i], np.int64), params.repetition_penalty,
                        params.presence_penalty, params.frequency_penalty)
        ref = log_softmax64(pen)
        assert t.logprob == pytest.approx(ref[t.token_id], abs=1e-4)
        assert [a.token_id for a in t.top_logprobs] == ref_top(ref, 3).tolist()


def test_not_asking_costs_nothing(generator, monkeypatch):
    """Without the flag the model is launched as before (no logprobs argument), no event
    carries entries, and every TOKEN frame is v1's: lp_len 0, the text the whole body."""
    steps = Steps(generator.model, monkeypatch)
    r, _, texts = run_one(generator, SamplingParams(max_tokens=8))
    assert steps.launch_kw and all("logprobs" not in kw for kw in steps.launch_kw)
    assert all(e.logprobs == () for e in texts)
    signer = wire.ResponseSigner(1, SECRET, RID)
    for i, e in enumerate(texts):
        dg = signer.token(i, 1, e.text, e.n_tokens)
        body = e.text.encode()
        v1 = bytearray(wire.COMMON.pack(wire.MAGIC, 1, wire.MsgType.TOKEN, 44,
                                        44 + len(body) + 32, 0, 1, RID))
        v1 += struct.pack("<IIHH", i, 1, e.n_tokens, 0) + body
        assert dg == bytes(v1) + wire.sign(SECRET, v1)


def test_a_batch_where_one_request_asks(generator):
    """Rows that did not ask get nothing; the one that asked gets its own rows' values."""
    events: list = []
    eng = Engine(generator.model, generator.tokenizer, emit=events.append, max_running=4)
    ids = np.array(generator.tokenizer.with_bos(generator.tokenizer.encode(PROMPT)), np.int32)
    reqs = [eng.submit(Admitted(k, SamplingParams(max_tokens=6, logprobs=(k == 1),
                                                  top_logprobs=2 if k == 1 else 0)), ids)
            for k in range(3)]
    while eng.has_work:
        eng.step()
    eng.prefix.clear()
    by = {k: [e for e in events if isinstance(e, TextEvent) and e.req.key == k] for k in range(3)}
    assert all(e.logprobs == () for k in (0, 2) for e in by[k])
    _, got = wire_positions(by[1])
    assert [t.token_id for t in got] == reqs[1].tokens == reqs[0].tokens


# ---------------------------------------------------------------- the wire

def test_invoke_block_round_trip_and_old_layout_unchanged():
    base = SamplingParams(max_tokens=5, stop=("x",))
    plain = wire.encode_invoke_body(base, wire.PayloadKind.PROMPT, b"hi")
    # without the flag: v1's layout, parameter flags 0
    assert plain[:wire.PARAMS_LEN] == wire.PARAMS.pack(5, 0.0, 1.0, 0, 0, 2, 1, 0, 2)
    assert not wire.asks_logprobs(plain)
    for top in (0, 7, MAX_TOP_LOGPROBS):
        p = SamplingParams(max_tokens=5, stop=("x",), logprobs=True, top_logprobs=top)
        body = wire.encode_invoke_body(p, wire.PayloadKind.PROMPT, b"hi")
        assert len(body) == len(plain) + 4 and wire.asks_logprobs(body)
        assert wire.PARAMS.unpack_from(body)[7] == wire.PARAM_LOGPROBS
        assert body[wire.PARAMS_LEN:wire.PARAMS_LEN + 4] == bytes([top, 0, 0, 0])
        assert wire.decode_invoke_body(body).params == p
    # after the penalty block
    p = SamplingParams(logprobs=True, top_logprobs=2, presence_penalty=0.5)
    body = wire.encode_invoke_body(p, wire.PayloadKind.PROMPT, b"hi")
    assert body[wire.PARAMS_LEN + 12] == 2 and wire.decode_invoke_body(body).params == p


def test_top_logprobs_bounds_are_refused_as_malformed():
    with pytest.raises(MalformedError, match=r"top_logprobs must be in 0\.\.20, got 21"):
        wire.encode_invoke_body(SamplingParams(logprobs=True, top_logprobs=21),
                                wire.PayloadKind.PROMPT, b"hi")
    with pytest.raises(MalformedError, match="top_logprobs needs logprobs=True"):
        wire.encode_invoke_body(SamplingParams(top_logprobs=3), wire.PayloadKind.PROMPT, b"hi")
    good = bytearray(wire.encode_invoke_body(SamplingParams(logprobs=True, top_logprobs=20),
                                             wire.PayloadKind.PROMPT, b"hi"))
    bad = bytearray(good)
    bad[wire.PARAMS_LEN] = 21                       # what a foreign client could send
    with pytest.raises(MalformedError, match=r"top_logprobs must be in 0\.\.20, got 21"):
        wire.decode_invoke_body(bytes(bad))
    bad = bytearray(good)
    bad[wire.PARAMS_LEN + 2] = 1                    # a reserved byte
    with pytest.raises(MalformedError, match="reserved"):
        wire.decode_invoke_body(bytes(bad))
    with pytest.raises(MalformedError, match="logprobs block"):  # the flag, no block
        wire.decode_invoke_body(wire.PARAMS.pack(4, 0.0, 1.0, 0, 0, 2, 0, wire.PARAM_LOGPROBS, 0))
    from zerolayer.client.invoke_body import build_invoke_body
    with pytest.raises(MalformedError, match="got 21"):   # the SDK refuses before sending
        build_invoke_body("hi", None, None, max_tokens=4, temperature=0, top_k=0, top_p=1,
                          seed=None, stop=(), logprobs=True, top_logprobs=21)


def test_the_daemon_answers_21_alternatives_malformed():
    """A client other than the SDK that sends top_logprobs 21 gets the daemon's signed
    MALFORMED ERROR, with the message; 20 is admitted."""
    import test_protocol_ingress as ti
    from zerolayer.daemon.ingress import InvokeRequest, Rejected
    ing = ti._ingress((ti.Clock(ti.NOW), ti.Clock(50.0)))
    good = wire.encode_invoke_body(SamplingParams(max_tokens=4, logprobs=True, top_logprobs=20),
                                   wire.PayloadKind.PROMPT, b"hi")
    ok = ing.feed(ti._invoke(good)[0])
    assert isinstance(ok, InvokeRequest) and ok.body.params.top_logprobs == 20
    bad = bytearray(good)
    bad[wire.PARAMS_LEN] = 21
    r = ing.feed(ti._invoke(bytes(bad))[0])
    assert isinstance(r, Rejected) and r.reply is not None
    f = wire.decode_response(r.reply, ti.SECRET)
    assert isinstance(f, wire.ErrorFrame) and f.signed and f.code == ErrorCode.MALFORMED
    assert f.message == "top_logprobs must be in 0..20, got 21"


def test_a_token_frame_carries_text_then_entries():
    pos = lp.encode_position(7, -0.25, b"ab", [(7, -0.25, b"ab"), (9, -2.0, b"\xe2\x82")])
    signer = wire.ResponseSigner(1, SECRET, RID)
    dg = signer.token(3, 5, "ab", 1, b"".join(pos))
    lp_len = struct.unpack_from("<H", dg, wire.COMMON_LEN + 10)[0]
    assert lp_len == sum(map(len, pos)) and dg[wire.COMMON_LEN + 12:][:2] == b"ab"
    f = wire.decode_response(dg, SECRET)
    assert isinstance(f, wire.TokenFrame) and f.text == "ab" and len(f.logprobs) == 3
    p = lp.Positions()
    p.feed(f.logprobs)
    (t,) = p.done
    assert (t.token_id, t.logprob, t.token) == (7, -0.25, "ab")
    assert [(a.token_id, a.logprob, a.token_bytes) for a in t.top_logprobs] == \
        [(7, -0.25, b"ab"), (9, -2.0, b"\xe2\x82")]
    # an lp_len past the body, and entries that do not fill their bytes: MALFORMED
    for edit in (lambda b: struct.pack_into("<H", b, wire.COMMON_LEN + 10, 2000),
                 lambda b: struct.pack_into("<H", b, wire.COMMON_LEN + 10, lp_len - 1)):
        b = bytearray(dg[:-32])
        edit(b)
        with pytest.raises(MalformedError):
            wire.decode_response(bytes(b) + wire.sign(SECRET, b), SECRET)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**20), st.lists(st.binary(max_size=160),
                                                         min_size=1, max_size=21)),
                max_size=12),
       st.text(max_size=3000), st.integers(0, 3))
def test_frames_hold_any_tokens_and_reassemble(positions, text, n_tokens):
    """Whatever the text and the tokens' lengths: every frame fits, a token's entries share
    a frame whenever they would fit one, and the client gets every token back in order."""
    encoded = [lp.encode_position(tid, -float(i), bs[0], [(tid + j, -1.0 - j, b)
                                                         for j, b in enumerate(bs[1:])])
               for i, (tid, bs) in enumerate(positions)]
    pieces = wire.split_utf8(text.encode(), wire.MAX_TEXT)
    frames = lp.pack_frames(pieces, n_tokens, encoded, wire.MAX_TEXT)
    assert [t for t, _, _ in frames if t] == [p for p in pieces if p]
    assert sum(n for _, _, n in frames) == n_tokens
    got = lp.Positions()
    for t, entries, _ in frames:
        assert len(t) + len(entries) <= wire.MAX_TEXT
        got.feed(lp.decode_entries(entries))
    assert [(x.token_id, x.token_bytes, len(x.top_logprobs)) for x in got.done] == \
        [(tid, bs[0], len(bs) - 1) for tid, bs in positions]
    for enc in encoded:   # a token that fits one frame was never cut
        if sum(map(len, enc)) <= wire.MAX_TEXT:
            assert any(b"".join(enc) in e for _, e, _ in frames)


def test_positions_refuse_a_broken_sequence():
    a, b = lp.encode_position(1, -1.0, b"x", [(2, -2.0, b"y")])
    with pytest.raises(MalformedError):
        lp.Positions().feed(lp.decode_entries(b))          # an alternative without its token
    p = lp.Positions()
    with pytest.raises(MalformedError):
        p.feed(lp.decode_entries(a + a))                   # the alternative never came


# ---------------------------------------------------------------- the SDK's state machine

def _machine(logprobs: bool):
    from zerolayer.client.invoke_body import build_invoke_body
    from zerolayer.client.request_machine import RequestMachine
    from zerolayer.client.retry_policy import RetryPolicy
    body = build_invoke_body("hi", None, None, max_tokens=4, temperature=0, top_k=0, top_p=1,
                             seed=None, stop=(), logprobs=logprobs, top_logprobs=1 if logprobs else 0)
    m = RequestMachine(RetryPolicy(1, wire.Mac(SECRET)), body, RID, 0.0)
    m.start(0.0)
    return m


def _frames(run_id: int, tokens: list[tuple[int, bytes, str]]) -> list[bytes]:
    """One TOKEN frame per (id, bytes, text), then DONE."""
    signer = wire.ResponseSigner(1, SECRET, RID)
    out = [signer.token(i, run_id, text, 1, b"".join(lp.encode_position(
        tid, -0.5 * (i + 1), tb, [(tid, -0.5 * (i + 1), tb)])))
        for i, (tid, tb, text) in enumerate(tokens)]
    out.append(signer.done(len(tokens), run_id, wire.FinishReason.LENGTH,
                           wire.Usage(2, 0, len(tokens)), wire.Timings()))
    return out


def _drain(m) -> str:
    text = ""
    while (c := m.pop_ready(1.0)) is not None:
        text += c
    return text


def test_the_sdk_assembles_in_sequence_order_and_starts_over_on_a_new_run():
    from zerolayer.protocol.errors import StreamRestartedError
    m = _machine(True)
    run1 = _frames(5, [(10, b"He", "He"), (11, b"\xe2\x82", ""), (12, b"\xac!", "\u20ac!")])
    for dg in reversed(run1[:3]):          # out of order: assembled in seq order all the same
        m.receive(dg, 0.5)
    assert _drain(m) == "He\u20ac!" and [t.token_id for t in m.logprobs] == [10, 11, 12]
    # invoke(): a new run replaces the old one's text and logprobs alike
    m.restartable = True
    run2 = _frames(6, [(20, b"Yo", "Yo")])
    for dg in run2:
        m.receive(dg, 0.6)
    _drain(m)
    assert m.result is not None and m.result.text == "Yo"
    assert [t.token_id for t in m.result.logprobs] == [20]
    assert m.result.logprobs[0].top_logprobs[0].token_id == 20
    # stream(): logprobs handed out, even with no text yet, count as delivered
    m = _machine(True)
    m.receive(_frames(5, [(11, b"\xe2\x82", "")])[0], 0.5)
    _drain(m)
    assert len(m.logprobs) == 1
    with pytest.raises(StreamRestartedError):
        m.receive(_frames(6, [(20, b"Yo", "Yo")])[0], 0.6)


def test_the_sdk_without_logprobs_has_none():
    m = _machine(False)
    signer = wire.ResponseSigner(1, SECRET, RID)
    for dg in (signer.token(0, 5, "Hi", 1),
               signer.done(1, 5, wire.FinishReason.LENGTH, wire.Usage(2, 0, 1), wire.Timings())):
        m.receive(dg, 0.5)
    assert _drain(m) == "Hi" and m.logprobs == []
    assert m.result is not None and m.result.logprobs is None
