#!/usr/bin/env python
"""Several engines vs one, in one run, on the same model and CPUs ([[engines]]).

    .venv/bin/python bench/bench_engines.py [--streams 16] [--tokens 200] [--rounds 3]
                                            [--cpus 0,1] [--model PATH] [--out PATH]

Two zerolayerd, both up for the whole run (only one has requests in flight at a time):
  A  "engines": one engine per CPU of --cpus, 1 kernel thread each, pinned
     (--engines '[{cpus="0", threads=1}, {cpus="1", threads=1}]');
  B  "single":  one engine with one kernel thread per CPU of --cpus, pinned to all of them
     (--cpu-engine-cpus 0-1 --model-threads 2).
Each round runs --streams concurrent streams of --tokens tokens (distinct chat prompts "Write
a long story about TOPIC.", greedy; a stream may stop early at EOS, so tokens are counted
from DONE's usage) against A and B, alternating which goes first. Aggregate tok/s =
completion tokens of all streams / wall time from a common start to the last stream's DONE;
the median over rounds of each, and A/B. `--engine-max-running` is --streams for B and
ceil(--streams / engines) for A, so both batch every stream at once. Holds /tmp/zl-bench.lock.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import ZeroLayerDaemon, bench_lock, log  # noqa: E402

TOPICS = ["the sea", "volcanoes", "the moon", "bees", "rivers", "trains", "chess", "coffee",
          "lighthouses", "glaciers", "owls", "bridges", "deserts", "clocks", "whales", "maps"]


def run_streams(d: ZeroLayerDaemon, streams: int, tokens: int) -> dict:
    from zerolayer.protocol.wire import ChatMessage
    start = threading.Barrier(streams + 1)
    done: list[tuple[int, float]] = []   # list.append is atomic: the threads share these
    errors: list[str] = []

    def one(i: int) -> None:
        c = d.client(timeout=600)
        start.wait()
        try:
            r = c.invoke(messages=[ChatMessage(
                "user", f"Write a long story about {TOPICS[i % len(TOPICS)]}.")],
                max_tokens=tokens)
            done.append((r.usage.completion_tokens, time.perf_counter()))
        except Exception as e:  # noqa: BLE001 - reported, the round is then invalid
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} stream(s) failed: {errors[:3]}")
    wall = max(t for _, t in done) - t0
    toks = sum(n for n, _ in done)
    return {"tokens": toks, "wall_s": round(wall, 4), "tok_s": round(toks / wall, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpus", default="0,1", help="CPUs both configurations run on")
    ap.add_argument("--model", default="", help="GGUF (default: the bundled model)")
    ap.add_argument("--quick", action="store_true", help="4 streams x 16 tokens, 1 round")
    ap.add_argument("--out", help="write the JSON result here too")
    a = ap.parse_args(argv)
    if a.quick:
        a.streams, a.tokens, a.rounds = 4, 16, 1
    from zerolayer.daemon.config import parse_cpus
    cpus = sorted(parse_cpus(a.cpus))
    n = len(cpus)
    if n < 2:
        raise SystemExit("--cpus needs at least two CPUs")
    spec = "[" + ", ".join(f'{{cpus="{c}", threads=1}}' for c in cpus) + "]"
    configs = {  # name: (model threads, flags)
        "engines": (1, ["--engines", spec, "--engine-max-running", str(-(-a.streams // n))]),
        "single": (n, ["--cpu-engine-cpus", ",".join(map(str, cpus)),
                       "--engine-max-running", str(a.streams)]),
    }
    tmp = Path(tempfile.mkdtemp(prefix="zl-bench-engines-"))
    daemons: dict[str, ZeroLayerDaemon] = {}
    result: dict = {"streams": a.streams, "tokens": a.tokens, "rounds": a.rounds,
                    "cpus": cpus, "engines_spec": spec, "runs": {k: [] for k in configs}}
    with bench_lock(" ".join(sys.argv)):
        try:
            for name, (threads, extra) in configs.items():
                (tmp / name).mkdir()
                daemons[name] = ZeroLayerDaemon(sys.executable, a.model, threads, 2048, tmp / name,
                                                tmp / name / "zerolayerd.log", extra=extra)
            for dm in daemons.values():
                dm.wait_ready()
            log("both daemons ready; warming each with one round of 2 streams")
            for dm in daemons.values():
                run_streams(dm, 2, 8)
            for rnd in range(a.rounds):
                for name in list(configs)[::1 if rnd % 2 == 0 else -1]:
                    r = run_streams(daemons[name], a.streams, a.tokens)
                    result["runs"][name].append(r)
                    log(f"round {rnd + 1}/{a.rounds} {name}: {r['tok_s']} tok/s "
                        f"({r['tokens']} tokens in {r['wall_s']} s)")
        finally:
            for dm in daemons.values():
                dm.stop()
    med = {k: statistics.median(x["tok_s"] for x in v) for k, v in result["runs"].items()}
    result["median_tok_s"] = med
    result["ratio_engines_over_single"] = (round(med["engines"] / med["single"], 3)
                                           if med["single"] else None)
    print(f"\n{'configuration':<34} {'median tok/s':>12}")
    for label, v in ((f"{n} engines x 1 thread (engines)", f"{med['engines']:.1f}"),
                     (f"1 engine x {n} threads (single)", f"{med['single']:.1f}"),
                     ("ratio engines / single", str(result["ratio_engines_over_single"]))):
        print(f"{label:<34} {v:>12}")
    print(json.dumps(result))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
