"""Several engines in one daemon ([[engines]]): what the I/O thread keeps per engine, and how
an engine after the first gets its model without loading the weights again.

Each engine is one EngineThread with its own admissions and events hand-offs, CPUs, kernel
thread count (Numba's is per thread), KV arena, prefix cache and Engine. On the CPU backend
the weights are loaded once, by engine 0; the others get a copy of its LlamaModel object
sharing every read-only array (weights, repacked matmul layouts, RoPE tables, tokenizer
metadata) with a KV arena of their own. On a GPU each engine wraps its own copy in a
CudaModel, which uploads the weights to its device.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import DaemonConfig, EngineSpec, parse_cpus
from .engine_thread import EngineThread
from .handoff import Handoff
from .request import EngineEvent, Submission

if TYPE_CHECKING:
    from zerolayer.gpu.generate import Generator
    from zerolayer.gpu.model import LlamaModel
    from zerolayer.gpu.model_api import Model


@dataclass(eq=False)
class EngineSlot:
    """One engine, as the I/O thread sees it. Every field is the I/O thread's, except
    `thread` (its own) and `model`, `threads` (written once by the engine thread at load).
    The requests it holds are counted in the in-flight record (in_flight.py), not here."""
    index: int
    spec: EngineSpec | None                 # None: the single engine of [cpu]/[engine]
    admissions: Handoff[Submission]
    events: Handoff[EngineEvent]
    cpus: set[int] | None = None
    thread: EngineThread | None = None
    model: Model | None = None              # None until its thread has loaded it
    threads: int = 0                        # kernel threads of its thread
    dead: str = ""                          # why it died; "" while it serves
    refused_full: int = 0                   # OVERLOADED: it held its capacity (admission.py)

    def held_blocks(self) -> tuple[int, int]:
        """(KV blocks held by requests, blocks in the arena); (0, 0) before it loaded."""
        if self.model is None or self.thread is None:
            return 0, 0
        return self.thread.stats[2], self.model.arena.n_blocks


def idle(slots: list[EngineSlot]) -> bool:
    """Nothing for any live engine to do: the I/O thread may spend the core on polling."""
    for s in slots:
        if s.dead or s.thread is None:
            continue
        running, waiting, _ = s.thread.stats
        if running or waiting or len(s.admissions):
            return False
    return True


def cpu_problems(cfg: DaemonConfig) -> list[str]:
    """Each [[engines]] table whose cpus the daemon may not run on ([cpu] cpus, else this
    process's affinity): refused before the model loads, naming the engine."""
    avail = parse_cpus(cfg.cpu.cpus) if cfg.cpu.cpus else os.sched_getaffinity(0)
    out = []
    for i, spec in enumerate(cfg.engines):
        missing = sorted(parse_cpus(spec.cpus) - avail) if spec.cpus else []
        if missing:
            out.append(f"engines[{i}].cpus {spec.cpus!r}: CPU(s) {missing} not available to "
                       f"the daemon (it may run on {sorted(avail)})")
    return out


def sibling_model(base: Model, kv_blocks: int | None) -> LlamaModel:
    """A host (CPU) LlamaModel sharing `base`'s read-only arrays, with its own KV arena.

    What a LlamaModel holds per instance (gpu/model.py): `arena`, the only state a step
    writes; everything else (cfg, w, cos/sin, qkv_bias, _wargs, tokenizer_meta, path,
    max_seq_len) is read-only after __init__, so a shallow copy shares it safely. If a
    per-instance scratch buffer is ever added there, it must be replaced here too."""
    from zerolayer.gpu.kv_cache import KVArena
    from zerolayer.gpu.model import LlamaModel
    from zerolayer.gpu.ops.attention import BLOCK_TOKENS
    if isinstance(base, LlamaModel):
        host = base
    else:  # a CudaModel wraps one
        from zerolayer.gpu.cuda.forward import CudaModel
        if not isinstance(base, CudaModel):
            raise TypeError(f"engine 0's model is a {type(base).__name__}, not a LlamaModel "
                            f"or a CudaModel over one")
        host = base.model
    m = copy.copy(host)
    cfg = m.cfg
    if kv_blocks is None:  # as LlamaModel: room for 16 full-length sequences
        kv_blocks = 16 * -(-m.max_seq_len // BLOCK_TOKENS)
    m.arena = KVArena(cfg.n_layer, cfg.n_kv, cfg.head_dim, kv_blocks, m.max_seq_len,
                      host.arena.k_pool.dtype)
    return m


def load_sibling(base: Model, *, threads: int | None, kv_blocks: int | None, warmup: bool,
                 log: Callable[[str], None]) -> Generator:
    """Engine i > 0: set this thread's kernel threads, make its model over engine 0's
    weights (on the chosen backend), warm it up on this thread. Returns a Generator."""
    import time

    from zerolayer.gpu.generate import Generator, on_backend
    from zerolayer.gpu.model import set_threads
    t0 = time.perf_counter()
    n = set_threads(threads)
    model = on_backend(sibling_model(base, kv_blocks))
    gen = Generator(model, model.tokenizer())
    if warmup:
        gen.warmup()
    log(f"engine model over the shared weights, {n} CPU threads, "
        f"{model.arena.n_blocks} KV blocks, warm in {time.perf_counter() - t0:.2f} s")
    return gen
