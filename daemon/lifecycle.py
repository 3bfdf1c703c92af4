"""The daemon's life, one state machine: every phase it can be in, and every move between
them, in one table.

    STARTING ─LOAD─► WARMING ─WARMED─► READY ◄─UNDRAIN / DRAIN─► DRAINING
                                         │                           │
                                         └────────TERM───► STOPPING ◄┘
                                                            │  ▲
                                                       IDLE │  │ BUSY
                                                            ▼  │
                                                          LINGERING ─DEADLINE / TERM─► STOPPED
    STOPPING ─DEADLINE─► STOPPED;   any phase from WARMING on ─ENGINES_DIED─► STOPPED (exit 1)

Two draining phases, because they differ in what may follow: the operator's DRAINING
refuses new work and stays up, and `undrain` ends it; SIGTERM's STOPPING refuses new work
too, but only ends in STOPPED, once nothing is in flight (then LINGERING: RESEND and
keepalives still answered from the result cache for `drain_linger_s`) or at the drain
timeout. A second TERM while lingering stops at once; one while requests still stream does
nothing (they keep their drain timeout).

Sans-IO: the machine is handed the time and the number of requests in flight, and reads no
clock and touches no socket. What a phase means to the outside (ingress refusing new work,
/readyz, PONG, sd_notify, the state metric, the control socket's status) is read from it,
through `phase` and the listeners that `subscribe` registers; no other object keeps a copy
of it. A move the table does not hold raises LifecycleError and changes nothing, so an
impossible sequence of signals and commands is a loud bug rather than a quiet state.
"""
from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from zerolayer.protocol.wire import ServerState

EXIT_OK = 0
EXIT_ENGINE_DIED = 1      # systemd restarts the daemon: never half-alive


class Phase(Enum):
    STARTING = "starting"     # sockets opening, nothing served yet
    WARMING = "warming"       # /healthz answers; the model loads and compiles
    READY = "ready"
    DRAINING = "draining"     # the operator's drain: new work refused, stays up
    STOPPING = "stopping"     # SIGTERM: new work refused, exits once drained
    LINGERING = "lingering"   # stopping with nothing in flight: RESEND still answered
    STOPPED = "stopped"       # the loop ends; the process exits with `exit_code`

    @property
    def wire(self) -> ServerState:
        """What PONG, /readyz, the control socket and the state metric call it: the
        protocol knows three states; every way out of READY is DRAINING there."""
        return _WIRE.get(self, ServerState.DRAINING)

    @property
    def refuses_new(self) -> bool:
        """New INVOKEs get DRAINING (a retry of a request already known still attaches)."""
        return self not in (Phase.STARTING, Phase.WARMING, Phase.READY)

    @property
    def drain(self) -> str | None:
        """The control socket's `drain`: whose drain this is, if any."""
        return _DRAIN.get(self)


_WIRE = {Phase.STARTING: ServerState.WARMING, Phase.WARMING: ServerState.WARMING,
         Phase.READY: ServerState.READY}
_DRAIN = {Phase.DRAINING: "operator", Phase.STOPPING: "stopping",
          Phase.LINGERING: "stopping", Phase.STOPPED: "stopping"}


class Event(Enum):
    LOAD = "load"                  # the engines start loading the model
    WARMED = "warmed"              # every engine is loaded and warm
    DRAIN = "drain"                # `zerolayer ctl drain`
    UNDRAIN = "undrain"            # `zerolayer ctl undrain`
    TERM = "term"                  # SIGTERM / SIGINT
    IDLE = "idle"                  # nothing in flight any more (while stopping)
    BUSY = "busy"                  # in flight again (while lingering)
    DEADLINE = "deadline"          # the drain timeout, or the linger's end
    ENGINES_DIED = "engines_died"  # the last engine is gone


P, E = Phase, Event
# (phase, event) -> the next phase. A pair not here is an error. Rows that keep the phase
# are the commands and signals that repeat harmlessly (a second drain, a second TERM).
TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (P.STARTING, E.LOAD): P.WARMING,
    (P.WARMING, E.WARMED): P.READY,
    (P.READY, E.DRAIN): P.DRAINING,
    (P.DRAINING, E.DRAIN): P.DRAINING,
    (P.STOPPING, E.DRAIN): P.STOPPING,
    (P.LINGERING, E.DRAIN): P.LINGERING,
    (P.DRAINING, E.UNDRAIN): P.READY,
    (P.READY, E.UNDRAIN): P.READY,
    (P.READY, E.TERM): P.STOPPING,
    (P.DRAINING, E.TERM): P.STOPPING,
    (P.STOPPING, E.TERM): P.STOPPING,
    (P.LINGERING, E.TERM): P.STOPPED,
    (P.STOPPING, E.IDLE): P.LINGERING,
    (P.LINGERING, E.BUSY): P.STOPPING,
    (P.STOPPING, E.DEADLINE): P.STOPPED,
    (P.LINGERING, E.DEADLINE): P.STOPPED,
    **{(p, E.ENGINES_DIED): P.STOPPED
       for p in (P.WARMING, P.READY, P.DRAINING, P.STOPPING, P.LINGERING)},
}
del P, E

Listener = Callable[[Phase, Phase, Event], None]


class LifecycleError(Exception):
    """A move the table does not hold (undrain while stopping, a signal before start)."""


class Lifecycle:
    def __init__(self, drain_timeout_s: float, linger_s: float) -> None:
        self.drain_timeout_s = drain_timeout_s
        self.linger_s = linger_s
        self.phase = Phase.STARTING
        self.exit_code = EXIT_OK
        self.stop_at: float | None = None     # STOPPING / LINGERING: the drain timeout
        self.idle_since: float | None = None  # LINGERING: since when nothing is in flight
        self._listeners: list[Listener] = []

    def subscribe(self, fn: Listener) -> None:
        """fn(old, new, event) after every move that changes the phase."""
        self._listeners.append(fn)

    def handle(self, event: Event, now: float) -> Phase:
        """The one place the phase changes. Returns the new phase."""
        old = self.phase
        new = TRANSITIONS.get((old, event))
        if new is None:
            raise LifecycleError(f"{event.value} while {old.value}")
        if new is old:
            return new
        if new is Phase.STOPPING and old is not Phase.LINGERING:
            self.stop_at = now + self.drain_timeout_s
        self.idle_since = now if new is Phase.LINGERING else None
        if event is Event.ENGINES_DIED:
            self.exit_code = EXIT_ENGINE_DIED
        self.phase = new
        for fn in self._listeners:
            fn(old, new, event)
        return new

    def tick(self, now: float, in_flight: int) -> Phase:
        """The moves that time and the work in flight make, while stopping: called by the
        loop every turn (cheap: two comparisons outside STOPPING and LINGERING)."""
        p = self.phase
        if p is not Phase.STOPPING and p is not Phase.LINGERING:
            return p
        assert self.stop_at is not None
        if now >= self.stop_at:
            return self.handle(Event.DEADLINE, now)
        if p is Phase.STOPPING and not in_flight:
            p = self.handle(Event.IDLE, now)
        elif p is Phase.LINGERING and in_flight:
            return self.handle(Event.BUSY, now)
        if p is Phase.LINGERING:
            assert self.idle_since is not None
            if now >= self.idle_since + self.linger_s:
                return self.handle(Event.DEADLINE, now)
        return p
