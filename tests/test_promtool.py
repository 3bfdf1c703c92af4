"""The monitoring that ships in deploy/: a live daemon's /metrics through `promtool check
metrics`, the alert rules through `promtool check rules` and their unit tests
(`promtool test rules`), and the Grafana dashboard's and the rules' queries against the
metrics the daemon exports. promtool comes from Debian's `prometheus` package
(scripts/bootstrap.sh installs it)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from daemon_proc import DaemonProc

ROOT = Path(__file__).resolve().parent.parent
PROM = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "zerolayerd-dashboard.json"

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool not installed (Debian: prometheus)")


def _exported() -> set[str]:
    from zerolayer.daemon.ops.metrics import Metrics
    names = set()
    for fam in Metrics().registry.collect():
        base = fam.name + ("_total" if fam.type == "counter" else "")
        names.add(base)
        if fam.type == "histogram":
            names.update({fam.name + "_bucket", fam.name + "_count", fam.name + "_sum"})
    return names


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:zerolayer|process)_[a-z_]+)", expr))


@needs_promtool
def test_live_metrics_pass_promtool(tmp_path):
    d = DaemonProc(tmp_path)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics",
                                      timeout=10).read()
    finally:
        assert d.stop() == 0
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       timeout=60)
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr


@needs_promtool
def test_alert_rules_check_and_their_unit_tests_pass():
    r = subprocess.run(["promtool", "check", "rules", str(PROM / "zerolayer-alerts.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(["promtool", "test", "rules", "zerolayer-alerts-test.yml"],
                       capture_output=True, text=True, timeout=60, cwd=PROM)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_rules_and_dashboard_query_only_exported_metrics():
    exported = _exported()
    rules = (PROM / "zerolayer-alerts.yml").read_text()
    exprs = re.findall(r"expr: (.+(?:\n {10,}\S.*)*)", rules)
    dash = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = set().union(*map(_metric_names, exprs))
    assert used and not used - exported, sorted(used - exported)
    names = set(re.findall(r"alert: (\w+)", rules))
    assert {"ZerolayerNotReady", "ZerolayerOverloaded", "ZerolayerTTFTHigh",
            "ZerolayerXdpDrops", "ZerolayerRestarted", "ZerolayerKvCacheFull",
            "ZerolayerEngineStalled", "ZerolayerAuthFailures"} <= names
