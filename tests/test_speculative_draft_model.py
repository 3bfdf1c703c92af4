"""Speculative decoding with a draft model ([engine] draft_model, gpu/draft_model.py).

Target: the bundled SmolLM2-135M (Q4_1). Draft: the same model re-quantized to Q4_0
(tests/draft_gguf.py writes it): the same vocabulary, other weights, so its guesses are often
but not always the target's. Greedy output is token for token the plain decoder's, in fewer
steps; sampled output keeps its distribution; a draft sequence rolled back after a rejection
guesses exactly what a fresh one would; a draft file with another vocabulary is refused at
start, naming the setting.
"""
from __future__ import annotations

import argparse
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from daemon_proc import DaemonProc
from draft_gguf import write_requantized
from test_engine import Recorder, run
from test_speculative import CHATS, Tally, _chi2_p, chat_ids
from tiny_gguf import write_tiny_llama
from zerolayer.daemon import config, startup
from zerolayer.daemon.engine import Engine
from zerolayer.daemon.request import Admitted
from zerolayer.gpu.draft_model import DraftModel, VocabMismatchError, check_vocab
from zerolayer.protocol.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def draft_path(model_path, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("draft") / "SmolLM2-135M-Instruct.Q4_0.gguf"
    write_requantized(model_path, str(path), QT.Q4_0)
    return str(path)


@pytest.fixture(scope="module")
def drafter(generator, draft_path) -> DraftModel:
    return DraftModel.load(draft_path, generator.model, max_sequences=16)


def serve(generator, requests, drafter: DraftModel | None, speculative: bool = True):
    rec = Tally()
    eng = Engine(generator.model, generator.tokenizer, emit=rec, max_running=16,
                 max_waiting=max(len(requests), 1), step_tokens=256, speculative=speculative,
                 drafter=drafter)
    reqs = {key: eng.submit(Admitted(key, params), ids) for key, ids, params in requests}
    run(eng, limit=20000)
    eng.prefix.clear()
    assert generator.model.arena.free_blocks == generator.model.arena.n_blocks
    if drafter is not None:  # every request's draft sequence went back with it
        a = drafter.model.arena
        assert a.free_blocks == a.n_blocks
    rec.tokens = {k: list(r.tokens) for k, r in reqs.items()}
    return rec, eng


def test_greedy_with_a_draft_model_is_token_identical(generator, drafter):
    params = [SamplingParams(max_tokens=48), SamplingParams(max_tokens=5),
              SamplingParams(max_tokens=48, stop=(",",)),
              SamplingParams(max_tokens=24, repetition_penalty=1.3)]  # never drafts
    requests = [(i * 10 + j, chat_ids(generator, c), p)
                for i, c in enumerate(CHATS) for j, p in enumerate(params)]
    plain, plain_eng = serve(generator, requests, None, speculative=False)
    before = drafter.forward_tokens
    spec, eng = serve(generator, requests, drafter)
    assert not spec.errors and not plain.errors
    assert spec.tokens == plain.tokens
    assert spec.text == plain.text
    assert {k: (r, u.completion_tokens) for k, (r, u, _) in spec.done.items()} == \
        {k: (r, u.completion_tokens) for k, (r, u, _) in plain.done.items()}
    assert drafter.forward_tokens > before  # the guesses came from the draft model
    # guesses kept and rejected (rollbacks exercised), fewer steps than tokens
    assert 0 < eng.accepted_tokens < eng.drafted_tokens
    assert eng.steps < plain_eng.steps
    assert all(spec.spec[k] == (0, 0) for k, _, p in requests if p.penalized)
    # free chat too: the draft model guesses where lookup in the text has nothing
    assert spec.spec[40][1] > 0  # "Write a short poem about the sea."
    for k in (30, 40):  # one request alone decodes in fewer steps than it has tokens
        solo, e = serve(generator, [requests[[r[0] for r in requests].index(k)]], drafter)
        assert solo.tokens[k] == plain.tokens[k]
        assert e.steps - 1 < len(solo.tokens[k])  # (its first token came from the prefill)


def test_a_rolled_back_draft_sequence_guesses_as_a_fresh_one(generator, drafter):
    """After a partial rejection the draft sequence is cut back to what the text shares
    with it; its next guesses are those of a sequence that never saw the rejected ones."""
    ctx = chat_ids(generator, CHATS[4])
    s = drafter.new_state()
    try:
        g = drafter.propose([(s, ctx, 4)])[0]
        assert len(g) == 4
        wrong = np.int32((int(g[1]) + 1) % generator.model.cfg.vocab)
        ctx2 = np.concatenate((ctx, g[:1], [wrong])).astype(np.int32)  # 1 kept, 1 corrected
        again = drafter.propose([(s, ctx2, 3)])[0]
        assert s.seq.length == len(ctx2) + 2 and s.fed.tolist() == ctx2.tolist() + again[:2].tolist()
        fresh = drafter.new_state()
        try:
            assert again.tolist() == drafter.propose([(fresh, ctx2, 3)])[0].tolist()
        finally:
            fresh.release()
    finally:
        s.release()


def test_sampled_output_keeps_its_distribution(generator, drafter):
    """As test_speculative's check: over many seeds the tokens at drafted positions follow
    the plain sampler's distribution (the draft model's guess never depends on the draws)."""
    ids = np.array(generator.tokenizer.encode(
        "one two three four five six seven eight, one two three four five six seven eight, "
        "one two three"), np.int32)
    n = 240
    params = [SamplingParams(max_tokens=4, temperature=1.5, seed=s) for s in range(n)]
    plain, _ = serve(generator, [(s, ids, p) for s, p in enumerate(params)], None, False)
    spec, eng = serve(generator, [(s, ids, p) for s, p in enumerate(params)], drafter)
    assert 0 < eng.accepted_tokens < eng.drafted_tokens
    for pos in (1, 2):
        a = Counter(tuple(t[:pos + 1]) for t in plain.tokens.values() if len(t) > pos)
        b = Counter(tuple(t[:pos + 1]) for t in spec.tokens.values() if len(t) > pos)
        assert _chi2_p(a, b) > 1e-3, (pos, a.most_common(5), b.most_common(5))


# ---- refusing a draft in another vocabulary ----------------------------------------------
@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("other") / "tiny-vocab.gguf"
    write_tiny_llama(str(path), tokenizer=True)
    return str(path)


def test_a_draft_with_another_vocabulary_is_refused(generator, other_vocab):
    with pytest.raises(VocabMismatchError, match="tokens"):
        DraftModel.load(other_vocab, generator.model, max_sequences=1)
    with pytest.raises(config.ConfigError, match=r"engine\.draft_model .*tiny-vocab\.gguf"):
        startup.load_drafter(other_vocab, generator.model, 1, False, lambda *a: None)
    with pytest.raises(config.ConfigError, match=r"engine\.draft_model .*not found"):
        startup.load_drafter(other_vocab + ".missing", generator.model, 1, False, lambda *a: None)


def test_same_size_vocabularies_are_compared_token_by_token():
    def fake(tokens):
        return SimpleNamespace(cfg=SimpleNamespace(vocab=len(tokens)),
                               tokenizer_meta={"tokens": tokens})
    check_vocab(fake(["a", "b", "c"]), fake(["a", "b", "c"]))
    with pytest.raises(VocabMismatchError, match="token 1 is 'x'"):
        check_vocab(fake(["a", "b", "c"]), fake(["a", "x", "c"]))
    with pytest.raises(VocabMismatchError, match="no tokenizer"):
        check_vocab(fake(["a"]), SimpleNamespace(cfg=SimpleNamespace(vocab=1), tokenizer_meta=None))


def test_the_setting_through_file_environment_and_flag(tmp_path):
    ap = argparse.ArgumentParser()
    config.add_flags(ap)
    toml = tmp_path / "z.toml"
    toml.write_text('[engine]\ndraft_model = "/models/a.gguf"\n')
    assert config.load(ap.parse_args(["--config", str(toml)]), environ={}).engine.draft_model \
        == "/models/a.gguf"
    assert config.load(ap.parse_args([]), environ={"ZEROLAYER_ENGINE_DRAFT_MODEL": "/b.gguf"}
                       ).engine.draft_model == "/b.gguf"
    args = ap.parse_args(["--config", str(toml), "--engine-draft-model", "/c.gguf"])
    assert config.load(args, environ={}).engine.draft_model == "/c.gguf"
    assert config.DaemonConfig().engine.draft_model == ""  # n-gram lookup by default


def test_the_daemon_refuses_to_start_with_another_vocabulary(tmp_path, other_vocab):
    d = DaemonProc(tmp_path, "--engine-draft-model", other_vocab, "--lifecycle-warmup", "false",
                   wait_ready=False)
    rc = d.wait(timeout=600)
    log = "".join(d.log)
    assert rc == 2, log
    assert "cannot start: engine.draft_model" in log and "tokens" in log, log
    assert "ready on" not in log


def test_the_engine_runs_a_named_draft_model(generator, draft_path):
    """startup.load_drafter as the engine thread calls it: the draft model, warm, ready."""
    logs: list[str] = []
    d = startup.load_drafter(draft_path, generator.model, 2, True, lambda m, *a: logs.append(m))
    assert isinstance(d, DraftModel) and "same vocabulary" in logs[-1]
    rec = Recorder()
    eng = Engine(generator.model, generator.tokenizer, emit=rec, drafter=d)
    eng.submit(Admitted(0, SamplingParams(max_tokens=16)), chat_ids(generator, CHATS[3]))
    run(eng)
    eng.prefix.clear()
    assert eng.drafted_tokens > 0 and d.forward_tokens > 0 and not rec.errors
    assert generator.model.arena.free_blocks == generator.model.arena.n_blocks
    assert d.model.arena.free_blocks == d.model.arena.n_blocks


def test_check_lists_a_draft_with_another_vocabulary(tmp_path, other_vocab):
    from test_config import _keys, _zerolayerd
    r = _zerolayerd("--check", "--security-keys-file", _keys(tmp_path),
                    "--engine-draft-model", other_vocab)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "FAIL model: engine.draft_model" in r.stdout and "problem(s)" in r.stdout


class FailingDraft(DraftModel):
    """A draft model whose passes fail (a fault injected into the real one)."""

    def propose(self, jobs):
        super().propose(jobs[:1])  # some draft sequences advanced before the failure
        raise RuntimeError("draft pass failed")


def test_a_failing_draft_model_costs_only_its_drafts(generator, drafter):
    ids = chat_ids(generator, CHATS[3])
    plain, _ = serve(generator, [(0, ids, SamplingParams(max_tokens=16))], None, False)
    bad = FailingDraft(drafter.model)
    got, eng = serve(generator, [(0, ids, SamplingParams(max_tokens=16))], bad)
    assert got.tokens == plain.tokens and not got.errors
    assert eng.draft_failures > 0 and eng.drafted_tokens == 0
