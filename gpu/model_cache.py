"""A cache of the kernel-ready model next to the JIT cache, for a cold start in about a second.

Parsing the GGUF metadata (98k tokenizer strings) and repacking the weights takes ~4 s; the
repacked arrays, the config and the tokenizer's metadata are saved once as .npy/.json and
then memory-mapped (copy-on-write, so the arrays keep the writable type the compiled
kernels were specialised for). The key covers the file's path, size and mtime and the
runtime's source hash, so a changed model or a changed repacking never reads stale data.
Writes go to a temporary directory renamed into place, so a crash leaves no half cache.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile

import numpy as np

from . import _source_hash
from .gguf_loader import ModelConfig, ModelWeights
from .quant import Weight

_WEIGHTS = ("emb", "wqkv", "wo", "wgu", "wdown", "output")
_ARRAYS = ("attn_norm", "ffn_norm", "out_norm")
_OPTIONAL = ("qkv_bias", "rope_freqs")  # ModelWeights fields that may be None


def cache_dir(path: str) -> str:
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{_source_hash()}".encode())
    base = os.path.dirname(os.environ["NUMBA_CACHE_DIR"].rstrip("/"))  # .../zerolayer/numba
    return os.path.join(os.path.dirname(base), "models", key.hexdigest()[:24])


def load(path: str):
    """(config, weights, tokenizer metadata) from the cache, or None."""
    d = cache_dir(path)
    if not os.path.exists(os.path.join(d, "done")):
        return None
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)

    def arr(name: str) -> np.ndarray:
        return np.load(os.path.join(d, name + ".npy"), mmap_mode="c")

    weights = {n: Weight(meta["fmt"][n], *(arr(f"{n}.{k}") for k in ("qs", "d", "m", "w"))) for n in _WEIGHTS}
    weights.update({n: arr(n) for n in _ARRAYS})
    weights.update({n: arr(n) for n in _OPTIONAL if os.path.exists(os.path.join(d, n + ".npy"))})
    return ModelConfig(**meta["config"]), ModelWeights(**weights), meta["tokenizer"]


def save(path: str, cfg: ModelConfig, w: ModelWeights, tokenizer_meta: dict) -> None:
    d = cache_dir(path)
    os.makedirs(os.path.dirname(d), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(d), prefix=".tmp-")
    try:
        for n in _WEIGHTS:
            wt: Weight = getattr(w, n)
            for k in ("qs", "d", "m", "w"):
                np.save(os.path.join(tmp, f"{n}.{k}.npy"), getattr(wt, k))
        for n in _ARRAYS:
            np.save(os.path.join(tmp, n + ".npy"), getattr(w, n))
        for n in _OPTIONAL:
            if getattr(w, n) is not None:
                np.save(os.path.join(tmp, n + ".npy"), getattr(w, n))
        meta = {"config": dataclasses.asdict(cfg), "tokenizer": tokenizer_meta,
                "fmt": {n: getattr(w, n).fmt for n in _WEIGHTS}, "source": path}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f)
        open(os.path.join(tmp, "done"), "w").close()
        if os.path.exists(d):
            shutil.rmtree(d)
        os.rename(tmp, d)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # a read-only cache dir only costs speed
