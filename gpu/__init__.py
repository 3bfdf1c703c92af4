"""zerolayer.gpu: the model runtime (GGUF, tokenizer, kernels with CPU twins, KV cache).

Numba is configured here, before any kernel module imports it:

* The JIT cache directory is keyed on a hash of every source file in this package. Numba's
  own cache key is the *defining* file's timestamp, so a changed helper in another file
  (a kernel inlined into the forward pass) would otherwise be served stale from the cache.
* The OpenMP threading layer: its fork/join is the cheapest of numba's layers for the
  ~200 small parallel regions of one decode step. Its idle threads spin before sleeping;
  the spin is bounded (GOMP_SPINCOUNT) because on a shared machine an unbounded spin at each
  barrier, with a thread descheduled, turned a 15 ms step into 1.4 s. On isolated cores
  (deploy/), the systemd unit raises it.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

__version__ = "0.1.0"


def _source_hash() -> str:
    """Hash of the CPU runtime's sources. gpu/cuda/ is left out: the CPU kernels and the
    repacked weights don't depend on it, and a CUDA edit shouldn't recompile them."""
    h = hashlib.sha256(__version__.encode())
    root = Path(__file__).resolve().parent
    for path in sorted(p for p in root.rglob("*.py") if "cuda" not in p.relative_to(root).parts):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _configure_numba() -> None:
    base = os.environ.get("ZEROLAYER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "zerolayer")
    cache_dir = os.path.join(base, "numba", _source_hash())
    os.environ.setdefault("NUMBA_CACHE_DIR", cache_dir)
    os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")
    os.environ.setdefault("GOMP_SPINCOUNT", "20000")
    import sys
    if "numba" in sys.modules:  # imported earlier by someone else: set the live config too
        import numba
        numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
        numba.config.THREADING_LAYER = os.environ["NUMBA_THREADING_LAYER"]


_configure_numba()

# The device is chosen here, before anything imports numba (see backend.py).
from . import backend  # noqa: E402,F401
