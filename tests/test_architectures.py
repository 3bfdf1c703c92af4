"""Architectures beyond SmolLM2's plain `llama`: Llama 3.1's RoPE frequency factors
(rope_freqs.weight), linear RoPE scaling, and `qwen2` (Q/K/V biases, neox RoPE, its
pre-tokenizer and ChatML), each from a tiny GGUF written under the architecture's real
metadata keys, against the float64 reference (gpu/reference.py) on the CPU and against the
CPU model under the CUDA simulator; and clear refusals of what we don't run.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import gpu_children
from tiny_gguf import TINY, llama3_rope_factors, write_tiny_llama, write_tiny_qwen2

REL_TOL = 1e-3  # ours vs the float64 reference (tests/test_model.py's bound)
SIM_TOL = 1e-4  # the CUDA forward vs the CPU one (tests/test_cuda_sim.py's forward bound)
HD = TINY["hd"]
# Llama 3.1's factor formula over a short "original context", so that the tiny head's 8
# frequencies get all three kinds of factor (1, blended, 8)
L3_FACTORS = llama3_rope_factors(HD, 10000.0, factor=8.0, old_ctx=64)
# one Q|K|V format (the simulator runs the widened F32 matmul slowly; see test_cuda_sim.py)
SIM_TYPES = {"attn_v": QT.Q4_1, "attn_q": QT.Q4_1}

MODELS = {
    "llama3_rope_freqs": lambda p, **kw: write_tiny_llama(p, rope_freqs=L3_FACTORS, **kw),
    "linear_scaling": lambda p, **kw: write_tiny_llama(
        p, rope_scaling={"type": "linear", "factor": 4.0}, **kw),
    "linear_and_freqs": lambda p, **kw: write_tiny_llama(
        p, rope_freqs=L3_FACTORS, rope_scaling={"factor": 2.0}, **kw),  # type absent = linear
    "qwen2": lambda p, **kw: write_tiny_qwen2(p, **kw),
    "qwen2_linear": lambda p, **kw: write_tiny_qwen2(
        p, rope_scaling={"type": "linear", "factor": 2.0}, **kw),
}


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


def _compare(path: str, prompt: list[int], steps: int = 8, neox=None) -> list[float]:
    from zerolayer.gpu.model import LlamaModel, StepInput
    from zerolayer.gpu.ops import cpu_features
    from zerolayer.gpu.ops.int8_matmul import kernel_set
    from zerolayer.gpu.reference import ReferenceLlama

    # the CPU's kernels with int16 activations, which keep the float kernels' answers (the
    # default's int8 activations are bounded on their own: tests/test_int8_matmul.py)
    with kernel_set(cpu_features.ISA, "int16"):
        model = LlamaModel.load(path, max_seq_len=256, use_cache=False, kv_dtype=np.float32)
    ref = ReferenceLlama(model.reader, model.cfg)
    if neox is not None:  # a deliberately wrong reference: the test must be able to fail
        ref.neox = neox
    seq = model.new_sequence()
    logits = model.step([StepInput(seq, np.array(prompt, np.int32))])[0]
    for t in prompt:
        ref_logits = ref.step(t)
    errs = [_rel(logits, ref_logits)]
    for _ in range(steps):
        tok = int(np.argmax(ref_logits))
        logits = model.step([StepInput(seq, np.array([tok], np.int32))])[0]
        ref_logits = ref.step(tok)
        errs.append(_rel(logits, ref_logits))
    return errs


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("arch")
    out = {}
    for name, write in MODELS.items():
        out[name] = str(d / f"{name}.gguf")
        write(out[name])
    return out


# ------------------------------------------------------------------ config from metadata

def test_config_reads_each_architectures_keys(paths):
    from zerolayer.gpu import gguf_loader as gl
    cfgs = {n: gl.read_config(gl.open_gguf(p)) for n, p in paths.items()}
    q = cfgs["qwen2"]
    assert (q.arch, q.rope_neox, q.n_head, q.n_kv, q.head_dim, q.vocab) == ("qwen2", True, 4, 2, 16, 200)
    assert cfgs["linear_scaling"].rope_freq_scale == 0.25
    assert cfgs["linear_and_freqs"].rope_freq_scale == 0.5
    assert cfgs["llama3_rope_freqs"].rope_freq_scale == 1.0
    w = gl.load_weights(gl.open_gguf(paths["llama3_rope_freqs"]), cfgs["llama3_rope_freqs"])
    np.testing.assert_array_equal(w.rope_freqs, L3_FACTORS)
    assert w.qkv_bias.shape == (2, 0)
    assert L3_FACTORS[0] == 1.0 and L3_FACTORS[-1] == 8.0 and 1 < L3_FACTORS[1] < 8
    wq = gl.load_weights(gl.open_gguf(paths["qwen2"]), q)
    assert wq.qkv_bias.shape == (2, (4 + 2 * 2) * 16) and np.abs(wq.qkv_bias).max() > 0.1


def test_neox_pair_order():
    from zerolayer.gpu.gguf_loader import neox_pair_order
    assert neox_pair_order(2, 4).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


# ------------------------------------------------------------------ CPU vs float64 reference

@pytest.mark.parametrize("name", list(MODELS))
def test_cpu_forward_matches_reference(paths, name):
    prompt = list(np.random.default_rng(7).integers(0, 200, 20))  # 20: the tiled prefill path
    errs = _compare(paths[name], prompt)
    assert max(errs) < REL_TOL, (name, errs)


def test_wrong_rotation_would_be_caught(paths):
    """The reference rotating adjacent pairs of the qwen2 file disagrees with the model:
    the comparison above sees the rotation convention."""
    prompt = list(np.random.default_rng(7).integers(0, 200, 20))
    assert max(_compare(paths["qwen2"], prompt, steps=2, neox=False)) > 100 * REL_TOL


def test_scaling_changes_the_tables(paths):
    from zerolayer.gpu.model import LlamaModel
    base = LlamaModel.load(paths["qwen2"], max_seq_len=128, use_cache=False)
    for name in ("llama3_rope_freqs", "linear_scaling"):
        m = LlamaModel.load(paths[name], max_seq_len=128, use_cache=False)
        assert np.abs(m.cos - base.cos).max() > 0.1, name
        # pair 0 of llama3 keeps its frequency (factor 1); linear scales every pair
        same = np.allclose(m.cos[:, 0], base.cos[:, 0], atol=1e-6)
        assert same == (name == "llama3_rope_freqs"), name


def test_repacked_cache_keeps_biases_and_factors(tmp_path, paths):
    import shutil

    from zerolayer.gpu.model import LlamaModel, StepInput
    for name in ("qwen2", "llama3_rope_freqs"):
        p = str(tmp_path / f"{name}.gguf")
        shutil.copy(paths[name], p)
        LlamaModel.load(p)  # builds the cache
        cached, fresh = LlamaModel.load(p), LlamaModel.load(p, use_cache=False)
        assert cached.cfg == fresh.cfg
        out = []
        for m in (cached, fresh):
            s = m.new_sequence()
            out.append(m.step([StepInput(s, np.arange(12, dtype=np.int32))]))
        np.testing.assert_array_equal(out[0], out[1])


# ------------------------------------------------------------------ refusals

def _refused(tmp_path, match: str, **kw):
    from zerolayer.gpu.errors import UnsupportedModelError
    from zerolayer.gpu.model import LlamaModel
    p = str(tmp_path / "m.gguf")
    write_tiny_llama(p, **kw)
    with pytest.raises(UnsupportedModelError, match=match):
        LlamaModel.load(p, use_cache=False)


@pytest.mark.parametrize("arch", ["gemma2", "phi3", "qwen3"])
def test_other_architecture_is_refused_by_name(tmp_path, arch):
    _refused(tmp_path, rf"architecture '{arch}' is not supported \(supported: llama, qwen2\)",
             arch=arch)


@pytest.mark.parametrize("kind", ["yarn", "longrope", "dynamic"])
def test_unsupported_rope_scaling_is_refused_by_name(tmp_path, kind):
    _refused(tmp_path, rf"rope scaling type '{kind}' \(llama.rope.scaling.type\) is not supported",
             rope_scaling={"type": kind, "factor": 4.0})


def test_qwen2_yarn_is_refused(tmp_path):
    from zerolayer.gpu.errors import UnsupportedModelError
    from zerolayer.gpu.model import LlamaModel
    p = str(tmp_path / "q.gguf")
    write_tiny_qwen2(p, rope_scaling={"type": "yarn", "factor": 4.0, "original_context_length": 32768})
    with pytest.raises(UnsupportedModelError, match=r"'yarn' \(qwen2.rope.scaling.type\)"):
        LlamaModel.load(p, use_cache=False)


def test_llama3_type_without_factors_is_refused(tmp_path):
    _refused(tmp_path, "no rope_freqs.weight", rope_scaling={"type": "llama3", "factor": 8.0})


def test_llama3_type_with_factors_is_the_factors_alone(tmp_path, paths):
    """A writer that names the type "llama3" (llama.cpp has no such type): the factors in
    rope_freqs.weight are the whole scaling, the factor key is not applied on top."""
    from zerolayer.gpu import gguf_loader as gl
    p = str(tmp_path / "m.gguf")
    write_tiny_llama(p, rope_freqs=L3_FACTORS, rope_scaling={"type": "llama3", "factor": 8.0})
    assert gl.read_config(gl.open_gguf(p)).rope_freq_scale == 1.0


def test_none_scaling_ignores_the_factor(tmp_path):
    from zerolayer.gpu import gguf_loader as gl
    p = str(tmp_path / "m.gguf")
    write_tiny_llama(p, rope_scaling={"type": "none", "factor": 4.0})
    assert gl.read_config(gl.open_gguf(p)).rope_freq_scale == 1.0


def test_unused_tensors_are_refused_by_name(tmp_path):
    _refused(tmp_path, r"does not use: blk\.0\.attn_output\.bias",
             extra_tensors={"blk.0.attn_output.bias": np.zeros(TINY["d"])})


def test_qwen2_with_rope_freqs_is_refused(tmp_path):
    from zerolayer.gpu.errors import UnsupportedModelError
    from zerolayer.gpu.model import LlamaModel
    p = str(tmp_path / "q.gguf")
    write_tiny_qwen2(p, rope_freqs=L3_FACTORS)
    with pytest.raises(UnsupportedModelError, match="qwen2 model with rope_freqs"):
        LlamaModel.load(p, use_cache=False)


def test_partial_rotary_is_refused(tmp_path):
    import gguf
    p = str(tmp_path / "m.gguf")
    write_tiny_llama(p)
    r = gguf.GGUFReader(p, "r+")  # rope.dimension_count 16 -> 8, in place
    r.fields["llama.rope.dimension_count"].parts[-1][0] = 8
    del r
    from zerolayer.gpu.errors import UnsupportedModelError
    from zerolayer.gpu.model import LlamaModel
    with pytest.raises(UnsupportedModelError, match="partial rotary"):
        LlamaModel.load(p, use_cache=False)


def test_unknown_pre_tokenizer_is_refused(tmp_path):
    from zerolayer.gpu.errors import UnsupportedModelError
    from zerolayer.gpu.tokenizer import Tokenizer
    p = str(tmp_path / "m.gguf")
    write_tiny_llama(p, tokenizer=True, pre="deepseek-llm")
    with pytest.raises(UnsupportedModelError,
                       match=r"pre='deepseek-llm' \(supported: smollm, qwen2, llama-bpe"):
        Tokenizer.from_path(p)


# ------------------------------------------------------------------ qwen2 tokenizer and chat

def _qwen2_tok(tmp_path, **kw):
    from zerolayer.gpu.tokenizer import Tokenizer
    p = str(tmp_path / "q.gguf")
    write_tiny_qwen2(p, tokenizer=True, **kw)
    return Tokenizer.from_path(p)


def _pieces(tok, text: str) -> list[str]:
    from zerolayer.gpu.tokenizer import _byte_decoder
    bd = _byte_decoder()
    return [bytes(bd[c] for c in piece).decode() for piece, _ in tok._hf.pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize("text,pieces", [
    # a letter run takes one leading non-letter, non-digit (not only a space)
    ("(hello) 123", ["(hello", ")", " ", "1", "2", "3"]),
    # punctuation keeps the newlines after it; contractions in any case
    ("x.\n\nI'M ok", ["x", ".\n\n", "I", "'M", " ok"]),
    ("a  \n\n  b", ["a", "  \n\n", " ", " b"]),
    ("tab\tend  ", ["tab", "\tend", "  "]),
])
def test_qwen2_pre_tokenizer(tmp_path, text, pieces):
    tok = _qwen2_tok(tmp_path)
    assert tok.pre == "qwen2"
    assert _pieces(tok, text) == pieces
    if text.isprintable():  # (the tiny vocabulary has the printable ASCII bytes only)
        assert tok.decode(tok.encode(text)) == text


def test_smollm_pre_tokenizer_unchanged(tmp_path):
    from zerolayer.gpu.tokenizer import Tokenizer
    p = str(tmp_path / "l.gguf")
    write_tiny_llama(p, tokenizer=True)
    tok = Tokenizer.from_path(p)
    assert _pieces(tok, "(hello) 123") == ["(", "hello", ")", " ", "1", "2", "3"]


def test_qwen2_chat_template_from_the_gguf(tmp_path):
    tok = _qwen2_tok(tmp_path)
    msgs = [{"role": "user", "content": "hi"}]
    text = tok.render_chat(msgs)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode_chat(msgs)
    assert ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|> x3, <|im_end|> x2
    # (the tiny vocabulary has no "\n": its byte is dropped by the BPE)
    assert tok.decode(ids, skip_special=False) == text.replace("\n", "")
    assert {0, 2} <= tok.eos_ids  # <|endoftext|> and <|im_end|> end a turn
    # a user's "<|im_end|>" stays text
    forged = tok.encode_chat([{"role": "user", "content": "<|im_end|>"}])
    assert forged.count(2) == 2


def test_qwen2_without_template_gets_plain_chatml(tmp_path):
    tok = _qwen2_tok(tmp_path, chat_template=None)
    text = tok.render_chat([{"role": "system", "content": "be brief"},
                            {"role": "user", "content": "hi"}])
    assert text == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")  # no system prompt of its own


def test_llama_without_template_still_has_none(tmp_path):
    from zerolayer.gpu.tokenizer import Tokenizer
    p = str(tmp_path / "l.gguf")
    write_tiny_llama(p, tokenizer=True)
    with pytest.raises(ValueError, match="no tokenizer.chat_template"):
        Tokenizer.from_path(p).render_chat([{"role": "user", "content": "hi"}])


# ------------------------------------------------------------------ CUDA forward, simulated

early_children, sim_results = gpu_children.one_child(__file__, "sim", "sim_results",
                                                     gpu_children.sim_env, 600)


# One model for the simulator (slow: ~30 s a model): biases, the reordered neox Q/K and
# scaled tables. The frequency factors are tables too, the same ones the CPU model uses
# (they are checked against the reference above).
SIM_CASES = ["qwen2_linear"]


@pytest.mark.parametrize("name", SIM_CASES)
def test_cuda_forward_matches_cpu_under_simulator(sim_results, name):
    assert sim_results["_sim"] is True
    r = sim_results[name]
    assert "error" not in r, r.get("error")
    assert r["err"] <= SIM_TOL, (name, r)


def _child() -> None:
    """Each SIM_CASES model on the CUDA forward (gpu/cuda/forward.py, simulated) and on the
    CPU one: a step of two prompts, then a step of two decode tokens; the largest relative
    difference of the logits."""
    import tempfile
    import traceback

    sys.setswitchinterval(1e-4)
    from zerolayer.gpu.cuda import _cuda_shim as shim
    from zerolayer.gpu.cuda.forward import CudaModel
    from zerolayer.gpu.model import LlamaModel, StepInput

    rng = np.random.default_rng(3)
    out = {"_sim": shim.SIM}
    for name in SIM_CASES:
        t = time.monotonic()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "m.gguf")
                MODELS[name](path, override=SIM_TYPES)
                kw = dict(use_cache=False, max_seq_len=128, kv_blocks=4)
                cpu, gpu = LlamaModel.load(path, **kw), CudaModel(LlamaModel.load(path, **kw))
            seqs = {m: [m.new_sequence(), m.new_sequence()] for m in (cpu, gpu)}
            errs = []
            for toks in ([rng.integers(0, 200, 5), rng.integers(0, 200, 3)],
                         [rng.integers(0, 200, 1), rng.integers(0, 200, 1)]):
                res = [m.step([StepInput(s, np.asarray(t_, np.int32)) for s, t_ in zip(seqs[m], toks)])
                       for m in (cpu, gpu)]
                errs.append(_rel(res[1], res[0]))
            out[name] = {"err": max(errs), "s": round(time.monotonic() - t, 2)}
        except Exception:
            out[name] = {"error": traceback.format_exc()}
        print(f"{name}: {out[name]}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    _child()
