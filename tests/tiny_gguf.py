"""Write a tiny random Llama GGUF with every supported tensor type, for loader/model tests.

Mixed types on purpose: Q4_0, Q4_1, Q8_0, F16 and F32 all appear, Q|K|V mixes formats (so
the loader must widen), row counts aren't multiples of the kernels' 64-row groups, and the
LM head is untied.

Other architectures are written under their own metadata keys (the writer prefixes each key
with the architecture's name, as llama.cpp's converter does): ``write_tiny_qwen2`` writes
what a converted Qwen2 has (Q/K/V biases, a tied LM head, no rope.dimension_count or
vocab_size keys, the `qwen2` pre-tokenizer and a ChatML template).
"""
from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

TINY = dict(n_layer=2, d=64, ff=96, n_head=4, n_kv=2, hd=16, vocab=200, ctx=256)


def _tensor(w: gguf.GGUFWriter, name: str, arr: np.ndarray, qt: QT) -> None:
    if qt == QT.F32:
        w.add_tensor(name, arr.astype(np.float32))
    elif qt == QT.F16:
        w.add_tensor(name, arr.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), qt), raw_dtype=qt)


def _byte_char(b: int) -> str:
    """GPT-2 byte-level BPE's printable stand-in for a byte (only 32..126 needed here)."""
    return "\u0120" if b == 32 else chr(b)


def tiny_vocab(n: int) -> list[str]:
    """Three specials (<|endoftext|>, <|im_start|>, <|im_end|>), the printable ASCII bytes,
    "hi" (the one merge), then distinct multi-character tokens up to n (decodable; never
    produced by merges)."""
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [_byte_char(b) for b in range(32, 127)]
    toks += ["hi"] + [f"w{i}" for i in range(n - len(toks) - 1)]
    return toks[:n]


# Qwen2-Instruct's chat template (as its GGUFs carry it): ChatML with a default system turn
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def llama3_rope_factors(hd: int, base: float, factor: float = 8.0, low: float = 1.0,
                        high: float = 4.0, old_ctx: int = 8192) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter computes it from a Llama 3.1 config
    (rope_scaling.rope_type = "llama3"): 1 for short wavelengths, `factor` for long ones, a
    smooth blend between."""
    freqs = 1.0 / base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def write_tiny_llama(path: str, seed: int = 0, arch: str = "llama",
                     override: dict[str, QT] | None = None, tokenizer: bool = False,
                     config: dict | None = None, tied: bool = False, *,
                     qkv_bias: bool = False, rope_freqs: np.ndarray | None = None,
                     rope_scaling: dict | None = None, pre: str = "smollm",
                     chat_template: str | None = None, shape_keys: bool = True,
                     extra_tensors: dict[str, np.ndarray] | None = None) -> None:
    """tokenizer=True adds a small byte-level BPE vocabulary (eos = <|im_end|>, id 2), enough
    for the daemon to load the model and detokenize what it generates; prompts are then sent
    as token ids. config: other shapes (TINY's keys; bench/gpu_bench.py writes SmolLM2's);
    tied: no output.weight, the LM head is the embedding (as in SmolLM2).
    qkv_bias: blk.N.attn_{q,k,v}.bias (F32); rope_freqs: the rope_freqs.weight tensor;
    rope_scaling: {arch}.rope.scaling.* keys ({"type": "linear", "factor": 4.0, ...});
    pre / chat_template: tokenizer.ggml.pre and tokenizer.chat_template; shape_keys=False
    leaves out rope.dimension_count and vocab_size (optional keys, absent from Qwen2 files);
    extra_tensors: more F32 tensors by name (refusal tests). override keys: a tensor kind
    ("attn_v") for every layer, or one layer's ("blk.1.attn_v"), as llama.cpp's mixes have."""
    c = config or TINY
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(c["n_layer"])
    w.add_context_length(c["ctx"])
    w.add_embedding_length(c["d"])
    w.add_feed_forward_length(c["ff"])
    w.add_head_count(c["n_head"])
    w.add_head_count_kv(c["n_kv"])
    if shape_keys:
        w.add_rope_dimension_count(c["hd"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if shape_keys:
        w.add_vocab_size(c["vocab"])
    for k, v in (rope_scaling or {}).items():
        key = f"{arch}.rope.scaling.{k}"
        if isinstance(v, str):
            w.add_string(key, v)
        else:
            w.add_float32(key, float(v))
    if tokenizer:
        toks = tiny_vocab(c["vocab"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(toks)
        w.add_token_types([3 if t.startswith("<|") else 1 for t in toks])
        w.add_token_merges(["h i"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        if chat_template is not None:
            w.add_chat_template(chat_template)
    d, ff, dq, dkv = c["d"], c["ff"], c["n_head"] * c["hd"], c["n_kv"] * c["hd"]
    types = {"attn_q": QT.Q4_0, "attn_k": QT.Q4_1, "attn_v": QT.F16, "attn_output": QT.Q4_1,
             "ffn_gate": QT.Q4_0, "ffn_up": QT.Q4_0, "ffn_down": QT.Q8_0}
    types.update(override or {})
    shapes = {"attn_q": (dq, d), "attn_k": (dkv, d), "attn_v": (dkv, d), "attn_output": (d, dq),
              "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}
    embd_type = override.get("token_embd", QT.Q8_0) if override else QT.Q8_0
    _tensor(w, "token_embd.weight", rng.standard_normal((c["vocab"], d)), embd_type)
    for i in range(c["n_layer"]):
        for k, shp in shapes.items():
            qt = (override or {}).get(f"blk.{i}.{k}", types[k])  # one layer's own type
            _tensor(w, f"blk.{i}.{k}.weight", rng.standard_normal(shp) * 0.3, qt)
        _tensor(w, f"blk.{i}.attn_norm.weight", 1 + 0.1 * rng.standard_normal(d), QT.F32)
        _tensor(w, f"blk.{i}.ffn_norm.weight", 1 + 0.1 * rng.standard_normal(d), QT.F32)
    if qkv_bias:  # after the weights: the random stream of the weights stays the same
        for i in range(c["n_layer"]):
            for k, n in (("attn_q", dq), ("attn_k", dkv), ("attn_v", dkv)):
                _tensor(w, f"blk.{i}.{k}.bias", 0.5 * rng.standard_normal(n), QT.F32)
    _tensor(w, "output_norm.weight", 1 + 0.1 * rng.standard_normal(d), QT.F32)
    if not tied:
        _tensor(w, "output.weight", rng.standard_normal((c["vocab"], d)), QT.F16)
    if rope_freqs is not None:
        _tensor(w, "rope_freqs.weight", np.asarray(rope_freqs), QT.F32)
    for name, arr in (extra_tensors or {}).items():
        _tensor(w, name, arr, QT.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_qwen2(path: str, seed: int = 0, override: dict[str, QT] | None = None,
                     tokenizer: bool = False, chat_template: str | None = QWEN2_TEMPLATE,
                     **kw) -> None:
    """A tiny Qwen2 as llama.cpp's converter writes one: qwen2.* keys (no rope dimension or
    vocab size), Q/K/V biases, the LM head tied to the embedding; with tokenizer=True the
    `qwen2` pre-tokenizer and Qwen2-Instruct's ChatML template (None: no template)."""
    write_tiny_llama(path, seed, arch="qwen2", override=override, tokenizer=tokenizer,
                     tied=True, qkv_bias=True, pre="qwen2", chat_template=chat_template,
                     shape_keys=False, **kw)
