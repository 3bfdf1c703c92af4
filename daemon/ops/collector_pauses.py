"""Python's cyclic collector, kept off the serving path and made visible.

Why freeze: after the load, the process holds ~10^5 long-lived objects (the tokenizer's
tables, Numba's dispatchers, the grammar library's state, the metrics). A full collection
walks every one of them, and with the GIL held: measured at ~57 ms on an AMD EPYC Zen 4 for the
bundled model, i.e. a stall of every thread, the I/O thread's PINGs and the engine's steps
included, several times a typical first token. None of those objects ever becomes garbage,
so `gc.freeze()` once the model is warm moves them to the permanent generation: collections
then walk only what serving allocates (the same walk measured 0.03 ms). This is what vLLM and
Instagram's servers do after start-up for the same reason. The cost: a frozen object that a
reload later drops is freed by reference counting, but a cycle among such objects stays (once
per reload, bounded by what the load built).

Why a custom collector: the pause is measured in a `gc.callbacks` hook, which runs inside
whatever allocation triggered the collection, possibly while this thread holds a metric's
lock. So the hook only bumps plain integers (atomic under the GIL, no lock, no allocation
beyond small ints), and Prometheus reads them at scrape time.
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric

# Seconds: a young collection is tens of µs; a full one over unfrozen objects is tens of ms.
BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5)
GENERATIONS = 3


class CollectorPauses:
    """Every collection's wall time, by generation, as cumulative histogram buckets."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._start = 0.0
        # [generation][bucket]: observations <= BUCKETS[bucket]; the last slot is +Inf
        self.buckets = [[0] * (len(BUCKETS) + 1) for _ in range(GENERATIONS)]
        self.sums = [0.0] * GENERATIONS
        self.worst = 0.0

    def hook(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = self._clock()
            return
        s = self._clock() - self._start
        g = info["generation"]
        self.sums[g] += s
        if s > self.worst:
            self.worst = s
        row = self.buckets[g]
        for i, bound in enumerate(BUCKETS):
            if s <= bound:
                row[i] += 1
                return
        row[-1] += 1

    def install(self) -> None:
        if self.hook not in gc.callbacks:
            gc.callbacks.append(self.hook)

    def uninstall(self) -> None:
        if self.hook in gc.callbacks:
            gc.callbacks.remove(self.hook)

    def collect(self) -> Iterator[Metric]:
        h = HistogramMetricFamily("zerolayer_gc_pause_seconds",
                                  "Python collector pauses (all threads stop), by generation",
                                  labels=["generation"])
        for g in range(GENERATIONS):
            cum, counts = 0, []
            for i, bound in enumerate(BUCKETS):
                cum += self.buckets[g][i]
                counts.append((repr(bound), cum))
            counts.append(("+Inf", cum + self.buckets[g][-1]))
            h.add_metric([str(g)], counts, self.sums[g])
        yield h
        yield GaugeMetricFamily("zerolayer_gc_pause_max_seconds",
                                "The longest collector pause since the daemon was warm", value=self.worst)
        yield GaugeMetricFamily("zerolayer_gc_frozen_objects",
                                "Objects moved out of the collector's reach once warm",
                                value=gc.get_freeze_count())


    def warm(self) -> int:
        """The model is warm: freeze what the load built (returns how many objects), and
        count the worst pause from here on, the load's own collections being no one's wait."""
        frozen = freeze_warm_objects()
        self.worst = 0.0
        return frozen


def freeze_warm_objects() -> int:
    """Collect what the load left behind, then freeze the survivors; returns how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def register(registry: CollectorRegistry) -> CollectorPauses:
    pauses = CollectorPauses()
    registry.register(pauses)
    pauses.install()
    return pauses
