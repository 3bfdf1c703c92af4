"""Sampling penalties (gpu/ops/penalties.py): the op against the definitions, a request's
state as its output grows, and the real model with them (the CUDA twin: test_cuda_sim.py's
"penalties" case; through the daemon's engine: test_engine.py; the HTTP edge:
test_http_edge.py)."""
from __future__ import annotations

import numpy as np
import pytest

from zerolayer.gpu.model_api import StepInput
from zerolayer.gpu.ops.penalties import PenaltyState, apply, apply_ref
from zerolayer.protocol.sampling_params import SamplingParams


@pytest.mark.parametrize("factors", [(1.3, 0.0, 0.0), (0.7, 0.0, 0.0), (1.0, 0.5, 0.0),
                                     (1.0, 0.0, 0.4), (1.0, -1.5, 2.0), (2.5, 0.3, -0.2)])
def test_apply_matches_the_definitions(factors):
    rng = np.random.default_rng(7)
    rep, pres, freq = factors
    for _ in range(40):
        V = int(rng.integers(5, 300))
        row = (rng.standard_normal(V) * 4).astype(np.float32)
        row[rng.integers(0, V)] = 0.0  # a zero logit: neither divided nor multiplied away
        prompt = rng.integers(0, V, int(rng.integers(0, 40)))
        out = rng.integers(0, V, int(rng.integers(0, 30)))
        st = PenaltyState(rep, pres, freq, prompt)
        for t in out:
            st.push(int(t))
        p = st.spec()
        assert p is not None
        got = row.copy()
        apply(got, p)
        ref = apply_ref(row, prompt, out, rep, pres, freq)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
        untouched = np.setdiff1d(np.arange(V), np.union1d(prompt, out))
        assert np.array_equal(got[untouched], row[untouched])  # only seen ids move


def test_state_counts_and_lists_each_id_once():
    st = PenaltyState(1.2, 0.1, 0.3, [5, 3, 5, 9])
    for t in (9, 4, 4, 7, 4):
        st.push(t)
    p = st.spec()
    assert sorted(p.seen.tolist()) == [3, 4, 5, 7, 9]
    assert dict(zip(p.out_ids.tolist(), p.out_counts.tolist())) == {9: 1, 4: 3, 7: 1}
    assert p.seen.dtype == p.out_ids.dtype == np.int32 and p.out_counts.dtype == np.float32
    # presence/frequency only: no repetition list to walk
    only_out = PenaltyState(1.0, 0.5, 0.0, [1, 2, 3])
    only_out.push(2)
    assert only_out.spec().seen.size == 0 and only_out.spec().out_ids.tolist() == [2]


def test_no_penalties_cost_nothing():
    st = PenaltyState.of(SamplingParams(), np.arange(1000))
    st.push(3)
    assert not st.active and st.spec() is None and not st.counts
    assert not SamplingParams().penalized and SamplingParams(presence_penalty=0.1).penalized


# The bundled model's greedy continuation of this prompt repeats itself.
LOOP = "List the colors: red, blue, red, blue, red, blue,"


def _max_repeat(ids: list[int]) -> int:
    return max(ids.count(t) for t in set(ids))


def test_penalties_on_the_real_model(generator):
    plain = generator.complete(LOOP, params=SamplingParams(max_tokens=24))
    assert _max_repeat(plain.token_ids) >= 6, plain.text  # the loop this test is about
    freq = generator.complete(LOOP, params=SamplingParams(max_tokens=24, frequency_penalty=1.0))
    rep = generator.complete(LOOP, params=SamplingParams(max_tokens=24, repetition_penalty=1.5))
    for r in (freq, rep):
        assert r.token_ids != plain.token_ids
        assert _max_repeat(r.token_ids) < _max_repeat(plain.token_ids), r.text
    # the repetition penalty covers the prompt: its first token is already penalised
    ids = generator.prompt_ids(LOOP)
    st = PenaltyState(1.5, 0.0, 0.0, ids)
    seq = generator.model.new_sequence()
    try:
        logits = generator.model.step([StepInput(seq, ids)])[0]
    finally:
        seq.release()
    penalised = logits.copy()
    apply(penalised, st.spec())
    assert rep.token_ids[0] == int(np.argmax(penalised))
    assert freq.token_ids[0] == plain.token_ids[0] == int(np.argmax(logits))  # no output yet
