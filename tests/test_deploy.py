"""Deployment artefacts stay true to the code: the settings table in docs/OPERATIONS.md and the
example TOML against daemon/config.py, the metrics table against daemon/ops/metrics.py, the
systemd unit against the drain timeout, and the ops scripts against bash (and shellcheck,
where installed).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from zerolayer.daemon import config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import settings_table  # noqa: E402

OPS = (ROOT / "docs" / "OPERATIONS.md").read_text()
TOML = ROOT / "deploy" / "zerolayerd.toml"
UNIT = ROOT / "deploy" / "zerolayerd.service"
DROPIN = ROOT / "deploy" / "zerolayerd.service.d" / "isolated-cores.conf"
SCRIPTS = sorted((ROOT / "scripts").glob("*.sh"))


def settings() -> set[str]:
    return {f"{s.name}.{f.name}" for s in config.sections()  # [[engines]] is a list, not a section
            for f in fields(s.default_factory)}


def unit_values(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def test_settings_table_matches_config() -> None:
    assert settings_table.block() in OPS, (
        "docs/OPERATIONS.md settings table is stale: run "
        ".venv/bin/python scripts/settings_table.py --write")
    assert set(settings_table.NOTES) <= settings(), "NOTES for a setting that no longer exists"
    assert all(r[-1] for r in settings_table.rows()), "a setting without a description"


def test_example_toml_has_every_setting_at_its_default() -> None:
    data = tomllib.loads(TOML.read_text())
    assert {f"{sec}.{k}" for sec, table in data.items() for k in table} == settings()
    loaded = config.load(type("Args", (), {"config": str(TOML)})(), environ={})
    assert loaded == config.DaemonConfig()


def test_metrics_table_lists_every_metric() -> None:
    from zerolayer.daemon.ops.collector_pauses import CollectorPauses
    from zerolayer.daemon.ops.metrics import Metrics
    names = set()
    for fam in [*Metrics().registry.collect(), *CollectorPauses().collect()]:
        names.add(fam.name + "_total" if fam.type == "counter" else fam.name)
    missing = sorted(n for n in names if f"`{n}`" not in OPS)
    assert not missing, f"metrics not documented in docs/OPERATIONS.md: {missing}"


def test_unit_drains_within_its_stop_timeout() -> None:
    u = unit_values(UNIT)
    assert u["Type"] == ["notify"]
    assert u["ExecStart"][0].startswith("@VENV@/bin/zerolayerd --config /etc/zerolayer/zerolayerd.toml")
    assert "-HUP" in u["ExecReload"][0]
    assert u["KillSignal"] == ["SIGTERM"]
    assert float(u["TimeoutStopSec"][0]) > config.LifecycleSection.drain_timeout_s
    assert u["LimitMEMLOCK"] == ["infinity"]
    assert u["Restart"] == ["on-failure"]
    d = unit_values(DROPIN)
    assert d["CPUAffinity"] == d["AllowedCPUs"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "zerolayerd"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    unit = tmp_path / "zerolayerd.service"
    unit.write_text(UNIT.read_text().replace("@VENV@", str(venv)))
    (tmp_path / "zerolayerd.service.d").mkdir()
    shutil.copy(DROPIN, tmp_path / "zerolayerd.service.d")
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                       env={"SYSTEMD_UNIT_PATH": f"{tmp_path}:", "PATH": "/usr/bin:/bin"})
    problems = [ln for ln in (p.stdout + p.stderr).splitlines() if "zerolayerd" in ln]
    assert p.returncode == 0 and not problems, p.stdout + p.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_strict_and_parse(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_scripts_are_shellcheck_clean() -> None:
    p = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_readme_gives_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"^bash scripts/\S+", readme, re.M)
    assert first is not None and first.group(0) == "bash scripts/demo.sh"
    assert re.search(r"^bash scripts/test\.sh", readme, re.M)
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
