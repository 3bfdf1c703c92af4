"""The housekeeping turn's copy of counters into Prometheus and systemd's STATUS line.

Every count here is a plain int that its owner keeps on its own thread (the engines' stats
tuples, the hand-offs' `full`, ingress and cache stats); this only reads and sums them, a
few times a second, so a scrape never touches a ring, a map or the engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import memory_bounds
from ..auth import ReplayGuard
from ..carriers import Carriers
from ..config import DaemonConfig
from ..engines import EngineSlot
from ..in_flight import InFlight
from ..ingress import Ingress
from ..lifecycle_events import Publisher
from .metrics import Metrics
from .sd_notify import Notifier

STATUS_S = 5.0            # STATUS= lines to systemd, at most this often


@dataclass
class Totals:
    running: int = 0
    waiting: int = 0      # the engines' wait queues and their admission hand-offs
    dead: int = 0


def engines(m: Metrics, slots: list[EngineSlot]) -> Totals:
    """Totals over the live engines, and each engine's own."""
    t = Totals()
    kv_held = kv_blocks = 0
    for slot in slots:
        if slot.dead or slot.thread is None:
            t.dead += 1
            m.update_engine(slot.index, 0, 0, 0.0, False)
            continue
        r, w, held = slot.thread.stats
        q = len(slot.admissions)
        _, blocks = slot.held_blocks()
        t.running, t.waiting = t.running + r, t.waiting + w + q
        kv_held, kv_blocks = kv_held + held, kv_blocks + blocks
        m.update_engine(slot.index, r, w + q, held / blocks if blocks else 0.0, True)
    m.running.set(t.running)
    m.waiting.set(t.waiting)
    m.kv_usage.set(kv_held / kv_blocks if kv_blocks else 0.0)  # cached prefixes are reclaimable
    m.update_handoff("admissions", sum(s.admissions.full for s in slots))
    m.update_handoff("events", sum(s.thread.events_full_waits for s in slots
                                   if s.thread is not None))
    return t


def buffers(m: Metrics, cfg: DaemonConfig, ingress: Ingress, replay: ReplayGuard,
            in_flight: InFlight, slots: list[EngineSlot], carriers: Carriers,
            publisher: Publisher | None) -> None:
    """Carriers, ingress, memory, lifecycle events and every OVERLOADED bound."""
    carriers.observe(m.carriers)
    m.update_ingress(ingress)
    m.update_memory(memory_bounds.buffers(cfg, replay, ingress.reassembler, in_flight.cache,
                                          slots, in_flight.admitted_bytes, carriers.umem_bytes))
    rs, ra = replay.stats, ingress.reassembler.stats
    if publisher is not None:
        m.update_events("published", publisher.published)
        m.update_events("dropped", publisher.dropped)
    m.update_overloaded({
        "nonce_cache": rs["full"], "nonce_key_share": rs["key_full"],
        "reassembly": ra["refused_budget"], "reassembly_key_share": ra["refused_key_share"],
        "result_cache": in_flight.cache.stats["refused"],
        "admissions": sum(s.admissions.full for s in slots),
        "wait_queue": sum(s.thread.waiting_full + s.refused_full for s in slots
                          if s.thread is not None)})


class StatusLine:
    """systemd's STATUS=: the state, requests running and waiting, tokens per second over
    the last interval; at most every STATUS_S."""

    def __init__(self, sd: Notifier) -> None:
        self.sd = sd
        self.at = 0.0
        self.tokens = 0

    def tick(self, now: float, state: str, t: Totals, n_engines: int, tokens_out: int) -> None:
        if not self.sd.enabled or now < self.at + STATUS_S:
            return
        rate = (tokens_out - self.tokens) / max(1e-9, now - self.at)
        degraded = f" (degraded: {t.dead} of {n_engines} engines dead)" if t.dead else ""
        self.sd.notify(f"STATUS={state}{degraded}: {t.running} running, "
                       f"{t.waiting} waiting, {rate:.1f} tok/s")
        self.at, self.tokens = now, tokens_out
