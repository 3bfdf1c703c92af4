"""The SDK's recovery rules on a fake clock: the request machine and the ping rule, driven
through a simulated network to test_client.py's fake daemon (the real Ingress and
ResultCache, without the socket), with time jumping straight to the next timer.

The machine is sans-IO and is handed its time, so a 30 s restart or a 45 s recovery window
takes milliseconds here, and the gaps between attempts are the machine's own, exact, with
no scheduling slack. The drivers that feed it real time and real sockets (the sync and the
asyncio client) are checked against the same daemon over UDP, with short timers, in
tests/test_client.py.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from test_client import KEY_ID, SECRET, Script, ScriptedDaemon
from zerolayer.client import InvokeResult
from zerolayer.client.invoke_body import build_invoke_body
from zerolayer.client.ping_rule import PingAttempts
from zerolayer.client.request_machine import Phase, RequestMachine
from zerolayer.client.retry_policy import RetryPolicy
from zerolayer.protocol import errors
from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.wire import Mac, MsgType

EPOCH = 1_800_000_000.0     # the wall clock at fake time 0
CLIENT = ("127.0.0.1", 40000)


@dataclass
class FakeClock:
    now: float = 0.0

    def wall(self) -> float:
        return EPOCH + self.now

    def wall_us(self) -> int:
        return int(self.wall() * 1e6)


class SimDaemon(ScriptedDaemon):
    """The fake daemon on the fake clock: what it sends waits in `outbox`, delivered to the
    client at the same instant (a network without latency or loss)."""

    def __init__(self, script: Script, clock: FakeClock) -> None:
        super().__init__(script, clock=lambda: clock.now, wall=clock.wall)
        self.outbox: list[bytes] = []

    def send(self, dg: bytes, addr: tuple) -> None:
        self.outbox.append(dg)

    def exchange(self, datagrams: list[bytes]) -> list[bytes]:
        for dg in datagrams:
            self.handle(dg, CLIENT)
        out, self.outbox = self.outbox, []
        return out


@dataclass
class Run:
    """One invoke() on the fake clock, and what happened at the scripted times."""
    clock: FakeClock
    daemon: SimDaemon
    events: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    chunks: list[str] = field(default_factory=list)

    def invoke(self, policy: RetryPolicy) -> InvokeResult:
        body = build_invoke_body("x", None, None, max_tokens=8, temperature=0.0, top_k=0,
                                 top_p=1.0, seed=None, stop=())
        rng = random.Random(7)
        m = RequestMachine(policy, body, rng.randbytes(16), self.clock.now, rng=rng,
                           wall_us=self.clock.wall_us)
        m.restartable = True                     # as invoke() does: no text shown until DONE
        out = m.start(self.clock.now)
        events = sorted(self.events, key=lambda e: e[0])
        for _ in range(100_000):
            replies = self.daemon.exchange(out)
            out = []
            for dg in replies:
                out += m.receive(dg, self.clock.now)
            while (chunk := m.pop_ready(self.clock.now)) is not None:
                self.chunks.append(chunk)
            if m.result is not None:
                assert m.phase is Phase.DONE
                return m.result
            if out:
                continue
            # Nothing in flight: time jumps to the machine's timer or the next scripted event.
            timer = m.get_timer()
            if events and events[0][0] <= timer:
                at, what = events.pop(0)
                self.clock.now = max(self.clock.now, at)
                what()
                continue
            self.clock.now = max(self.clock.now, timer)
            out = m.handle_timer(self.clock.now)
        raise AssertionError("the machine never finished")


def _policy(**kw: object) -> RetryPolicy:
    return RetryPolicy(KEY_ID, Mac(SECRET), **kw)  # type: ignore[arg-type]


def test_the_default_recovery_window_survives_a_30_s_restart() -> None:
    """The daemon dies after the request was accepted and its first text streamed, and
    serves again 30 s later with nothing remembered. A client on the default timers keeps
    re-sending, never more than 2 s apart, the restarted daemon runs the request afresh, and
    invoke() (which showed no text yet) returns the new run's whole answer."""
    clock = FakeClock()
    d = SimDaemon(Script(chunks=["Par"], hold_done=True), clock)
    died = 0.5
    run = Run(clock, d, events=[(died, d.down.set),
                                (died + 30.0, lambda: d.restart(Script()))])
    res = run.invoke(_policy())                 # every timer at its default
    assert res.text == "Paris." and res.finish_reason == "stop" and res.restarts == 1
    assert d.runs == 2                          # once before the crash, once after
    assert 30.5 < clock.now <= 32.5             # answered by the first attempt after it
    during = [t for t in d.invoke_times if t > died]
    assert len(during) >= 10                    # it kept trying all along...
    gaps = [b - a for a, b in zip([died] + during, during)]
    assert max(gaps) <= 2.0                     # ...at most 2 s apart, exactly


