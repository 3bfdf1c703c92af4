"""A real Prometheus server (Debian's `prometheus`) for tests: short scrape and evaluation
intervals, one scrape job, the shipped alert rules with their durations scaled down, and its
HTTP API read from inside the network namespace it runs in."""
from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from netns import in_netns

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "zerolayer-alerts.yml"
PORT = 9090

# How the shipped rules are scaled for a test that must finish in minutes: every `for:` and
# every range window shrinks, the thresholds stay as shipped.
FOR_S = 3
WINDOW_S = 10          # rate()/changes() windows of 1 to 5 minutes
LONG_WINDOW_S = 90     # the restart rule's hour: long enough to hold three starts


def fast_rules(text: str) -> str:
    """The rules with `for: Nm` -> FOR_S seconds, [1m]..[5m] -> WINDOW_S, [1h] -> LONG_WINDOW_S."""
    text = re.sub(r"for: \d+[mh]", f"for: {FOR_S}s", text)
    text = re.sub(r"\[[1-5]m\]", f"[{WINDOW_S}s]", text)
    return text.replace("[1h]", f"[{LONG_WINDOW_S}s]")


class Prometheus:
    """`prometheus` in network namespace `netns`, scraping `target` every second as job
    zerolayerd and evaluating fast_rules() of the shipped rules every second."""

    def __init__(self, tmp: Path, netns: str, target: str):
        self.netns = netns
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "rules.yml").write_text(fast_rules(RULES.read_text()))
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "rule_files: [rules.yml]\n"
            "scrape_configs:\n"
            "  - job_name: zerolayerd\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n")
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, "prometheus",
             f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{PORT}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_for(lambda: self._get("/-/ready") is not None, 60, "prometheus ready")

    def _get(self, path: str) -> bytes | None:
        def fetch() -> bytes | None:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=5).read()
            except OSError:
                return None
        return in_netns(self.netns, fetch)

    def api(self, path: str, **params: str) -> dict:
        q = ("?" + urllib.parse.urlencode(params)) if params else ""
        body = self._get(f"/api/v1/{path}{q}")
        assert body is not None, f"prometheus /api/v1/{path} did not answer"
        doc = json.loads(body)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def alert_states(self, labelled: str | None = None) -> dict[str, str]:
        """alertname -> "pending" or "firing" for every active alert (a resolved one is gone);
        only the alerts that carry the label `labelled`, where one is named."""
        return {a["labels"]["alertname"]: a["state"] for a in self.api("alerts")["alerts"]
                if labelled is None or labelled in a["labels"]}

    def wait_for(self, cond, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode} waiting for {what}")
            if cond():
                return
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}; alerts now {self.alert_states()}")

    def wait_firing(self, name: str, timeout: float = 60) -> None:
        self.wait_for(lambda: self.alert_states().get(name) == "firing", timeout,
                      f"{name} firing")

    def wait_resolved(self, name: str, timeout: float = 60) -> None:
        self.wait_for(lambda: name not in self.alert_states(), timeout, f"{name} resolved")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
