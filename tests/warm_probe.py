"""Run in a fresh interpreter by tests/test_warmup.py: load a model through Generator.load
(warm-up on), then serve first requests the ways the daemon does (the Generator alone, the
engine's batched steps with chunked prefill, sampling and penalties), and print as JSON
which Numba kernels compiled, or gained a signature (a JIT-cache load counts too), after
warm-up. A fresh process, because kernels another test already ran in the same process
would hide a warm-up that misses them.

    python tests/warm_probe.py MODEL.gguf
"""
from __future__ import annotations

import json
import sys

import numpy as np


def signatures() -> dict[str, int]:
    """Signatures of every Numba dispatcher in the runtime's modules."""
    from numba.core.registry import CPUDispatcher
    out = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("zerolayer.gpu") or mod is None:
            continue
        for obj in vars(mod).values():
            if isinstance(obj, CPUDispatcher):
                out[f"{obj.py_func.__module__}.{obj.py_func.__qualname__}"] = len(obj.overloads)
    return out


def first_requests(gen) -> None:
    from zerolayer.daemon.engine import Engine
    from zerolayer.daemon.request import Admitted
    from zerolayer.protocol.sampling_params import SamplingParams
    vocab = gen.model.cfg.vocab
    ids = [int(i) for i in np.arange(3, 3 + 40) % vocab]
    gen.complete(token_ids=ids, params=SamplingParams(max_tokens=4))
    gen.complete(token_ids=ids[:5], params=SamplingParams(max_tokens=4, temperature=0.8, seed=1,
                                                          repetition_penalty=1.3))
    eng = Engine(gen.model, gen.tokenizer, emit=lambda ev: None, max_running=8, step_tokens=32)
    params = [SamplingParams(max_tokens=6), SamplingParams(max_tokens=6, temperature=0.7, seed=2),
              SamplingParams(max_tokens=6, frequency_penalty=0.5, presence_penalty=0.5)]
    for k in range(6):  # prompts of 3..83 tokens: chunked prefill mixed with batched decodes
        n = 3 + 16 * k
        eng.submit(Admitted(k, params[k % 3]), np.arange(3, 3 + n) % vocab)
    for _ in range(500):
        if not eng.has_work:
            break
        eng.step()
    assert not eng.has_work


def main(path: str) -> None:
    from numba.core import event

    from zerolayer.gpu.generate import Generator
    gen = Generator.load(path)
    before = signatures()
    compiled = []

    class Listener(event.Listener):
        def on_start(self, ev):
            pass

        def on_end(self, ev):
            d = ev.data.get("dispatcher")
            compiled.append(getattr(getattr(d, "py_func", None), "__qualname__", str(d)))

    with event.install_listener("numba:compile", Listener()):
        first_requests(gen)
    after = signatures()
    grew = {k: (before.get(k, 0), v) for k, v in after.items() if v != before.get(k, 0)}
    print(json.dumps({"compiled": compiled, "new_signatures": grew,
                      "warm_signatures": sum(before.values())}))


if __name__ == "__main__":
    main(sys.argv[1])
