"""The repacked-model cache (model_cache.py) kept under a size bound.

Its entries are keyed by the runtime's source hash too, so every release repacks each model
once more and the old entries are never read again; nothing else removes them (a
development machine reached 7 GB). At start the daemon prunes the directory to [model]
cache_max_bytes, whole entries at a time (an entry with its int8 layouts), in this order:

1. entries written by another version of the runtime (their hash is not this one's): they
   can never be read again by this daemon;
2. then the least recently used: an entry's use is the mtime of its `used` file, touched
   each time it is loaded (its `done` file's until then).

The entry the daemon has just loaded is never removed, even if it alone is over the bound.
A daemon of another version still running from a removed entry keeps its memory-mapped
files until it exits (unlinked files stay readable while mapped).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field


@dataclass
class Entry:
    name: str
    dirs: list[str] = field(default_factory=list)
    size: int = 0
    runtime: str = ""
    used: float = 0.0


def _size(d: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(d):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def entries(models_dir: str) -> list[Entry]:
    """The cache's entries (temporary directories of a write in progress left out)."""
    try:
        names = sorted(os.listdir(models_dir))
    except OSError:
        return []
    out: dict[str, Entry] = {}
    for name in names:
        d = os.path.join(models_dir, name)
        if name.startswith(".tmp-") or not os.path.isdir(d):
            continue
        base = name.split("-int8-", 1)[0]
        e = out.setdefault(base, Entry(base))
        e.dirs.append(d)
        e.size += _size(d)
        if name == base:
            try:
                with open(os.path.join(d, "meta.json")) as f:
                    e.runtime = str(json.load(f).get("runtime", ""))
            except (OSError, ValueError):
                pass
            e.used = _mtime(os.path.join(d, "used")) or _mtime(os.path.join(d, "done"))
    return list(out.values())


def prune(models_dir: str, max_bytes: int, runtime: str, keep: str = "") -> list[str]:
    """Remove entries until the cache holds at most max_bytes (the `keep` entry aside);
    the names removed, in order."""
    all_entries = entries(models_dir)
    total = sum(e.size for e in all_entries)
    order = sorted((e for e in all_entries if e.name != keep),
                   key=lambda e: (e.runtime == runtime, e.used, e.name))
    removed = []
    for e in order:
        if total <= max_bytes:
            break
        for d in e.dirs:
            shutil.rmtree(d, ignore_errors=True)
        total -= e.size
        removed.append(e.name)
    return removed
