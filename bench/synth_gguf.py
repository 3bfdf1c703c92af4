#!/usr/bin/env python
"""A synthetic model bigger than the L3: TinyLlama-1.1B's shapes, random weights, as GGUF
(F16, then Q4_1 and Q4_K_M by llama-quantize); see bench/README.md ("bench_kernels.py and
synth_gguf.py"). An existing file is kept (--force rewrites).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import LLAMA_BIN, SYNTH_DIR, log  # noqa: E402

QUANTIZE = LLAMA_BIN / "llama-quantize"
NAME = "tinyllama-1.1b-synth"

# TinyLlama-1.1B (its config.json), the vocabulary aside
SHAPES = {"n_layer": 22, "d_model": 2048, "n_ff": 5632, "n_head": 32, "n_kv": 4,
          "head_dim": 64, "context_length": 2048, "rope_base": 10000.0, "eps": 1e-5}
# GPT-2's initialisation (about 1/sqrt(d_model)): the residual stream stays O(1) through 22
# layers; larger random weights overflow float16 into NaNs, which take other code paths
STD = 0.02


def copy_tokenizer(writer, src: str) -> int:
    """Every tokenizer.* key of the bundled GGUF, with its type; returns the vocab size."""
    from gguf import GGUFReader, GGUFValueType
    r = GGUFReader(src, "r")
    n = 0
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = GGUFValueType(f.types[0])
        sub = GGUFValueType(f.types[1]) if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), vtype, sub)
        if key == "tokenizer.ggml.tokens":
            n = len(f.data)
    if not n:
        raise SystemExit(f"{src} has no tokenizer.ggml.tokens")
    return n


def write_f16(path: Path, seed: int) -> None:
    import gguf

    from zerolayer.gpu.gguf_loader import default_model_path
    s = SHAPES
    D, F, hd = s["d_model"], s["n_ff"], s["head_dim"]
    dq, dkv = s["n_head"] * hd, s["n_kv"] * hd
    tmp = path.with_suffix(".tmp")  # renamed when complete: a crash leaves no half file
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"{NAME} (random weights, seed {seed})")
    w.add_context_length(s["context_length"])
    w.add_embedding_length(D)
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(F)
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_kv"])
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab = copy_tokenizer(w, default_model_path())
    w.add_vocab_size(vocab)
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:  # numpy [rows, cols] = ggml [cols, rows]
        return (rng.standard_normal((rows, cols), np.float32) * np.float32(STD)).astype(np.float16)

    ones = np.ones(D, np.float32)
    layer = (("attn_norm", None), ("attn_q", (dq, D)), ("attn_k", (dkv, D)), ("attn_v", (dkv, D)),
             ("attn_output", (D, dq)), ("ffn_norm", None), ("ffn_gate", (F, D)),
             ("ffn_up", (F, D)), ("ffn_down", (D, F)))  # in the order the weights are drawn
    w.add_tensor("token_embd.weight", mat(vocab, D))
    for i in range(s["n_layer"]):
        for name, shape in layer:
            w.add_tensor(f"blk.{i}.{name}.weight", ones if shape is None else mat(*shape))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(vocab, D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def quantize(src: Path, dst: Path, qtype: str, threads: int) -> None:
    if not os.access(QUANTIZE, os.X_OK):
        raise SystemExit(f"missing {QUANTIZE}: run bench/setup_llamacpp.sh")
    tmp = dst.with_suffix(".tmp")
    cmd = ["nice", "-n", "19", str(QUANTIZE), str(src), str(tmp), qtype, str(threads)]
    log(" ".join(cmd))
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        sys.stderr.write(res.stdout[-3000:] + res.stderr[-3000:])
        raise SystemExit(f"llama-quantize {qtype} failed ({res.returncode})")
    os.replace(tmp, dst)


def check(path: Path) -> None:
    """One forward through our runtime: finite logits, or the weights need a smaller scale."""
    from zerolayer.gpu.model import LlamaModel, StepInput
    m = LlamaModel.load(str(path), max_seq_len=64)
    seq = m.new_sequence()
    logits = m.step([StepInput(seq, np.arange(1, 9, dtype=np.int32))])
    seq.release()
    if not np.isfinite(logits).all():
        raise SystemExit(f"{path}: non-finite logits; lower STD")
    log(f"{path.name}: logits finite (std {float(logits.std()):.3f}, max |x| "
        f"{float(np.abs(logits).max()):.2f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=str(SYNTH_DIR))
    ap.add_argument("--types", default="Q4_1,Q4_K_M", help="llama-quantize types (default Q4_1,Q4_K_M)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    ap.add_argument("--no-check", action="store_true", help="skip the finite-logits forward")
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"{NAME}.F16.gguf"
    if args.force or not base.exists():
        t0 = time.perf_counter()
        write_f16(base, args.seed)
        log(f"wrote {base} ({base.stat().st_size / 1e9:.2f} GB, {time.perf_counter() - t0:.0f} s)")
    for qtype in filter(None, args.types.split(",")):
        dst = out / f"{NAME}.{qtype}.gguf"
        if args.force or not dst.exists():
            t0 = time.perf_counter()
            quantize(base, dst, qtype, args.threads)
            log(f"wrote {dst} ({dst.stat().st_size / 1e6:.0f} MB, {time.perf_counter() - t0:.0f} s)")
        if not args.no_check:
            check(dst)
        print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
