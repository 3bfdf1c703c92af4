"""[cpu] switch_interval_us: checked like every setting, and applied to the interpreter at
start (daemon/startup.py apply_switch_interval), before the engine thread exists."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from zerolayer.daemon import config, startup


def _load(env: dict) -> config.DaemonConfig:
    return config.load(SimpleNamespace(config=None), environ=env)


@pytest.fixture
def restore_switch_interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_default_is_cpythons_own():
    assert _load({}).cpu.switch_interval_us == 5000


@pytest.mark.parametrize("value", ["0", "-500", "10", "1000000", "fast"])
def test_a_bad_interval_is_refused_naming_the_setting(value):
    with pytest.raises(config.ConfigError) as ei:
        _load({"ZEROLAYER_CPU_SWITCH_INTERVAL_US": value})
    [problem] = ei.value.problems
    assert problem.startswith("cpu.switch_interval_us (")


def test_the_interval_is_applied_and_logged(restore_switch_interval):
    cfg = _load({"ZEROLAYER_CPU_SWITCH_INTERVAL_US": "750"})
    said: list[str] = []
    now = startup.apply_switch_interval(cfg, lambda msg, *a: said.append(msg))
    assert sys.getswitchinterval() == pytest.approx(750e-6) == now
    assert said == ["GIL switch interval 750 µs"]


def test_a_daemon_runs_with_the_interval_it_was_given(tmp_path):
    """End to end: the flag reaches the daemon's own interpreter, which says so at start."""
    from daemon_proc import DaemonProc
    d = DaemonProc(tmp_path, "--cpu-switch-interval-us", "750")
    try:
        assert any("GIL switch interval 750 µs" in line for line in d.log), "".join(d.log)
    finally:
        d.stop()
