"""Accuracy of each CPU mode against the F32 model, beside llama.cpp's own on the same file.

    .venv/bin/python bench/accuracy.py                      # the bundled model, every mode
    .venv/bin/python bench/accuracy.py --quants             # + scripts/make_quants.sh's files
    .venv/bin/python bench/accuracy.py --modes vnni/int16/f16,vnni/int8/f16 --paths prefill
    .venv/bin/python bench/accuracy.py --record             # also tests/golden/accuracy_modes.json
    .venv/bin/python bench/accuracy.py --rerule             # the rule again, on the recorded figures

For each model file and each CPU mode this machine runs (gpu/ops/cpu_features.py: kernel set
x activation width x KV cache type), over the shipped public-domain text
(bench/accuracy/alice_ch1.txt, 3,155 tokens): the mean KL divergence of the next-token
distributions from the F32 model dequantized from the same file (gpu/reference.py, float64),
and the top-1 agreement, at llama-perplexity's positions (bench/accuracy_metrics.py), by the
prefill and the decode paths. Beside them, where bench/setup_llamacpp.sh has built it,
llama.cpp's `llama-perplexity --kl-divergence` on the same file against its own F32
evaluation, and our KL against that same stored base.

The rule (accuracy_metrics.py): a mode is acceptable when it gives the F32 model's answers,
top-1 agreement >= 99.5% and mean KL <= 1e-5 (the worse of its two paths); the default is the
fastest acceptable mode on the bundled model (accuracy_metrics.SPEED_ORDER).
tests/test_accuracy.py holds the default to the recorded pick.

Output: a markdown table on stdout and JSON (default bench/results/accuracy-<time>.json).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import accuracy_llamacpp as lcpp  # noqa: E402
from _harness import cpu_model, git_head  # noqa: E402
from accuracy_metrics import (  # noqa: E402
    KL_MAX,
    N_CTX,
    SPEED_ORDER,
    TOP1_MIN,
    Mode,
    acceptable,
    all_modes,
    chunks,
    pick_default,
    read_kld_base,
    read_text,
)
from accuracy_runs import PATHS, available, reference_logp, score_mode  # noqa: E402

TEXT = os.path.join(HERE, "accuracy", "alice_ch1.txt")
GOLDEN = os.path.join(ROOT, "tests", "golden", "accuracy_modes.json")
WORKDIR = os.path.expanduser("~/.cache/zerolayer/accuracy")  # F32 files, llama.cpp's base logits, logs
QUANT_DIR = os.environ.get("ZEROLAYER_QUANT_DIR", os.path.expanduser("~/.cache/zerolayer/quants"))


def _formats(path: str) -> dict[str, int]:
    """Weights per GGUF tensor type in the file."""
    from zerolayer.gpu import gguf_loader
    out: dict[str, int] = {}
    for t in gguf_loader.open_gguf(path).tensors:
        out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + int(t.n_elements)
    return out


def measure_file(path: str, modes: list[Mode], text: str, n_ctx: int, paths, use_llamacpp: bool,
                 workdir: str, log, max_chunks: int | None = None) -> dict:
    from zerolayer.gpu.model import LlamaModel
    tok = LlamaModel.load(path).tokenizer()
    ids = tok.encode(text)
    bos = tok._bos_id if tok.add_bos else None  # llama-perplexity: BOS first where the vocabulary adds one
    chunk_list = chunks(ids, n_ctx, bos)[:max_chunks]
    res = {"path": path, "formats": _formats(path), "tokens": len(ids), "chunks": len(chunk_list),
           "modes": {}}
    t0 = time.perf_counter()
    ref = reference_logp(path, chunk_list, n_ctx)
    log(f"{os.path.basename(path)}: reference over {len(chunk_list)} chunks in "
        f"{time.perf_counter() - t0:.0f} s")
    base = None
    if use_llamacpp and lcpp.binary():
        f32 = lcpp.write_f32(path, os.path.join(workdir, os.path.basename(path) + ".F32.gguf"))
        body = os.path.join(workdir, "text.txt")
        with open(body, "w", encoding="utf-8") as f:
            f.write(text)
        res["llamacpp"] = lcpp.kl_divergence(path, f32, body, n_ctx, workdir)
        _, _, btoks, base = read_kld_base(res["llamacpp"]["base_file"])
        ours = chunks(ids, n_ctx)  # llama.cpp stores the text's tokens, before any BOS
        res["llamacpp"]["same_tokens"] = bool(len(btoks) == sum(map(len, ours))
                                             and (btoks == [t for c in ours for t in c]).all())
        base = base[:len(chunk_list)]
        log(f"  llama.cpp: KL {res['llamacpp']['kl_mean']:.3g}, top-1 {res['llamacpp']['top1']:.4f}"
            f", same tokens: {res['llamacpp']['same_tokens']}")
    elif use_llamacpp:
        log(f"  llama.cpp: no {lcpp.LLAMACPP_DIR}/bin/llama-perplexity (bench/setup_llamacpp.sh)")
    for m in modes:
        t0 = time.perf_counter()
        r = res["modes"][m.name] = score_mode(path, m, chunk_list, ref, n_ctx, paths, base)
        log(f"  {m.name}: " + ", ".join(f"{p} KL {r[p]['kl_mean']:.3g} top-1 {r[p]['top1']:.4f}"
                                        for p in paths) + f" ({time.perf_counter() - t0:.0f} s)")
    return res


def apply_rule(res: dict) -> dict:
    """Per mode the figures the rule uses (the worse path's KL and top-1) and whether it
    passes; the pick. llama.cpp's KL rides along as information."""
    kl = {m: max(r[p]["kl_mean"] for p in r) for m, r in res["modes"].items()}
    top1 = {m: min(r[p]["top1"] for p in r) for m, r in res["modes"].items()}
    picked = pick_default(kl, top1)
    return {"kl": kl, "top1": top1, "bounds": {"kl_max": KL_MAX, "top1_min": TOP1_MIN},
            "llamacpp_kl": res.get("llamacpp", {}).get("kl_mean"),
            "acceptable": {m: acceptable(kl[m], top1[m]) for m in kl},
            "picked": picked.name if picked else None}


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
        json.dump(rec, f, indent=1)
        f.write("\n")
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
        models += [os.path.join(QUANT_DIR, f"SmolLM2-135M-Instruct.{t}.gguf")
                   for t in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
                   if os.path.exists(os.path.join(QUANT_DIR, f"SmolLM2-135M-Instruct.{t}.gguf"))]
    modes = (all_modes(("vnni", "avx2")) if a.modes == "all"
             else [Mode.parse(m) for m in a.modes.split(",")])
    modes = [m for m in modes if available(m)]
    paths = tuple(a.paths.split(","))
    os.makedirs(WORKDIR, exist_ok=True)
    text = read_text(TEXT)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731

    started = datetime.datetime.now(datetime.UTC)
    results = []
    for path in models:
        res = measure_file(path, modes, text, N_CTX, paths, not a.no_llamacpp, WORKDIR, log,
                           a.max_chunks)
        res["rule"] = apply_rule(res)
        results.append(res)
    doc = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "git": git_head(), "cpu": cpu_model(),
           "threads": os.cpu_count(), "text": os.path.relpath(TEXT, ROOT), "n_ctx": N_CTX,
           "command": "bench/accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "speed_order": [m.name for m in SPEED_ORDER], "files": results}
    print(table(results, paths))
    out = a.out or os.path.join(HERE, "results", f"accuracy-{started:%Y%m%d-%H%M%S}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    log(f"wrote {out}")
    if a.record:
        bundled = results[0]
        rec = {k: doc[k] for k in ("date", "git", "cpu", "text", "n_ctx", "command", "speed_order")}
        rec.update(file=os.path.basename(bundled["path"]), rule=bundled["rule"],
                   llamacpp={k: v for k, v in bundled.get("llamacpp", {}).items()
                             if k in ("kl_mean", "top1", "command", "same_tokens")},
                   modes=bundled["modes"])
        with open(GOLDEN, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
        log(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