def test_the_default_window_gives_up_45_s_after_the_last_answer() -> None:
    clock = FakeClock()
    d = SimDaemon(Script(chunks=["Par"], hold_done=True), clock)
    run = Run(clock, d, events=[(0.5, d.down.set)])
    with pytest.raises(errors.ZerolayerTimeoutError, match="45.0 s without an answer"):
        run.invoke(_policy())
    assert clock.now == pytest.approx(0.25 + 45.0)   # from the last keepalive answered
    during = [t for t in d.invoke_times if t > 0.5]
    gaps = [b - a for a, b in zip([0.5] + during, during)]
    assert max(gaps) <= 2.0 and len(during) >= 20


def test_a_draining_refusal_then_silence_raises_draining_at_the_window_end() -> None:
    clock = FakeClock()
    d = SimDaemon(Script(error_code=ErrorCode.DRAINING, error_times=1,
                         silent_after_errors=True), clock)
    with pytest.raises(errors.DrainingError):
        Run(clock, d).invoke(_policy())
    assert clock.now == pytest.approx(45.0)     # the refusal was the last authentic answer
    assert len(d.invokes) >= 20                 # retried all the while


def test_total_timeout_caps_a_call_that_is_answered_all_along() -> None:
    clock = FakeClock()
    d = SimDaemon(Script(chunks=["a"], hold_done=True), clock)
    with pytest.raises(errors.ZerolayerTimeoutError, match="total_timeout"):
        Run(clock, d).invoke(_policy(total_timeout=120.0))
    assert clock.now == pytest.approx(120.0)
    keepalives = [c for c in d.controls if c.msg_type is MsgType.RESEND]
    assert len(keepalives) >= 120 / 0.25 - 1   # probed every probe_interval_s


def test_the_ping_rule_tries_at_the_ack_waits_until_the_window_ends() -> None:
    clock = FakeClock()
    d = SimDaemon(Script(), clock)
    d.down.set()
    att = PingAttempts(_policy(), clock.now, rng=random.Random(3), wall_us=clock.wall_us)
    sent: list[float] = []
    while (nxt := att.next(clock.now)) is not None:
        dg, until = nxt
        sent.append(clock.now)
        assert d.exchange([dg]) == []
        clock.now = until
    assert isinstance(att.give_up(), errors.ZerolayerTimeoutError)
    assert sent[:5] == pytest.approx([0.0, 0.2, 0.6, 1.4, 3.0])   # 0.2 s, doubling, ≤ 2 s
    assert max(b - a for a, b in zip(sent, sent[1:])) == pytest.approx(2.0)
    assert sent[-1] < 45.0 <= clock.now
    d.down.clear()
    att = PingAttempts(_policy(), clock.now, rng=random.Random(3), wall_us=clock.wall_us)
    nxt = att.next(clock.now)
    assert nxt is not None
    (pong,) = d.exchange([nxt[0]])
    clock.now += 0.003
    assert att.receive(pong, clock.now) == pytest.approx(0.003)
