#!/usr/bin/env python
"""llama-cpp-python side of bench/bench_runtime.py. Runs under the .venv-bench interpreter.

Standalone on purpose (llama_cpp, numpy, stdlib; no zerolayer), so the two runtimes never
share a process, an OpenMP runtime or threads. Two modes:

* server (default): load the model once, then answer one JSON request per stdin line with one
  JSON line on stdout. Requests: {"op": "info"}, {"op": "decode", "prompt": [ids],
  "steps": n}, {"op": "prefill", "prompt": [ids]}, {"op": "quit"}.
* --cold: the cold-start probe. Import, load, tokenize --prompt, evaluate it and print the
  first greedy token id as the first stdout line (the parent stops its clock when that line
  arrives), then a JSON line with the in-process breakdown.

Timing matches the zerolayer side: greedy decode = one llm.eval([tok]) (a llama_decode of a
one-token batch, logits for that token only since logits_all=False) plus a numpy argmax over
the vocab, per step. Prefill = one llm.eval(prompt) on a cleared KV cache with
n_batch = n_ubatch >= the prompt length, so it is one batched decode.
"""
from __future__ import annotations

import time

T_START = time.perf_counter()  # first thing: the cold-start breakdown is relative to this

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

FLASH = {"off": 0, "on": 1, "auto": -1}  # LLAMA_FLASH_ATTN_TYPE_{DISABLED,ENABLED,AUTO}


def make_llama(args):
    import llama_cpp
    import llama_cpp.llama as llama_mod

    kw = dict(
        model_path=args.model,
        n_ctx=args.n_ctx,
        n_batch=args.n_batch,
        n_ubatch=args.n_batch,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=False,
        verbose=False,
    )
    if args.flash_attn != "auto":
        return llama_cpp, llama_cpp.Llama(**kw, flash_attn=(args.flash_attn == "on"))
    # "auto" is llama.cpp's own default (llama-server, llama-cli), but Llama() maps its
    # flash_attn bool to ENABLED/DISABLED only, and creates the context inside __init__. So
    # for the duration of the constructor, make its "disabled" constant mean AUTO.
    lc = llama_mod.llama_cpp
    saved = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    lc.LLAMA_FLASH_ATTN_TYPE_DISABLED = lc.LLAMA_FLASH_ATTN_TYPE_AUTO
    try:
        llm = llama_cpp.Llama(**kw, flash_attn=False)
    finally:
        lc.LLAMA_FLASH_ATTN_TYPE_DISABLED = saved
    return llama_cpp, llm


class Runner:
    def __init__(self, llama_cpp, llm):
        self.lc = llama_cpp
        self.llm = llm
        self.n_vocab = llm.n_vocab()

    def clear(self):
        """An empty KV cache and n_tokens = 0 (reset() alone only rewinds n_tokens)."""
        self.llm.reset()
        mem = self.lc.llama_get_memory(self.llm._ctx.ctx)
        self.lc.llama_memory_clear(mem, True)

    def last_logits(self) -> np.ndarray:
        ptr = self.lc.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def prefill(self, prompt: list[int]) -> dict:
        self.clear()
        t0 = time.perf_counter()
        self.llm.eval(prompt)
        tok = int(self.last_logits().argmax())
        dt = time.perf_counter() - t0
        return {"seconds": dt, "tokens": len(prompt), "first_token": tok}

    def decode(self, prompt: list[int], steps: int) -> dict:
        self.clear()
        self.llm.eval(prompt)
        tok = int(self.last_logits().argmax())
        out = [tok]
        t0 = time.perf_counter()
        for _ in range(steps):
            self.llm.eval([tok])
            tok = int(self.last_logits().argmax())
            out.append(tok)
        dt = time.perf_counter() - t0
        return {"seconds": dt, "steps": steps, "tokens": out}


def info(llama_cpp, llm, args) -> dict:
    cp = llm.context_params
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "n_ctx": llm.n_ctx(),
        "n_batch": cp.n_batch,
        "n_ubatch": cp.n_ubatch,
        "n_threads": cp.n_threads,
        "n_threads_batch": cp.n_threads_batch,
        "flash_attn_type": int(cp.flash_attn_type),
        "flash_attn": args.flash_attn,
        "logits_all": bool(llm._logits_all),
        "type_k": int(cp.type_k),
        "type_v": int(cp.type_v),
    }


def serve(args) -> None:
    llama_cpp, llm = make_llama(args)
    r = Runner(llama_cpp, llm)
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "info":
                res = info(llama_cpp, llm, args)
            elif op == "decode":
                res = r.decode(req["prompt"], int(req["steps"]))
            elif op == "prefill":
                res = r.prefill(req["prompt"])
            elif op == "quit":
                break
            else:
                res = {"error": f"unknown op {op!r}"}
        except Exception as e:  # report, don't die: the parent shows it
            res = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(res) + "\n")
        out.flush()


def cold(args) -> None:
    t_import0 = time.perf_counter()
    llama_cpp, llm = make_llama(args)  # imports llama_cpp inside
    t_load = time.perf_counter()
    ids = llm.tokenize(args.prompt.encode("utf-8"), add_bos=True, special=False)
    t_tok = time.perf_counter()
    llm.eval(ids)
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    tok = int(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).argmax())
    t_first = time.perf_counter()
    sys.stdout.write(f"{tok}\n")
    sys.stdout.flush()
    sys.stdout.write(json.dumps({
        "token": tok,
        "prompt_tokens": len(ids),
        "stdlib_numpy_import_s": t_import0 - T_START,
        "import_and_load_s": t_load - t_import0,
        "tokenize_s": t_tok - t_load,
        "first_step_s": t_first - t_tok,
        "in_process_total_s": t_first - T_START,
    }) + "\n")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--flash-attn", choices=sorted(FLASH), default="auto")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--prompt", default="")
    args = ap.parse_args()
    if args.cold:
        cold(args)
    else:
        serve(args)


if __name__ == "__main__":
    main()
