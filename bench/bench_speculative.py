"""Speculative decoding: decode speed with drafts from the request's own text (or a draft model),
against the same engine without them and llama.cpp's `llama-lookup` on the same prompts; see
bench/README.md ("bench_speculative.py").
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness as H  # noqa: E402
from accuracy_metrics import read_text  # noqa: E402

TEXT = HERE / "accuracy" / "alice_ch1.txt"
LOOKUP = H.LLAMA_BIN / "llama-lookup"


def tasks() -> dict[str, str]:
    """name -> user message. The grounded ones quote the shipped chapter."""
    text = read_text(str(TEXT))
    opening = text[:text.index("\n\n", 900)].strip()  # the title and the first paragraphs
    para = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 300][2]
    items = ("the White Rabbit, a pink-eyed rabbit, a waistcoat-pocket, a watch, a rabbit-hole, "
             "cupboards, book-shelves, maps, pictures, a jar of orange marmalade")
    return {
        "extract a passage": f"Repeat the following text exactly, word for word:\n\n{opening}",
        "repeat a list with an edit": "Here is a list of things Alice sees: " + items
        + ".\nWrite the same list again, in the same order, with 'a watch' replaced by 'a clock'.",
        "answer with a quotation": f"{para}\n\nQuote the sentences of this paragraph that "
        "describe what Alice does, exactly as written.",
        "summarize with copying": f"{opening}\n\nSummarize this text, reusing its own sentences.",
        "free chat (control)": "Write a short story about a lighthouse keeper who finds a "
        "message in a bottle.",
    }


KEEPERS = ("Ada", "Bram", "Cleo", "Dov", "Edda", "Finn", "Greta", "Hugo", "Ines", "Jonas",
           "Kaia", "Lev", "Mira", "Nils", "Oona", "Per")


def stream_messages(name: str, msg: str, streams: int) -> list[str]:
    """What each of `streams` requests asks: copies of a grounded task (the same document,
    the same instruction); for the free-chat control, a different story each (free text
    that copies nothing, as a batch of chat users writes)."""
    if streams == 1 or not name.startswith("free chat"):
        return [msg] * streams
    return [f"{msg} Call the keeper {KEEPERS[i % len(KEEPERS)]}." for i in range(streams)]


def run_ours(gen, prompts, n_tokens: int, speculative: bool, drafter=None,
             max_batch: int = 0) -> dict:
    """The prompts (token ids, one a stream) decoded together; tok/s counts all of them."""
    from zerolayer.daemon.engine import Engine
    from zerolayer.daemon.request import Admitted, DoneEvent
    from zerolayer.protocol.sampling_params import SamplingParams

    done = {"drafted": 0, "accepted": 0}

    def emit(ev) -> None:
        if isinstance(ev, DoneEvent):
            done["drafted"] += ev.drafted
            done["accepted"] += ev.accepted

    streams = len(prompts)
    eng = Engine(gen.model, gen.tokenizer, emit=emit, max_running=streams, max_waiting=streams,
                 step_tokens=512 * streams, speculative=speculative, drafter=drafter,
                 speculative_max_batch=max_batch)
    rs = [eng.submit(Admitted(i, SamplingParams(max_tokens=n_tokens)), ids)
          for i, ids in enumerate(prompts)]
    first = None
    while eng.has_work:
        eng.step()
        if first is None and all(r.tokens for r in rs):
            first = time.perf_counter()
    last = time.perf_counter()
    eng.prefix.clear()  # every run prefills from cold: the two sides see the same work
    n = sum(len(r.tokens) - 1 for r in rs)
    assert first is not None
    decode_steps = eng.steps - -(-sum(map(len, prompts)) // eng.step_tokens)  # (the prompts' chunks)
    return {"tokens": [list(r.tokens) for r in rs], "n": n, "steps": eng.steps,
            "tokens_per_step": n / streams / decode_steps if decode_steps > 0 else None,
            "decode_tps": n / (last - first) if n > 0 and last > first else None,
            "drafted": done["drafted"], "accepted": done["accepted"]}


def run_lookup(model: str, prompt: str, n_tokens: int, threads: int) -> dict:
    cmd = [str(LOOKUP), "-m", model, "-p", prompt, "-n", str(n_tokens), "--temp", "0",
           "--spec-draft-n-max", "8", "-t", str(threads), "-c", "2048"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode < 0:  # killed by a signal: llama.cpp's weight repacking crashes on the
        cmd.append("--no-repack")   # AMX Xeon class; its plain layout is what serves there
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", out)
    if p.returncode or not m:
        return {"error": f"exit {p.returncode}: {out[-400:]}"}
    n, secs = int(m.group(1)), float(m.group(2))
    count = {k: (int(c.group(1)) if (c := re.search(rf"{k}\s*=\s*(\d+)", out)) else None)
             for k in ("n_drafted", "n_accept")}
    return {"n": n, "decode_tps": n / secs if secs > 0 else None, "drafted": count["n_drafted"],
            "accepted": count["n_accept"], "command": " ".join(cmd[:1] + cmd[5:])}


def med(rows: list[dict], key: str) -> float | None:
    """The median of rows' `key` where they have one (a failed llama-lookup run has none)."""
    xs = [x[key] for x in rows if x.get(key) is not None]
    return statistics.median(xs) if xs else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", help="GGUF (default: the bundled model)")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--draft-model", help="GGUF with the model's vocabulary: a third side")
    ap.add_argument("--tasks", help="comma-separated words; run the tasks whose name has one")
    ap.add_argument("--streams", type=int, default=1,
                    help="copies of each request decoded together (aggregate tok/s); no peer")
    ap.add_argument("--max-batch", type=int, default=None, help="the engine's speculative_max_batch "
                    "(default: the daemon's)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)

    from zerolayer.daemon.config import EngineSection
    from zerolayer.gpu.generate import Generator
    from zerolayer.gpu.gguf_loader import default_model_path
    from zerolayer.gpu.ops import cpu_features
    model = a.model or default_model_path()
    gen = Generator.load(model, threads=a.threads, max_seq_len=2048)
    drafter = None
    if a.draft_model:
        from zerolayer.gpu.draft_model import DraftModel
        drafter = DraftModel.load(a.draft_model, gen.model, max_sequences=a.streams)
    sides = (("plain", False, None), ("spec", True, None)) + (
        (("draft", True, drafter),) if drafter is not None else ())
    max_batch = EngineSection().speculative_max_batch if a.max_batch is None else a.max_batch
    batch = {"streams": a.streams, "max_batch": max_batch}
    peer = not a.no_llamacpp and a.streams == 1 and LOOKUP.exists()
    if not a.no_llamacpp and a.streams == 1 and not peer:
        H.log(f"{LOOKUP} not built (bench/setup_llamacpp.sh): no peer column")
    results: dict[str, dict] = {}
    with H.bench_lock(" ".join(sys.argv)):
        for name, msg in tasks().items():
            if a.tasks and not any(w in name for w in a.tasks.split(",")):
                continue
            prompts = [np.array(gen.tokenizer.encode_chat([{"role": "user", "content": m}]),
                                np.int32) for m in stream_messages(name, msg, a.streams)]
            chat = [{"role": "user", "content": msg}]
            for _, spec, d in sides:  # compiled and warm before the first timed round
                run_ours(gen, prompts, 8, spec, d, max_batch=max_batch)
            row: dict = {"prompt_tokens": len(prompts[0]), "plain": [], "spec": [], "draft": [],
                         "lookup": []}
            for rnd in range(a.rounds):
                order = sides if rnd % 2 == 0 else sides[::-1]
                got = {k: run_ours(gen, prompts, a.tokens, spec, d, max_batch=max_batch)
                       for k, spec, d in order}
                plain = got["plain"]["tokens"]
                for k, g in got.items():
                    if g.pop("tokens") != plain:
                        raise SystemExit(f"{name}: {k} output differs from plain greedy")
                    row[k].append(g)
                if peer:
                    row["lookup"].append(run_lookup(model, gen.tokenizer.render_chat(chat),
                                                    a.tokens, a.threads))
                H.log(f"{name} round {rnd}: " + ", ".join(
                    f"{k} {g['decode_tps']:.1f} tok/s ({g['accepted']}/{g['drafted']} kept)"
                    for k, g in got.items())
                    + (f", llama-lookup {row['lookup'][-1].get('decode_tps') or 0:.1f}" if peer else ""))
            results[name] = row
    rows = []
    for name, row in results.items():
        p, s, lk = (med(row[k], "decode_tps") for k in ("plain", "spec", "lookup"))
        kept, drafted = (sum(x[f] for x in row["spec"]) for f in ("accepted", "drafted"))
        row["summary"] = {"plain_tps": p, "spec_tps": s, "lookup_tps": lk,
                          "speedup": s / p if p and s else None,
                          "vs_lookup": s / lk if lk and s else None}
        rows.append([name, row["prompt_tokens"], f"{p:.1f}", f"{s:.1f}", f"{s / p:.2f}x",
                     f"{kept} / {drafted}", H.fmt(lk), "-" if lk is None else f"{s / lk:.2f}x"])
    lines = [H.md_table(["task", "prompt tokens", "plain tok/s", "speculative tok/s", "speedup",
                       "kept / drafted", "llama-lookup tok/s", "ours / llama-lookup"], rows)]
    if drafter is not None:
        ks = ("plain", "spec", "draft")
        lines += ["", H.md_table(["task", "tokens/step plain / lookup / draft model",
                                "tok/s plain / lookup / draft model",
                                "draft model kept / drafted"], [
            [name, " / ".join(f"{med(row[k], 'tokens_per_step'):.2f}" for k in ks),
             " / ".join(f"{med(row[k], 'decode_tps'):.1f}" for k in ks),
             " / ".join(str(sum(x[f] for x in row["draft"])) for f in ("accepted", "drafted"))]
            for name, row in results.items()])]
    if a.streams > 1:
        lines.insert(0, f"{a.streams} copies of each request decoded together (aggregate tok/s), "
                        f"speculative_max_batch {max_batch}\n")
    print("\n".join(lines))
    doc = {**H.run_meta(), "machine": H.machine_info(), "kernels": cpu_features.describe(),
           "model": model, "draft_model": a.draft_model, "tokens": a.tokens, "rounds": a.rounds,
           **batch,
           "tasks": results}
    out = H.results_path(a.out, "speculative")
    out.write_text(json.dumps(doc, indent=1))
    H.log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
