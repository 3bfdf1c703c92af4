"""Accuracy (KL, top-1) of each CPU mode against the F32 model, beside llama.cpp's
llama-perplexity on the same file; see bench/README.md ("accuracy.py").
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _harness import cpu_model, git_head, log, results_path  # noqa: E402
from accuracy_metrics import N_CTX, SPEED_ORDER, Mode, apply_rule, chunks, read_kld_base, read_text  # noqa: E402
from accuracy_runs import PATHS, available, reference_logp, score_mode  # noqa: E402

TEXT = os.path.join(HERE, "accuracy", "alice_ch1.txt")
GOLDEN = os.path.join(ROOT, "tests", "golden", "accuracy_modes.json")
WORKDIR = os.path.expanduser("~/.cache/zerolayer/accuracy")  # F32 files, llama.cpp's base logits, logs
QUANT_DIR = os.environ.get("ZEROLAYER_QUANT_DIR", os.path.expanduser("~/.cache/zerolayer/quants"))
LLAMACPP_DIR = os.path.join(ROOT, os.environ.get("ZEROLAYER_LLAMACPP_DIR", ".bench-llamacpp"))
PERPLEXITY = os.path.join(LLAMACPP_DIR, "bin", "llama-perplexity")


# ---------------------------------------------------------------- llama.cpp's side

def write_f32(src: str, dst: str) -> str:
    """The GGUF at `src` with every tensor dequantized to F32 by the `gguf` package (the
    same dequantization as our reference), metadata copied. Kept if it already exists."""
    if os.path.exists(dst):
        return dst
    import gguf
    from gguf.quants import dequantize
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst + ".part", str(reader.fields["general.architecture"].contents()))
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        if f.name == "general.file_type":
            w.add_uint32(f.name, int(gguf.LlamaFileType.ALL_F32))
            continue
        vtype = f.types[0]
        w.add_key_value(f.name, f.contents(), vtype,
                        sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, arr.reshape([int(s) for s in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(dst + ".part", dst)
    return dst


def perplexity(args: list[str], log: str) -> tuple[str, bool]:
    """llama-perplexity with its default weight repacking; where that dies of a signal (this
    build's AMX repack: SIGSEGV on any prompt of more than one token) again without it, the
    mode that completes. Returns (output, repacked)."""
    for extra in ([], ["--no-repack"]):
        cmd = [PERPLEXITY, "-t", "2", *args, *extra]
        r = subprocess.run(cmd, capture_output=True, text=True)
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
        if r.returncode >= 0 or extra:
            break
    if r.returncode:
        raise RuntimeError(f"llama-perplexity failed ({r.returncode}), see {log}")
    return r.stdout + r.stderr, not extra


def llamacpp_kl(model: str, f32: str, text_file: str, n_ctx: int, workdir: str) -> dict:
    """llama.cpp's KL divergence of `model` against its own F32 evaluation of `f32`, and
    the stored base file (for our modes' KL against the same base)."""
    base = os.path.join(workdir, os.path.basename(f32) + f".c{n_ctx}.kld")
    common = ["-f", text_file, "-c", str(n_ctx)]
    if not os.path.exists(base):
        perplexity(["-m", f32, *common, "--kl-divergence-base", base + ".part"], base + ".log")
        os.replace(base + ".part", base)
    log = os.path.join(workdir, os.path.basename(model) + f".c{n_ctx}.kl.log")
    out, repacked = perplexity(["-m", model, *common, "--kl-divergence-base", base,
                                "--kl-divergence"], log)

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
            "repack_crashed": not repacked, "base_file": base, "log": log}


# ---------------------------------------------------------------- ours, and the rule

def measure_file(path: str, modes: list[Mode], text: str, n_ctx: int, paths, use_llamacpp: bool,
                 workdir: str, max_chunks: int | None = None) -> dict:
    from zerolayer.gpu import gguf_loader
    from zerolayer.gpu.model import LlamaModel
    tok = LlamaModel.load(path).tokenizer()
    ids = tok.encode(text)
    bos = tok._bos_id if tok.add_bos else None  # llama-perplexity: BOS first where the vocabulary adds one
    chunk_list = chunks(ids, n_ctx, bos)[:max_chunks]
    formats: Counter = Counter()  # weights per GGUF tensor type in the file
    for t in gguf_loader.open_gguf(path).tensors:
        formats[t.tensor_type.name] += int(t.n_elements)
    res = {"path": path, "formats": dict(formats), "tokens": len(ids),
           "chunks": len(chunk_list), "modes": {}}
    t0 = time.perf_counter()
    ref = reference_logp(path, chunk_list, n_ctx)
    log(f"{os.path.basename(path)}: reference over {len(chunk_list)} chunks in "
        f"{time.perf_counter() - t0:.0f} s")
    base = None
    if use_llamacpp and os.access(PERPLEXITY, os.X_OK):
        f32 = write_f32(path, os.path.join(workdir, os.path.basename(path) + ".F32.gguf"))
        body = os.path.join(workdir, "text.txt")
        with open(body, "w", encoding="utf-8") as f:
            f.write(text)
        lc = res["llamacpp"] = llamacpp_kl(path, f32, body, n_ctx, workdir)
        _, _, btoks, base = read_kld_base(lc["base_file"])
        ours = chunks(ids, n_ctx)  # llama.cpp stores the text's tokens, before any BOS
        lc["same_tokens"] = bool(len(btoks) == sum(map(len, ours))
                                 and (btoks == [t for c in ours for t in c]).all())
        base = base[:len(chunk_list)]
        log(f"  llama.cpp: KL {lc['kl_mean']:.3g}, top-1 {lc['top1']:.4f}, "
            f"same tokens: {lc['same_tokens']}")
    elif use_llamacpp:
        log(f"  llama.cpp: no {PERPLEXITY} (bench/setup_llamacpp.sh)")
    for m in modes:
        t0 = time.perf_counter()
        r = res["modes"][m.name] = score_mode(path, m, chunk_list, ref, n_ctx, paths, base)
        log(f"  {m.name}: " + ", ".join(f"{p} KL {r[p]['kl_mean']:.3g} top-1 {r[p]['top1']:.4f}"
                                        for p in paths) + f" ({time.perf_counter() - t0:.0f} s)")
    return res


def table(results: list[dict], paths) -> str:
    lines = []
    for res in results:
        rule = res["rule"]
        lines += [f"\n{os.path.basename(res['path'])}: {res['tokens']} tokens, {res['chunks']} chunks",
                  "| mode | " + " | ".join(f"{p} KL | {p} top-1" for p in paths)
                  + " | KL vs llama.cpp's F32 base | passes |",
                  "|---" * (2 + 2 * len(paths)) + "|---|"]
        for m, r in res["modes"].items():
            vs = r[paths[0]].get("kl_mean_vs_llamacpp_f32")
            ok = rule["acceptable"].get(m)
            lines.append(f"| {m} | " + " | ".join(f"{r[p]['kl_mean']:.3g} | {100 * r[p]['top1']:.2f}%"
                                                 for p in paths)
                         + f" | {'-' if vs is None else f'{vs:.3g}'} | {'-' if ok is None else ok} |")
        lc = res.get("llamacpp")
        if lc:
            lines.append(f"| llama.cpp | {lc['kl_mean']:.3g} | {100 * lc['top1']:.2f}% |"
                         + " |" * (2 * len(paths) - 1) + " |")
        lines.append(f"picked: {rule['picked']}")
    return "\n".join(lines)


def rerule(path: str) -> int:
    """The rule of this tree over a recorded file's measurements: the verdicts change when
    the rule does, the figures stay the ones measured (their date, commit and host)."""
    with open(path) as f:
        rec = json.load(f)
    rec["rule"] = apply_rule(rec)
    rec["rule"]["applied"] = (f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}, "
                              f"git {git_head()} (bench/accuracy.py --rerule)")
    rec["speed_order"] = [m.name for m in SPEED_ORDER]
    with open(path, "w") as f:
        f.write(json.dumps(rec, indent=1) + "\n")
    print(f"{path}: picked {rec['rule']['picked']}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="GGUF file (repeatable; default: the bundled model)")
    ap.add_argument("--quants", action="store_true",
                    help="also the files of scripts/make_quants.sh that exist")
    ap.add_argument("--modes", default="all", help="comma-separated kernels/activations/kv, or all")
    ap.add_argument("--paths", default=",".join(PATHS), help="prefill,decode")
    ap.add_argument("--max-chunks", type=int, help="score only the first N chunks (quick checks)")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--out", help="JSON file (default bench/results/accuracy-<time>.json)")
    ap.add_argument("--record", action="store_true", help=f"write the bundled model's figures to {GOLDEN}")
    ap.add_argument("--rerule", action="store_true",
                    help=f"apply the rule to {GOLDEN}'s recorded figures (no measurement) and "
                         "write its verdicts back")
    a = ap.parse_args(argv)
    if a.rerule:
        return rerule(GOLDEN)

    from zerolayer.gpu.gguf_loader import default_model_path
    models = a.model or [default_model_path()]
    if a.quants:
        models += [p for t in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
                   if os.path.exists(p := os.path.join(QUANT_DIR, f"SmolLM2-135M-Instruct.{t}.gguf"))]
    modes = [m for m in (SPEED_ORDER if a.modes == "all" else map(Mode.parse, a.modes.split(",")))
             if available(m)]
    paths = tuple(a.paths.split(","))
    os.makedirs(WORKDIR, exist_ok=True)
    text = read_text(TEXT)

    started = datetime.datetime.now(datetime.UTC)
    results = []
    for path in models:
        res = measure_file(path, modes, text, N_CTX, paths, not a.no_llamacpp, WORKDIR, a.max_chunks)
        res["rule"] = apply_rule(res)
        results.append(res)
    doc = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "git": git_head(), "cpu": cpu_model(),
           "threads": os.cpu_count(), "text": os.path.relpath(TEXT, ROOT), "n_ctx": N_CTX,
           "command": "bench/accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "speed_order": [m.name for m in SPEED_ORDER], "files": results}
    print(table(results, paths))
    out = results_path(a.out, "accuracy")
    out.write_text(json.dumps(doc, indent=1))
    log(f"wrote {out}")
    if a.record:
        bundled = results[0]
        rec = {k: doc[k] for k in ("date", "git", "cpu", "text", "n_ctx", "command", "speed_order")}
        rec.update(file=os.path.basename(bundled["path"]), rule=bundled["rule"],
                   llamacpp={k: v for k, v in bundled.get("llamacpp", {}).items()
                             if k in ("kl_mean", "top1", "command", "same_tokens")},
                   modes=bundled["modes"])
        with open(GOLDEN, "w") as f:
            f.write(json.dumps(rec, indent=1) + "\n")
        log(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
