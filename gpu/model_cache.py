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
import pathlib
import shutil
import tempfile

import numpy as np

from . import _source_hash, model_cache_prune
from .gguf_loader import ModelConfig, ModelWeights
from .quant import Array, Weight
from .tokenizer import TokenizerMeta

_WEIGHTS = ("emb", "wqkv", "wo", "wgu", "wdown", "output")
_ARRAYS = ("attn_norm", "ffn_norm", "out_norm")
_OPTIONAL = ("qkv_bias", "rope_freqs")  # ModelWeights fields that may be None


def prune_to(path: str, max_bytes: int) -> list[str]:
    """Prune the cache to max_bytes, keeping the entry of the model at `path`
    (model_cache_prune.py); the entries removed."""
    d = cache_dir(path)
    return model_cache_prune.prune(os.path.dirname(d), max_bytes, _source_hash(),
                                   keep=os.path.basename(d))


def cache_dir(path: str) -> str:
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{_source_hash()}".encode())
    base = os.path.dirname(os.environ["NUMBA_CACHE_DIR"].rstrip("/"))  # .../zerolayer/numba
    return os.path.join(os.path.dirname(base), "models", key.hexdigest()[:24])


def load(path: str) -> tuple[ModelConfig, ModelWeights, TokenizerMeta | None] | None:
    """(config, weights, tokenizer metadata) from the cache, or None."""
    d = cache_dir(path)
    if not os.path.exists(os.path.join(d, "done")):
        return None
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    try:  # its last use, which the size bound reads (model_cache_prune.py)
        pathlib.Path(d, "used").touch()
    except OSError:
        pass  # a read-only cache is still read

    def arr(name: str) -> Array:
        return np.load(os.path.join(d, name + ".npy"), mmap_mode="c")

    weights = _load_weights(d, {n: meta["fmt"][n] for n in _WEIGHTS})
    weights.update({n: arr(n) for n in _ARRAYS})
    weights.update({n: arr(n) for n in _OPTIONAL if os.path.exists(os.path.join(d, n + ".npy"))})
    return ModelConfig(**meta["config"]), ModelWeights(**weights), meta["tokenizer"]


def _save_weights(tmp: str, weights: dict[str, Weight]) -> None:
    for n, wt in weights.items():
        for k in ("qs", "d", "m", "w"):
            np.save(os.path.join(tmp, f"{n}.{k}.npy"), getattr(wt, k))
        if wt.lf is not None:  # a mixed stack's per-layer table
            np.save(os.path.join(tmp, f"{n}.lf.npy"), wt.lf)


def _load_weights(d: str, fmts: dict[str, int]) -> dict:
    def lf(n: str) -> Array | None:
        p = os.path.join(d, f"{n}.lf.npy")
        return np.load(p) if os.path.exists(p) else None

    def one(n: str, f: int) -> Weight:
        qs, dd, m, w = (np.load(os.path.join(d, f"{n}.{k}.npy"), mmap_mode="c")
                        for k in ("qs", "d", "m", "w"))
        return Weight(f, qs, dd, m, w, lf(n))

    return {n: one(n, f) for n, f in fmts.items()}


def _commit(tmp: str, d: str) -> None:
    """The finished temporary directory becomes d (a reader never sees half of one)."""
    open(os.path.join(tmp, "done"), "w").close()
    if os.path.exists(d):
        shutil.rmtree(d)
    os.rename(tmp, d)


def _prune(source: str, keep: str) -> None:
    """Remove the caches of `source` that `keep` replaces (another file version or another
    runtime version: a key that will never be asked for again), with their int8 layouts.
    A daemon still running from one keeps its memory-mapped files until it exits."""
    base = os.path.dirname(keep)
    for name in os.listdir(base):
        d = os.path.join(base, name)
        if d == keep or name.startswith(".tmp-") or "-int8-" in name:
            continue
        try:
            with open(os.path.join(d, "meta.json")) as f:
                if os.path.abspath(json.load(f).get("source", "")) != source:
                    continue
        except (OSError, ValueError):
            continue
        for stale in [d] + [os.path.join(base, n) for n in os.listdir(base)
                            if n.startswith(name + "-int8-")]:
            shutil.rmtree(stale, ignore_errors=True)


# The int8 layout's version: a change of what prepare() writes (the arrays' shapes or
# meaning) bumps it, so an old cache entry is never read as the new layout (the source hash
# in cache_dir changes with any edit too; this names the layout itself).
# 2: flat per-layer slots with segments, the files' own scale forms.
PREPARED_LAYOUT = 2


def prepared_dir(path: str, key: str) -> str:
    return f"{cache_dir(path)}-int8-v{PREPARED_LAYOUT}-{key}"


def load_prepared(path: str, key: str) -> dict | None:
    """The matmul weights as the integer kernels of a kernel set (cpu_features.layout_key)
    want them (gpu/ops/int8_matmul.py's prepare_model: packed bits, float16 scales), or
    None: re-packing a model takes about a second, a cold start's budget, so it is done once
    and memory-mapped after."""
    d = prepared_dir(path, key)
    if not os.path.exists(os.path.join(d, "done")):
        return None
    with open(os.path.join(d, "meta.json")) as f:
        return _load_weights(d, json.load(f)["fmt"])


def save_prepared(path: str, key: str, weights: dict[str, Weight]) -> None:
    d = prepared_dir(path, key)
    os.makedirs(os.path.dirname(d), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(d), prefix=".tmp-")
    try:
        _save_weights(tmp, weights)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({"fmt": {n: w.fmt for n, w in weights.items()}, "kernels": key}, f)
        _commit(tmp, d)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # a read-only cache dir only costs speed


def save(path: str, cfg: ModelConfig, w: ModelWeights,
         tokenizer_meta: TokenizerMeta | None) -> None:
    d = cache_dir(path)
    os.makedirs(os.path.dirname(d), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(d), prefix=".tmp-")
    try:
        _save_weights(tmp, {n: getattr(w, n) for n in _WEIGHTS})
        for n in _ARRAYS:
            np.save(os.path.join(tmp, n + ".npy"), getattr(w, n))
        for n in _OPTIONAL:
            if getattr(w, n) is not None:
                np.save(os.path.join(tmp, n + ".npy"), getattr(w, n))
        meta = {"config": dataclasses.asdict(cfg), "tokenizer": tokenizer_meta,
                "fmt": {n: getattr(w, n).fmt for n in _WEIGHTS}, "source": path,
                "runtime": _source_hash()}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f)
        open(os.path.join(tmp, "used"), "w").close()
        _commit(tmp, d)
        _prune(os.path.abspath(path), d)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # a read-only cache dir only costs speed
