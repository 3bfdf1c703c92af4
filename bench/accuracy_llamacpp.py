"""llama.cpp's side of the accuracy harness: `llama-perplexity` (bench/setup_llamacpp.sh)
on the F32 model dequantized from the file (the base log-probabilities), then on the file
itself against them (`--kl-divergence`). Same text, same chunks and scored positions as
ours (bench/accuracy_metrics.py); 2 threads, llama.cpp's defaults otherwise (f16 KV cache).
"""
from __future__ import annotations

import os
import re
import subprocess

import numpy as np

LLAMACPP_DIR = os.environ.get("ZEROLAYER_LLAMACPP_DIR", ".bench-llamacpp")


def binary(name: str = "llama-perplexity") -> str | None:
    p = os.path.join(LLAMACPP_DIR, "bin", name)
    return p if os.access(p, os.X_OK) else None


def write_f32(src: str, dst: str) -> str:
    """The GGUF at `src` with every tensor dequantized to F32 by the `gguf` package (the
    same dequantization as our reference), metadata copied. Kept if it already exists."""
    if os.path.exists(dst):
        return dst
    import gguf
    from gguf.quants import dequantize
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(dst + ".part", arch)
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        if f.name == "general.file_type":
            w.add_uint32(f.name, int(gguf.LlamaFileType.ALL_F32))
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, arr.reshape([int(s) for s in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(dst + ".part", dst)
    return dst


class Crashed(RuntimeError):
    pass


def _run(args: list[str], log: str) -> str:
    cmd = [binary(), "-t", "2", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    if r.returncode < 0:
        raise Crashed(f"llama-perplexity died of signal {-r.returncode}, see {log}")
    if r.returncode != 0:
        raise RuntimeError(f"llama-perplexity failed ({r.returncode}), see {log}")
    return r.stdout + r.stderr


def _run_repack_or_not(args: list[str], log: str) -> tuple[str, bool]:
    """Run with llama.cpp's default weight repacking; where that crashes (this build's AMX
    repack dies of SIGSEGV on any prompt of more than one token) run again without it,
    the mode that completes. Returns (output, repacked)."""
    try:
        return _run(args, log), True
    except Crashed:
        return _run([*args, "--no-repack"], log), False


def kl_divergence(model: str, f32: str, text_file: str, n_ctx: int, workdir: str) -> dict:
    """llama.cpp's KL divergence of `model` against its own F32 evaluation of `f32`, and
    the stored base file (for our modes' KL against the same base)."""
    base = os.path.join(workdir, os.path.basename(f32) + f".c{n_ctx}.kld")
    common = ["-f", text_file, "-c", str(n_ctx)]
    if not os.path.exists(base):
        _run_repack_or_not(["-m", f32, *common, "--kl-divergence-base", base + ".part"],
                           base + ".log")
        os.replace(base + ".part", base)
    log = os.path.join(workdir, os.path.basename(model) + f".c{n_ctx}.kl.log")
    out, repacked = _run_repack_or_not(
        ["-m", model, *common, "--kl-divergence-base", base, "--kl-divergence"], log)

    def grab(label: str) -> float:
        m = re.search(re.escape(label) + r"\s*:\s*([-0-9.]+)", out)
        if not m:
            raise RuntimeError(f"no '{label}' in llama-perplexity's output ({log})")
        return float(m.group(1))

    return {"kl_mean": grab("Mean    KLD"), "kl_p99": grab("99.0%   KLD"),
            "kl_max": grab("Maximum KLD"), "top1": grab("Same top p") / 100,
            "command": f"llama-perplexity -t 2 -m MODEL -f TEXT -c {n_ctx} "
                       "--kl-divergence-base BASE --kl-divergence"
                       + ("" if repacked else " --no-repack"),
            "repack_crashed": not repacked,
            "base_file": base, "log": log}
