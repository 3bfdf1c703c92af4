"""deploy/'s alert rules and Grafana dashboard under a real Prometheus server scraping a live
zerolayerd, read back through Prometheus's own HTTP API (/api/v1/alerts, /api/v1/query).

Prometheus (Debian's `prometheus`) and every daemon run in the server namespace of an XDP
testbed (tests/netns.py), so that one scrape target, 127.0.0.1:9433 there, is the UDP-path
daemons and the XDP-path daemon in turn. The rules are the shipped file with every `for:`
cut to 3 s and every range window to 10 s (the restart rule's hour to 90 s): prom_server.py's
fast_rules(). Thresholds are as shipped. Each alert is driven into its condition by the
daemon's own behaviour, held still by the engine test hooks (daemon/test_hooks.py) instead of
by timing, and must fire, then resolve once the condition ends:

  ZerolayerNotReady       no daemon yet (absent), then one held in WARMING; resolves at READY
  ZerolayerRestarted      three starts of the daemon inside the restart window; resolves
                          once the window has passed the last start
  ZerolayerKvCacheFull    a one-block KV arena held by a request whose engine is held
  ZerolayerEngineStalled  that held engine: requests in it, no token out
  ZerolayerOverloaded     clients retrying OVERLOADED against a full wait queue
  ZerolayerAuthFailures   pings signed with a wrong secret
  ZerolayerTTFTHigh       the requests queued behind the held engine get their first token late
  ZerolayerXdpDrops       datagrams with a bad magic, dropped by the XDP program

Then every panel query of the dashboard returns data from the same Prometheus.

Root (namespaces, XDP) and minutes: runs with ZEROLAYER_OPS_CHECK=1, which .ci/run sets.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from daemon_proc import DaemonProc, Hooks
from netns import SRV_IF, SRV_V4, in_netns, xdp_testbed
from prom_server import Prometheus
from zerolayer.client import Client

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "zerolayerd-dashboard.json"
COUNT = "Count from one to one thousand: one, two, three,"

pytestmark = [
    pytest.mark.skipif(os.environ.get("ZEROLAYER_OPS_CHECK") != "1",
                       reason="a real Prometheus against live daemons (root, minutes): "
                              "set ZEROLAYER_OPS_CHECK=1"),
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="prometheus not installed (Debian: prometheus)"),
]

# What each alert was seen to do, for the summary printed at the end (docs/OPERATIONS.md).
SEEN: list[str] = []


@pytest.fixture(scope="module")
def bed():
    if os.geteuid() != 0:
        pytest.fail("ZEROLAYER_OPS_CHECK=1 needs root (network namespaces, XDP)")
    with xdp_testbed() as names:
        yield names


@pytest.fixture(scope="module")
def prom(bed, tmp_path_factory):
    p = Prometheus(tmp_path_factory.mktemp("prom"), bed[0], "127.0.0.1:9433")
    yield p
    p.stop()
    print("\n" + "\n".join(SEEN))


def _fires_and_resolves(prom: Prometheus, name: str, start: float, until) -> None:
    """`name` fires; then `until()` ends its condition and it resolves."""
    prom.wait_firing(name, timeout=90)
    fired = time.monotonic()
    until()
    prom.wait_resolved(name, timeout=90)
    SEEN.append(f"{name}: firing {fired - start:.0f} s after its condition began, "
                f"resolved {time.monotonic() - fired:.0f} s after firing")


def _stop(d: DaemonProc) -> None:
    assert d.stop() == 0, "".join(d.log[-20:])


def _in_ns_loop(ns: str, body, stop: threading.Event) -> threading.Thread:
    """Run body() over and over inside namespace `ns` until `stop` is set."""
    def loop() -> None:
        while not stop.is_set():
            body()
    t = threading.Thread(target=lambda: in_netns(ns, loop), daemon=True)
    t.start()
    return t


def test_not_ready_while_absent_and_while_warming_then_restarts(prom, bed, tmp_path):
    srv = bed[0]
    t0 = time.monotonic()
    # nothing to scrape: absent(zerolayer_server_state)
    prom.wait_firing("ZerolayerNotReady", timeout=90)
    hooks = Hooks(tmp_path / "hooks")
    (hooks.dir / "hold-load").touch()
    d = DaemonProc(tmp_path, netns=srv, env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)},
                   wait_ready=False)
    try:
        d.wait_for(lambda: (hooks.dir / "load-held").exists(), timeout=120, what="load held")
        # scraped while WARMING: the series is there, and says warming
        prom.wait_for(lambda: prom.query('zerolayer_server_state{state="warming"} == 1'),
                      60, "warming scraped")
        # absent() fired for a series with no labels; the warming daemon's alert is a new
        # series ({instance=...}), so it is pending for its own `for:` before it fires
        prom.wait_for(lambda: prom.alert_states(labelled="instance").get("ZerolayerNotReady")
                      == "firing", 90, "ZerolayerNotReady firing for the warming daemon")

        def ready() -> None:
            (hooks.dir / "hold-load").unlink()
            d.wait_ready()
        _fires_and_resolves(prom, "ZerolayerNotReady", t0, ready)
    finally:
        if (hooks.dir / "hold-load").exists():
            d.stop()  # still loading: SIGTERM's default action by design, no drain to check
        else:
            _stop(d)
    # two more starts on the same target: three process start times inside the window
    _stop(DaemonProc(tmp_path, netns=srv))
    t1 = time.monotonic()
    d = DaemonProc(tmp_path, netns=srv)
    try:
        prom.wait_firing("ZerolayerRestarted", timeout=90)
        fired = time.monotonic()
        prom.wait_resolved("ZerolayerRestarted", timeout=150)
        SEEN.append(f"ZerolayerRestarted: firing {fired - t1:.0f} s after the third start, "
                    f"resolved {time.monotonic() - fired:.0f} s later (the window passed)")
    finally:
        _stop(d)


def test_a_held_engine_fills_kv_stalls_overloads_and_delays_first_tokens(prom, bed, tmp_path):
    srv = bed[0]
    hooks = Hooks(tmp_path / "hooks")
    # one KV block (64 positions), one request running, one waiting, one in the hand-off
    d = DaemonProc(tmp_path, "--engine-max-running", "1", "--engine-max-waiting", "1",
                   "--engine-queue-depth", "1", "--engine-kv-blocks", "1", netns=srv,
                   env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        def client(secret: bytes | None = None, timeout: float = 120) -> Client:
            return Client(d.addr, d.key_id, secret or d.secret, timeout=timeout)

        # a request that holds the only KV block, and its engine held at its next step
        # (read on a thread of its own: a reader keeps the request's lease alive meanwhile)
        chunks: list[str] = []
        got_first = threading.Event()
        held_result: list = []

        def read() -> None:
            s = client().stream(COUNT, max_tokens=40)
            for chunk in s:
                chunks.append(chunk)
                got_first.set()
            held_result.append(s.result)
        reader = threading.Thread(target=lambda: in_netns(srv, read))
        reader.start()
        assert got_first.wait(120), "no first token"
        hooks.hold(d)
        t0 = time.monotonic()
        assert not held_result, "the request finished before the engine was held"
        prom.wait_for(lambda: prom.query("zerolayer_kv_cache_usage_ratio == 1"), 60,
                      "the KV arena full")
        prom.wait_firing("ZerolayerKvCacheFull")
        prom.wait_firing("ZerolayerEngineStalled")
        # clients queue behind it: one waits, the others are refused OVERLOADED and retry
        finished: list[str] = []

        def invoke() -> None:
            try:
                r = client(timeout=180).invoke(COUNT, max_tokens=4)
                finished.append(r.text)
            except Exception as e:  # noqa: BLE001 - counted: the test says how many were lost
                finished.append(f"error: {e!r}")
        callers = [threading.Thread(target=lambda: in_netns(srv, invoke)) for _ in range(4)]
        for t in callers:
            t.start()
        t_over = time.monotonic()
        prom.wait_firing("ZerolayerOverloaded")
        # and pings signed with a secret the daemon does not have
        bad = os.urandom(32)

        def bad_ping() -> None:
            try:
                client(bad, timeout=1).ping()
            except Exception:  # noqa: BLE001 - the refusal is the point
                pass
            time.sleep(0.1)
        threads.append(_in_ns_loop(srv, bad_ping, stop))
        t_auth = time.monotonic()
        prom.wait_firing("ZerolayerAuthFailures")
        stop.set()
        for t in threads:
            t.join(30)
        SEEN.append(f"ZerolayerAuthFailures: firing {time.monotonic() - t_auth:.0f} s after "
                    "bad pings began")
        prom.wait_resolved("ZerolayerAuthFailures", timeout=90)
        SEEN.append("ZerolayerAuthFailures: resolved once the bad pings stopped")

        # release: the held request finishes, the queued ones run (their TTFT spans the hold,
        # and stays in the rule's window for WINDOW_S only: watched first)
        hooks.release()
        t_release = time.monotonic()
        prom.wait_firing("ZerolayerTTFTHigh")
        SEEN.append(f"ZerolayerTTFTHigh: firing {time.monotonic() - t_release:.0f} s after "
                    "the release (the queued requests' first tokens)")
        reader.join(120)
        assert "".join(chunks) and held_result
        assert held_result[0].finish_reason in ("stop", "length")
        for t in callers:
            t.join(240)
        assert len(finished) == 4 and not [f for f in finished if f.startswith("error")], finished
        for name, since in (("ZerolayerKvCacheFull", t0), ("ZerolayerEngineStalled", t0),
                            ("ZerolayerOverloaded", t_over), ("ZerolayerTTFTHigh", t_release)):
            prom.wait_resolved(name, timeout=90)
            SEEN.append(f"{name}: resolved {time.monotonic() - t_release:.0f} s after the "
                        f"release ({since - t0:+.0f} s from the hold's start to its condition)")
    finally:
        stop.set()
        hooks.release()
        _stop(d)


def _garbage_sender(port: int):
    def send() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(50):
                s.sendto(b"XXXX" + bytes(60), (SRV_V4, port))
        time.sleep(0.05)   # ~1000 datagrams/s, ten times the rule's threshold
    return send


def test_xdp_drops_and_every_dashboard_query(prom, bed, tmp_path):
    srv, cli = bed
    d = DaemonProc(tmp_path, "--network-ingress", "xdp", "--network-interface", SRV_IF,
                   netns=srv, host="::")
    stop = threading.Event()
    try:
        d.wait_for(lambda: d.metric("zerolayer_xdp_attached") == 1, what="xdp attached")
        t0 = time.monotonic()
        sender = _in_ns_loop(cli, _garbage_sender(d.port), stop)

        def quiet() -> None:
            stop.set()
            sender.join(30)
        _fires_and_resolves(prom, "ZerolayerXdpDrops", t0, quiet)
        drops = prom.query('zerolayer_xdp_packets_total{action="drop",reason="drop_bad_magic"}')
        assert drops and float(drops[0]["value"][1]) > 100

        # a little traffic in the last minute, then every panel's query
        c = Client((SRV_V4, d.port), d.key_id, d.secret, timeout=120)
        for _ in range(3):
            assert in_netns(cli, lambda: c.invoke(COUNT, max_tokens=8)).text
        prom.wait_for(lambda: prom.query("sum(rate(zerolayer_generated_tokens_total[1m])) > 0"),
                      60, "the invokes scraped")
        # data: at least one series with a number (a quantile of an empty window is NaN)
        empty = []
        for panel in json.loads(DASHBOARD.read_text())["panels"]:
            for target in panel["targets"]:
                values = [float(r["value"][1]) for r in prom.query(target["expr"])]
                if not any(math.isfinite(v) for v in values):
                    empty.append(f'{panel["title"]}: {target["expr"]} -> {values}')
        assert not empty, empty
        SEEN.append("dashboard: every panel query returned data")
    finally:
        stop.set()
        _stop(d)
