#!/usr/bin/env python
"""Several engines vs one, in one run, on the same model and CPUs ([[engines]]): aggregate
tok/s of concurrent streams; see bench/README.md ("bench_engines.py").
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
from _harness import ZeroLayerDaemon, bench_lock, log, md_table, spawn  # noqa: E402

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

    threads = spawn(streams, one)
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
    ap = argparse.ArgumentParser(description=__doc__)
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
                daemons[name] = ZeroLayerDaemon(sys.executable, a.model, threads, 2048, tmp,
                                                tmp / f"zerolayerd-{name}.log", extra=extra)
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
    print(md_table(["configuration", "median tok/s"], [
        [f"{n} engines x 1 thread (engines)", f"{med['engines']:.1f}"],
        [f"1 engine x {n} threads (single)", f"{med['single']:.1f}"],
        ["ratio engines / single", result["ratio_engines_over_single"]]]))
    print(json.dumps(result))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
