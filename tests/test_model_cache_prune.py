"""The repacked-model cache's size bound (gpu/model_cache_prune.py): whole entries go, other
runtime versions first, then the least recently used, the entry in use never. Entries are
made here with the sizes, versions and use times each case needs (mtimes set explicitly)."""
from __future__ import annotations

import json
import os

from zerolayer.gpu import model_cache_prune as prune

MB = 1 << 20


def entry(d, name: str, mb: int, runtime: str, used: float, int8: int = 0) -> None:
    e = d / name
    e.mkdir()
    (e / "meta.json").write_text(json.dumps({"runtime": runtime}))
    (e / "w.npy").write_bytes(b"\0" * (mb * MB))
    (e / "done").touch()
    (e / "used").touch()
    os.utime(e / "used", (used, used))
    if int8:
        p = d / f"{name}-int8-avx2"
        p.mkdir()
        (p / "qs.npy").write_bytes(b"\0" * (int8 * MB))


def names(d) -> set[str]:
    return {p.name for p in d.iterdir()}


def test_other_versions_go_first_then_the_least_recently_used(tmp_path):
    entry(tmp_path, "old-release", 3, "aaa", used=5000, int8=1)   # used last, but stale
    entry(tmp_path, "cold", 3, "now", used=1000)
    entry(tmp_path, "warm", 3, "now", used=2000)
    entry(tmp_path, "in-use", 3, "now", used=3000)
    # 13 MB held; 7 allowed: the other version (4 MB with its int8 layout), then "cold"
    assert prune.prune(str(tmp_path), 7 * MB, "now", keep="in-use") == ["old-release",
                                                                       "cold"]
    assert names(tmp_path) == {"warm", "in-use"}


def test_within_the_bound_nothing_goes(tmp_path):
    entry(tmp_path, "a", 2, "old", used=1)
    entry(tmp_path, "b", 2, "now", used=2)
    assert prune.prune(str(tmp_path), 5 * MB, "now", keep="b") == []
    assert names(tmp_path) == {"a", "b"}


def test_the_entry_in_use_stays_even_over_the_bound(tmp_path):
    entry(tmp_path, "big", 5, "now", used=1, int8=2)
    entry(tmp_path, "other", 1, "now", used=2)
    (tmp_path / ".tmp-writing").mkdir()     # a write in progress is not an entry
    assert prune.prune(str(tmp_path), 1 * MB, "now", keep="big") == ["other"]
    assert names(tmp_path) == {"big", "big-int8-avx2", ".tmp-writing"}


def test_loading_marks_the_entry_used_and_saving_records_the_runtime(tmp_path, monkeypatch,
                                                                      tiny_path):
    from zerolayer.gpu import _source_hash, model_cache
    from zerolayer.gpu.model import LlamaModel
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba" / "x"))
    LlamaModel.load(tiny_path)
    d = model_cache.cache_dir(tiny_path)
    assert json.load(open(os.path.join(d, "meta.json")))["runtime"] == _source_hash()
    os.utime(os.path.join(d, "used"), (1, 1))
    LlamaModel.load(tiny_path)
    assert os.stat(os.path.join(d, "used")).st_mtime > 1
    assert model_cache.prune_to(tiny_path, 0) == []   # the model in use is kept
