"""What each lifecycle move means outside the machine (lifecycle.py): the state metric,
systemd's notifications, the log. The machine's table decides a move; this only reports it.
Ingress asks the machine itself whether new work is refused, so no object keeps a copy of
the phase to fall out of step with it.
"""
from __future__ import annotations

from ..in_flight import InFlight
from ..lifecycle import Event, Lifecycle, Phase
from .logs import Log
from .metrics import Metrics
from .sd_notify import Notifier


class PhaseReport:
    def __init__(self, lifecycle: Lifecycle, in_flight: InFlight,
                 metrics: Metrics, sd: Notifier, log: Log) -> None:
        self.lifecycle = lifecycle
        self.in_flight = in_flight
        self.metrics = metrics
        self.sd = sd
        self.log = log

    def __call__(self, old: Phase, new: Phase, event: Event) -> None:
        self.metrics.set_state(new.wire.name.lower())
        n = len(self.in_flight)
        if new is Phase.READY and old is Phase.WARMING:
            self.sd.notify("READY=1", "STATUS=ready")
        elif new is Phase.READY:
            self.log("undrained by the operator: accepting new requests")
        elif new is Phase.DRAINING:
            self.log(f"draining by the operator: {n} requests in flight")
        elif new is Phase.STOPPING and old is not Phase.LINGERING:
            self.log(f"draining: {n} requests in flight")
            self.sd.notify("STOPPING=1", f"STATUS=draining: {n} in flight")
        elif new is Phase.LINGERING and self.lifecycle.linger_s > 0:
            self.log(f"drained; answering RESEND for {self.lifecycle.linger_s:g} s")
