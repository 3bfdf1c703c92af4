"""The daemon's lifecycle machine (daemon/lifecycle.py) on its own: a fake clock, no daemon."""
from __future__ import annotations

import pytest

from zerolayer.daemon.lifecycle import EXIT_ENGINE_DIED, TRANSITIONS, Event, Lifecycle, LifecycleError, Phase
from zerolayer.protocol.wire import ServerState


def ready(timeout: float = 30.0, linger: float = 2.0) -> tuple[Lifecycle, list]:
    lc = Lifecycle(drain_timeout_s=timeout, linger_s=linger)
    seen: list = []
    lc.subscribe(lambda old, new, ev: seen.append((old, new, ev)))
    lc.handle(Event.LOAD, 0.0)
    lc.handle(Event.WARMED, 1.0)
    return lc, seen


def test_start_to_ready_tells_every_listener_once_per_change() -> None:
    lc, seen = ready()
    assert lc.phase is Phase.READY and lc.phase.wire is ServerState.READY
    assert seen == [(Phase.STARTING, Phase.WARMING, Event.LOAD),
                    (Phase.WARMING, Phase.READY, Event.WARMED)]
    assert Phase.WARMING.wire is ServerState.WARMING and not Phase.READY.refuses_new


def test_operator_drain_and_undrain_round_trip_and_repeat_harmlessly() -> None:
    lc, seen = ready()
    assert lc.handle(Event.DRAIN, 2.0) is Phase.DRAINING
    assert lc.handle(Event.DRAIN, 2.5) is Phase.DRAINING   # no second notice
    assert lc.phase.refuses_new and lc.phase.drain == "operator"
    assert lc.phase.wire is ServerState.DRAINING
    assert lc.handle(Event.UNDRAIN, 3.0) is Phase.READY
    assert [new for _, new, _ in seen[2:]] == [Phase.DRAINING, Phase.READY]
    assert lc.tick(100.0, 0) is Phase.READY     # time alone never moves an undrained daemon


def test_term_drains_then_lingers_then_stops() -> None:
    lc, _ = ready(timeout=30.0, linger=2.0)
    lc.handle(Event.TERM, 10.0)
    assert lc.phase is Phase.STOPPING and lc.stop_at == 40.0 and lc.phase.drain == "stopping"
    assert lc.tick(11.0, in_flight=3) is Phase.STOPPING
    assert lc.tick(12.0, in_flight=0) is Phase.LINGERING and lc.idle_since == 12.0
    assert lc.tick(13.9, in_flight=0) is Phase.LINGERING
    assert lc.tick(14.0, in_flight=0) is Phase.STOPPED
    assert lc.exit_code == 0


def test_a_request_in_flight_again_ends_the_linger() -> None:
    lc, _ = ready(linger=2.0)
    lc.handle(Event.TERM, 0.0)
    lc.tick(1.0, 0)
    assert lc.tick(1.5, 1) is Phase.STOPPING and lc.idle_since is None
    assert lc.tick(2.0, 0) is Phase.LINGERING and lc.idle_since == 2.0


def test_no_linger_stops_as_soon_as_nothing_is_in_flight() -> None:
    lc, _ = ready(linger=0.0)
    lc.handle(Event.TERM, 0.0)
    assert lc.tick(0.1, 0) is Phase.STOPPED


def test_the_drain_timeout_stops_with_requests_still_in_flight() -> None:
    lc, _ = ready(timeout=5.0)
    lc.handle(Event.DRAIN, 0.0)
    lc.handle(Event.TERM, 1.0)                  # an operator drain, then SIGTERM
    assert lc.tick(5.9, 2) is Phase.STOPPING
    assert lc.tick(6.0, 2) is Phase.STOPPED


def test_a_second_term_stops_a_lingering_daemon_but_not_a_streaming_one() -> None:
    lc, _ = ready(timeout=30.0)
    lc.handle(Event.TERM, 0.0)
    assert lc.handle(Event.TERM, 1.0) is Phase.STOPPING and lc.stop_at == 30.0
    lc.tick(2.0, 0)
    assert lc.handle(Event.TERM, 2.5) is Phase.STOPPED


def test_undrain_while_stopping_is_refused_and_changes_nothing() -> None:
    lc, _ = ready()
    lc.handle(Event.TERM, 0.0)
    with pytest.raises(LifecycleError):
        lc.handle(Event.UNDRAIN, 1.0)
    assert lc.phase is Phase.STOPPING
    assert lc.handle(Event.DRAIN, 1.0) is Phase.STOPPING   # still answered, still stopping


def test_the_last_engine_dying_stops_with_exit_1_from_any_serving_phase() -> None:
    for before in (Event.WARMED, Event.DRAIN, Event.TERM):
        lc = Lifecycle(30.0, 2.0)
        lc.handle(Event.LOAD, 0.0)
        if before is not Event.WARMED:
            lc.handle(Event.WARMED, 0.0)
        lc.handle(before, 0.0)
        assert lc.handle(Event.ENGINES_DIED, 1.0) is Phase.STOPPED
        assert lc.exit_code == EXIT_ENGINE_DIED


def test_the_table_reaches_every_phase_and_stopped_is_final() -> None:
    targets = {new for new in TRANSITIONS.values()} | {Phase.STARTING}
    assert targets == set(Phase)
    assert not [k for k in TRANSITIONS if k[0] is Phase.STOPPED]
    lc = Lifecycle(1.0, 1.0)
    with pytest.raises(LifecycleError):
        lc.handle(Event.TERM, 0.0)              # no signal handler before start
