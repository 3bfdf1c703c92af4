"""[cpu] io_runtime_us: SCHED_DEADLINE for the I/O thread (daemon/sched_deadline.py), checked
like every setting, refused beside settings it cannot work with, and applied by the daemon to
its I/O thread alone."""
from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest

from zerolayer.daemon import config, sched_deadline

ROOT = os.geteuid() == 0   # CAP_SYS_NICE: CI runs as root


def _load(env: dict) -> config.DaemonConfig:
    return config.load(SimpleNamespace(config=None), environ=env)


def test_off_by_default():
    assert _load({}).cpu.io_runtime_us == 0


@pytest.mark.parametrize("value", ["-1", "901", "half"])
def test_a_bad_runtime_is_refused_naming_the_setting(value):
    with pytest.raises(config.ConfigError) as ei:
        _load({"ZEROLAYER_CPU_IO_RUNTIME_US": value})
    [problem] = ei.value.problems
    assert problem.startswith("cpu.io_runtime_us (")


@pytest.mark.parametrize("other,why", [
    ({"ZEROLAYER_CPU_SCHED_FIFO": "10"}, "one scheduling policy"),
    ({"ZEROLAYER_NETWORK_BUSY_POLL": "true"}, "spinning"),
])
def test_refused_beside_a_setting_it_cannot_work_with(other, why):
    with pytest.raises(config.ConfigError) as ei:
        _load({"ZEROLAYER_CPU_IO_RUNTIME_US": "300", **other})
    [problem] = ei.value.problems
    assert problem.startswith("cpu.io_runtime_us and") or problem.startswith(
        "cpu.io_runtime_us with"), problem
    assert why in problem


@pytest.mark.skipif(not ROOT, reason="SCHED_DEADLINE needs CAP_SYS_NICE")
def test_a_thread_gets_the_budget_it_asks_for_and_no_other_thread_does():
    seen: list = []

    def worker():
        sched_deadline.set_deadline(300, 1000)
        seen.append(sched_deadline.policy_of())
        # a thread it starts runs with normal scheduling (SCHED_FLAG_RESET_ON_FORK)
        child = threading.Thread(target=lambda: seen.append(sched_deadline.policy_of()))
        child.start()
        child.join()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen[0] == (sched_deadline.SCHED_DEADLINE, 300_000, 1_000_000), seen
    assert seen[1][0] == os.SCHED_OTHER, seen
    assert sched_deadline.policy_of()[0] == os.SCHED_OTHER   # this thread never asked


@pytest.mark.skipif(not ROOT, reason="SCHED_DEADLINE needs CAP_SYS_NICE")
def test_the_daemons_io_thread_runs_under_it_and_answers(tmp_path):
    """End to end: the flag reaches the daemon, whose I/O (main) thread runs under
    SCHED_DEADLINE while every other (the engine's, its kernel threads, control, metrics)
    keeps normal scheduling, and it serves."""
    from daemon_proc import DaemonProc
    from zerolayer.client import Client
    d = DaemonProc(tmp_path, "--cpu-io-runtime-us", "300")
    try:
        assert any("SCHED_DEADLINE 300 µs every 1000 µs (I/O thread)" in line
                   for line in d.log), "".join(d.log)
        pid = d.proc.pid
        assert sched_deadline.policy_of(pid) == (sched_deadline.SCHED_DEADLINE, 300_000,
                                                 1_000_000)
        others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        assert others and all(sched_deadline.policy_of(t)[0] == os.SCHED_OTHER for t in others)
        with Client(d.addr, d.key_id, d.secret, timeout=10) as c:
            assert c.ping() > 0
    finally:
        assert d.stop() == 0
