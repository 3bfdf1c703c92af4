"""`zerolayer` command line: generate locally, and (with the daemon) invoke, ping, keygen."""
from __future__ import annotations

import argparse
import sys
import time


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="GGUF file (default: bundled SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--threads", type=int, help="kernel threads (default: CPUs we may run on)")
    p.add_argument("--max-seq-len", type=int, help="context limit (default: the model's)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def cmd_generate(args: argparse.Namespace) -> int:
    from zerolayer.gpu.errors import RuntimeModelError
    from zerolayer.gpu.generate import Generator, SamplingParams, stderr_log

    try:
        gen = Generator.load(args.model, threads=args.threads, max_seq_len=args.max_seq_len,
                             log=stderr_log)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                stop=tuple(args.stop))
        kw = {"prompt": args.text} if args.raw else {"messages": [{"role": "user", "content": args.text}]}
        t0 = time.perf_counter()
        first = None
        for chunk in gen.generate(**kw, params=params):
            if first is None:
                first = time.perf_counter() - t0
            sys.stdout.write(chunk)
            sys.stdout.flush()
        sys.stdout.write("\n")
    except (RuntimeModelError, ValueError) as e:
        print(f"zerolayer: error: {e}", file=sys.stderr)
        return 2
    r = gen.last
    tps = r.completion_tokens / r.decode_s if r.decode_s > 0 else 0.0
    stderr_log(f"{r.prompt_tokens} prompt tokens in {r.prefill_s * 1e3:.1f} ms, "
               f"{r.completion_tokens} tokens at {tps:.1f} tok/s, "
               f"first token {1e3 * (first or 0):.1f} ms, finish: {r.finish_reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="zerolayer", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="run the model in this process and stream the answer")
    g.add_argument("text")
    g.add_argument("--raw", action="store_true", help="raw prompt, no chat template")
    _add_model_args(g)
    _add_sampling_args(g)
    g.set_defaults(func=cmd_generate)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
