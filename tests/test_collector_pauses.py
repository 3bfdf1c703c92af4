"""The collector's pauses as metrics, and the warm daemon's objects frozen out of its reach
(daemon/ops/collector_pauses.py)."""
from __future__ import annotations

import gc
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from daemon_proc import DaemonProc
from zerolayer.client import Client
from zerolayer.daemon.ops.collector_pauses import CollectorPauses


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_each_pause_lands_in_its_generations_bucket_and_the_worst_is_kept():
    clock = FakeClock()
    p = CollectorPauses(clock)
    for gen, seconds in ((0, 3e-5), (0, 7e-5), (2, 0.02), (2, 0.7)):
        p.hook("start", {"generation": gen})
        clock.t += seconds
        p.hook("stop", {"generation": gen})
    r = CollectorRegistry()
    r.register(p)
    text = generate_latest(r).decode()
    assert 'zerolayer_gc_pause_seconds_bucket{generation="0",le="0.0001"} 2.0' in text
    assert 'zerolayer_gc_pause_seconds_bucket{generation="2",le="0.01"} 0.0' in text
    assert 'zerolayer_gc_pause_seconds_bucket{generation="2",le="0.05"} 1.0' in text
    assert 'zerolayer_gc_pause_seconds_bucket{generation="2",le="0.5"} 1.0' in text
    assert 'zerolayer_gc_pause_seconds_bucket{generation="2",le="+Inf"} 2.0' in text
    assert 'zerolayer_gc_pause_seconds_count{generation="1"} 0.0' in text
    assert r.get_sample_value("zerolayer_gc_pause_seconds_sum", {"generation": "2"}) \
        == pytest.approx(0.72)
    assert r.get_sample_value("zerolayer_gc_pause_max_seconds") == pytest.approx(0.7)


def test_the_hook_sees_real_collections():
    p = CollectorPauses()
    p.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        p.uninstall()
    assert sum(p.buckets[0]) >= 1 and sum(p.buckets[2]) >= 1
    assert p.hook not in gc.callbacks


def test_freezing_takes_the_survivors_out_of_a_full_collection():
    survivors = [[i] for i in range(20_000)]  # tracked containers, alive throughout
    pauses = CollectorPauses()
    pauses.worst = 0.5   # a pause during the load
    # Other threads of this process (left by earlier tests) may free frozen objects, which
    # lowers the count: keep the GIL from them between the freeze and the count.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        frozen = pauses.warm()
        count = gc.get_freeze_count()
        sys.setswitchinterval(interval)
        assert pauses.worst == 0.0
        assert frozen >= len(survivors) and count == frozen
        in_reach = {id(o) for o in gc.get_objects()}   # every generation but the frozen
        assert not any(id(s) in in_reach for s in survivors)
    finally:
        sys.setswitchinterval(interval)
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_a_warm_daemon_has_frozen_its_load_and_reports_its_pauses(tmp_path):
    d = DaemonProc(tmp_path)
    try:
        assert d.metric("zerolayer_gc_frozen_objects") >= 10_000
        assert any("objects frozen" in line for line in d.log)
        c = Client(d.addr, d.key_id, d.secret, timeout=60)
        for i in range(4):
            c.invoke(prompt=f"{i} + {i} =", max_tokens=8)
        young = d.metric("zerolayer_gc_pause_seconds_count", 'generation="0"')
        assert young >= 1   # serving allocates: young collections ran, and were seen
    finally:
        assert d.stop() == 0
