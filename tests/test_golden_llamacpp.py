"""Against llama.cpp: logits recorded by scripts/make_golden.py (llama-cpp-python, same GGUF).

A Q4_1 llama.cpp quantizes activations to 8 bits, so its logits differ from an exact
evaluation by up to ~2; the checks are what must hold anyway, over 16 teacher-forced steps
(we feed llama.cpp's own tokens):
* the same prompt ids;
* llama.cpp's greedy token within 1.5 of our best logit;
* the same top-5 candidates but for near-ties: a candidate may only trade places with one
  that is within the margin of our 5th logit, and at least 3 of the 5 are shared. (Exact set
  equality fails at near-ties: at 5 of 68 steps the 5th and 6th logits differ by under 0.1,
  less than llama.cpp's own quantization error. Our default int8 activations are noisy the
  same way: the same kernels compiled in the process or loaded from Numba's cache differ by
  an ulp in attention, which int8 rounding turns into logits 0.1 apart on average here, 0.7
  at most; at step 6 of the chat case five candidates lie within 0.3, and either build
  shares only 3 or 4 of llama.cpp's top 5. Their KL divergence from the float model is
  bounded in test_accuracy.py; with int16 activations our logits match a float64
  evaluation to ~1e-6, see test_model.py.)
* llama.cpp's top-5 logits within 2.0 of ours.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zerolayer.gpu.model import StepInput

GOLDEN = json.loads((Path(__file__).parent / "golden" / "llamacpp_golden.json").read_text())
MARGIN = 1.5
LOGIT_TOL = 2.0


@pytest.mark.parametrize("case", GOLDEN["logits"], ids=lambda c: c["prompt"][:30].replace("\n", " "))
def test_teacher_forced_steps_match_llamacpp(generator, case):
    tok, model = generator.tokenizer, generator.model
    ids = tok.encode_chat(case["messages"]) if case.get("messages") else tok.encode(case["prompt"])
    assert ids == case["prompt_ids"]
    seq = model.new_sequence()
    try:
        logits = model.step([StepInput(seq, np.array(ids, np.int32))])[0]
        assert len(case["steps"]) == 17
        for i, step in enumerate(case["steps"]):
            order = np.argsort(-logits)
            ours5, theirs5 = set(order[:5].tolist()), set(step["top5_ids"])
            fifth = logits[order[4]]
            for t in ours5 ^ theirs5:  # a swap at the boundary must be a near-tie
                assert fifth - logits[t] <= MARGIN, (i, t, sorted(ours5), sorted(theirs5))
            assert len(ours5 & theirs5) >= 3, (i, sorted(ours5), sorted(theirs5))
            theirs = np.array(step["top5_logits"])
            assert np.abs(logits[step["top5_ids"]] - theirs).max() <= LOGIT_TOL, i
            gold = step["next_id"]
            assert logits.max() - logits[gold] <= MARGIN, (i, float(logits.max()), float(logits[gold]))
            logits = model.step([StepInput(seq, np.array([gold], np.int32))])[0]
    finally:
        seq.release()
