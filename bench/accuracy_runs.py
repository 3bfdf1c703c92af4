"""The two sides of bench/accuracy.py that run models: the float64 reference on the F32 weights
(gpu/reference.py) and our runtime in one CPU mode, by two paths: prefill (each chunk in one
forward) and decode (the chunk's first half as a prompt, then a token a step: the packed
decode kernels, not the prefill's)."""
from __future__ import annotations

import numpy as np
from accuracy_metrics import Mode, Score, kl_rows_llamacpp, log_softmax, scored

PATHS = ("prefill", "decode")


def reference_logp(path: str, chunk_list: list[np.ndarray], n_ctx: int) -> list[np.ndarray]:
    """Per chunk, the F32 model's log-probabilities at the scored positions (float64)."""
    from zerolayer.gpu import gguf_loader
    from zerolayer.gpu.reference import ReferenceLlama
    reader = gguf_loader.open_gguf(path)
    ref = ReferenceLlama(reader, gguf_loader.read_config(reader))
    return [log_softmax(ref.logits_all(c, scored(n_ctx))) for c in chunk_list]


def _isa(mode: Mode) -> int:
    from zerolayer.gpu.ops import cpu_features, int8_matmul
    return 0 if mode.kernels == "float" else cpu_features.isa_for_mode(mode.kernels, int8_matmul.ISAS)


def available(mode: Mode) -> bool:
    return mode.kernels == "float" or bool(_isa(mode))


def load(path: str, mode: Mode, n_ctx: int):
    """Our CPU model in `mode` (the kernel set and activation width decide how the weights
    are prepared when it is built; the KV type is the arena's), with room for one chunk."""
    from zerolayer.gpu.model import LlamaModel
    from zerolayer.gpu.ops import cpu_features, int8_matmul
    with int8_matmul.kernel_set(_isa(mode), None if mode.kernels == "float" else mode.activations):
        return LlamaModel.load(path, max_seq_len=n_ctx, kv_blocks=-(-n_ctx // 64) + 1,
                               kv_dtype=cpu_features.select_kv(mode.kv))


def mode_logits(model, chunk: np.ndarray, path: str, n_ctx: int) -> np.ndarray:
    """Our logits at the chunk's scored positions, by the prefill or the decode path."""
    from zerolayer.gpu.model_api import StepInput
    sl = scored(n_ctx)
    seq = model.new_sequence()
    try:
        if path == "prefill":
            return model.step([StepInput(seq, chunk)], every_position=True)[sl]
        model.step([StepInput(seq, chunk[:sl.start], logits=False)])
        return np.concatenate([model.step([StepInput(seq, chunk[j:j + 1])])
                               for j in range(sl.start, sl.stop)])
    finally:
        seq.release()


def score_mode(path: str, mode: Mode, chunk_list, ref: list[np.ndarray], n_ctx: int,
               paths=PATHS, base=None) -> dict:
    """{path: summary} for one mode; with `base` (llama.cpp's stored F32 log-probabilities,
    [chunk, scored, vocab]) also the KL against it, as llama-perplexity computes it."""
    model = load(path, mode, n_ctx)
    out = {}
    for p in paths:
        s, vs_base = Score.empty(), []
        for i, (c, r) in enumerate(zip(chunk_list, ref)):
            lg = mode_logits(model, c, p, n_ctx)
            s.add(r, lg)
            if base is not None:
                vs_base.append(kl_rows_llamacpp(base[i], lg))
        out[p] = s.summary()
        if base is not None:
            out[p]["kl_mean_vs_llamacpp_f32"] = float(np.concatenate(vs_base).mean())
    return out
