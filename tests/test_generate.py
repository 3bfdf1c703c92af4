"""The Generator API end to end on the bundled model: real text, sampling, stops, limits."""
from __future__ import annotations

import pytest

from answers import FRANCE_ANSWER, FRANCE_ENDS_TURN, FRANCE_QUESTION
from zerolayer.gpu.errors import ContextOverflowError
from zerolayer.gpu.generate import SamplingParams
from zerolayer.gpu.stopping import StopChecker
from zerolayer.protocol.errors import ErrorCode

FRANCE = [{"role": "user", "content": FRANCE_QUESTION}]


def test_france_answer_streamed(generator):
    chunks = list(generator.generate(messages=FRANCE, params=SamplingParams(max_tokens=48)))
    res = generator.last
    assert FRANCE_ANSWER in "".join(chunks)
    assert "".join(chunks) == res.text
    assert len(chunks) >= 3  # streamed, not one blob
    assert res.finish_reason == ("stop" if FRANCE_ENDS_TURN else "length")
    assert res.completion_tokens == len(res.token_ids) <= 48
    assert res.prompt_tokens == 37


def test_seed_makes_sampling_reproducible(generator):
    p = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95, top_k=50, seed=1234)
    a = generator.complete("Once upon a time", params=p).text
    b = generator.complete("Once upon a time", params=p).text
    assert a == b
    others = {generator.complete("Once upon a time", params=SamplingParams(
        max_tokens=24, temperature=1.0, top_p=0.95, top_k=50, seed=s)).text for s in range(4)}
    assert len(others) > 1  # the seed matters


def test_max_tokens_and_stop_strings(generator):
    r = generator.complete("1, 2, 3, 4, 5,", params=SamplingParams(max_tokens=5))
    assert r.finish_reason == "length" and r.completion_tokens == 5
    r = generator.complete("1, 2, 3, 4, 5,", params=SamplingParams(max_tokens=40, stop=(" 9",)))
    assert r.finish_reason == "stop" and " 9" not in r.text and "8" in r.text


def test_over_long_prompt_is_context_overflow(generator):
    with pytest.raises(ContextOverflowError) as e:
        list(generator.generate("word " * 3000, params=SamplingParams(max_tokens=8)))
    assert e.value.limit == 2048 and e.value.code is ErrorCode.CONTEXT_OVERFLOW
    # the runtime is still healthy afterwards
    assert FRANCE_ANSWER in generator.complete(messages=FRANCE, params=SamplingParams(max_tokens=16)).text


def test_token_ids_payload(generator):
    ids = generator.tokenizer.encode_chat(FRANCE)
    assert FRANCE_ANSWER in generator.complete(token_ids=ids, params=SamplingParams(max_tokens=16)).text


@pytest.mark.parametrize("pieces,stops,expected,stopped", [
    (["Hel", "lo wo", "rld"], ["wor"], "Hello ", True),
    (["ab", "c", "d"], ["cx"], "abcd", False),       # a held-back prefix is released
    (["a<", "|e", "nd|>b"], ["<|end|>"], "a", True),
    (["x"], [], "x", False),
])
def test_stop_checker(pieces, stops, expected, stopped):
    s = StopChecker(stops)
    out = "".join(s.push(p) for p in pieces) + s.flush()
    assert out == expected and s.stopped == stopped


def test_kernel_builds_are_reported_while_they_happen():
    """A first start reports each kernel that takes a while to build, with a
    running count (gpu/jit_progress.py), instead of compiling in silence."""
    import numba

    from zerolayer.gpu.jit_progress import report_compiles

    @numba.njit(cache=False)
    def _fresh_kernel(x):
        return x * 2 + 1

    lines: list[str] = []
    with report_compiles(lines.append, min_s=0.0, prefix=__name__) as built:
        assert _fresh_kernel(3) == 7
        assert _fresh_kernel(4) == 9          # compiled once
    assert built.done == 1 and built.slow == 1
    assert len(lines) == 1 and "compiling kernels: 1 built" in lines[0]
    assert "_fresh_kernel" in lines[0]
    with report_compiles(lines.append, min_s=0.0, prefix=__name__):
        _fresh_kernel(5)                      # nothing new to build: silent
    assert len(lines) == 1
