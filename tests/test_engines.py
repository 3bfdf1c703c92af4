"""Several engines in one daemon ([[engines]]): a real zerolayerd with two CPU
engines (one kernel thread each, on CPUs 0 and 1), and the engines held inside a step by the
test hooks (daemon/test_hooks.py) whenever "busy" matters, so that what each test sees is
a fact of the test, not a bet on the machine's speed.

  * both engines serve, spread by load when the prompts share no prefix;
  * a duplicate request id attaches to its run on whichever engine runs it (runs once);
  * requests sharing a long system prompt go to the same engine (prefix affinity), others
    to the other, and the prefix cache there is then used;
  * one engine's crash fails only its own requests; the other serves on (/readyz says
    "degraded"); when the last engine dies the daemon exits 1.

Plus the router, the boundary hashes and the [[engines]] configuration, without a daemon.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from daemon_proc import DaemonProc
from zerolayer.client import Client
from zerolayer.daemon import config
from zerolayer.daemon.routing import BOUNDARIES, Router, boundary_hashes
from zerolayer.protocol.errors import InternalServerError
from zerolayer.protocol.wire import ChatMessage

TWO_ENGINES = '[{cpus="0", threads=1}, {cpus="1", threads=1}]'
COUNT = "Count from one to one thousand: one, two, three,"
SYSTEM_A = ("You are a meticulous assistant for a shipping company. " * 30).strip()
SYSTEM_B = ("You answer questions about astronomy, briefly and with care. " * 30).strip()

needs_two_cpus = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0),
                                    reason="needs CPUs 0 and 1")


class Hooks:
    def __init__(self, path: Path):
        self.dir = path
        path.mkdir()

    def hold(self, d: DaemonProc, engine: int | None = None) -> None:
        """Hold every engine (or one) at its next step boundary; returns at once: an idle
        engine holds only once it has work (see wait_held)."""
        (self.dir / ("hold" if engine is None else f"hold-{engine}")).touch()

    def wait_held(self, d: DaemonProc, engine: int) -> None:
        d.wait_for(lambda: (self.dir / f"held-{engine}").exists(), timeout=120,
                   what=f"engine {engine} held")

    def release(self) -> None:
        for p in self.dir.glob("hold*"):
            if p.name != "hold-load":
                p.unlink(missing_ok=True)

    def crash(self, engine: int) -> None:
        (self.dir / f"crash-{engine}").touch()


def client(d: DaemonProc, **kw) -> Client:
    return Client(d.addr, d.key_id, d.secret, timeout=kw.pop("timeout", 120), **kw)


def routed(d: DaemonProc, engine: int, reason: str | None = None) -> float:
    total = 0.0
    for r in ((reason,) if reason else ("prefix", "load")):
        try:
            total += d.metric("zerolayer_engine_routed_total", f'engine="{engine}",reason="{r}"')
        except KeyError:
            pass
    return total


def snapshot(d: DaemonProc) -> tuple[float, float]:
    return routed(d, 0), routed(d, 1)


def wait_routed(d: DaemonProc, before: tuple[float, float], n: int = 1) -> int:
    """Wait until `n` more requests were routed; returns the engine that got the last one
    (the one whose count moved, when n == 1)."""
    d.wait_for(lambda: sum(snapshot(d)) >= sum(before) + n, timeout=60, what="routed")
    now = snapshot(d)
    return 0 if now[0] > before[0] else 1


def run_in_thread(fn):
    out: dict = {}

    def go():
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            out["error"] = e
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


def chat(system: str, user: str) -> list[ChatMessage]:
    return [ChatMessage("system", system), ChatMessage("user", user)]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zl-engines")
    hooks = Hooks(tmp / "hooks")
    d = DaemonProc(tmp, "--engines", TWO_ENGINES, "--cache-lease-s", "60",
                   env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    try:
        yield d, hooks
    finally:
        hooks.release()
        assert d.stop() == 0


def _wait_idle(d: DaemonProc) -> None:
    d.wait_for(lambda: d.metric("zerolayer_requests_running") == 0
               and d.metric("zerolayer_requests_waiting") == 0, timeout=120, what="idle")


@needs_two_cpus
def test_both_engines_serve_spread_by_load(two):
    d, hooks = two
    assert any("engine 0 on [0] (1 threads); engine 1 on [1] (1 threads)" in line
               for line in d.log), d.log
    hooks.hold(d)
    try:
        jobs = []
        for _ in range(4):  # short prompts: no prefix to follow, so load alone decides
            before = snapshot(d)
            jobs.append(run_in_thread(lambda: client(d).invoke("Say hello.", max_tokens=6)))
            jobs[-1] += (wait_routed(d, before),)
        assert [j[2] for j in jobs] == [0, 1, 0, 1]  # the least loaded, lowest index on a tie
        hooks.wait_held(d, 0)
        hooks.wait_held(d, 1)
        for e in (0, 1):  # each engine has its two: one taken (held before its step), one queued
            d.wait_for(lambda e=e: d.metric("zerolayer_engine_requests_waiting", f'engine="{e}"')
                       >= 1, what=f"engine {e}'s queue in its metrics")
    finally:
        hooks.release()
    texts = []
    for t, out, _ in jobs:
        t.join(120)
        assert "result" in out, out
        texts.append(out["result"].text)
    # greedy on the same weights: both engines give the same answer (shared weights, own KV)
    assert len(set(texts)) == 1 and texts[0], texts
    assert d.metric("zerolayer_engine_up", 'engine="0"') == 1
    assert d.metric("zerolayer_engine_up", 'engine="1"') == 1
    _wait_idle(d)


@needs_two_cpus
def test_a_duplicate_request_id_attaches_across_engines(two):
    """Engine 0 busy with A: a new request would go to engine 1. A duplicate of A's id
    must attach to A's run instead (the result cache is global): engine 1 gets nothing,
    the model runs once."""
    d, hooks = two
    rid = secrets.token_bytes(16)
    runs0 = d.metric("zerolayer_model_runs_total")
    att0 = d.metric("zerolayer_idempotent_hits_total", 'kind="attached"')
    hooks.hold(d)
    try:
        before = snapshot(d)
        a = run_in_thread(lambda: client(d).invoke(COUNT, max_tokens=8, request_id=rid))
        assert wait_routed(d, before) == 0
        hooks.wait_held(d, 0)
        dup = run_in_thread(lambda: client(d).invoke(COUNT, max_tokens=8, request_id=rid))
        d.wait_for(lambda: d.metric("zerolayer_idempotent_hits_total", 'kind="attached"')
                   >= att0 + 1, what="the duplicate attached")
        assert snapshot(d) == (before[0] + 1, before[1])  # engine 1 got nothing
    finally:
        hooks.release()
    for t, out in (a, dup):
        t.join(120)
        assert "result" in out, out
    assert a[1]["result"].text == dup[1]["result"].text
    assert d.metric("zerolayer_model_runs_total") == runs0 + 1
    _wait_idle(d)


@needs_two_cpus
def test_prefix_affinity(two):
    """Requests sharing a long system prompt go to the engine that served it; another long
    prompt goes to the other engine (load) and then sticks there; the shared prompt's KV is
    reused by the engine that holds it."""
    d, hooks = two
    prefix0 = routed(d, 0, "prefix")
    prefix1 = routed(d, 1, "prefix")
    hooks.hold(d)
    jobs = []
    try:
        got = []
        for system, user in ((SYSTEM_A, "Where is my parcel?"), (SYSTEM_B, "What is a star?"),
                             (SYSTEM_A, "How much is shipping?"),
                             (SYSTEM_A, "Can I change the address?"),
                             (SYSTEM_B, "How far is the moon?")):
            before = snapshot(d)
            jobs.append(run_in_thread(
                lambda s=system, u=user: client(d).invoke(messages=chat(s, u), max_tokens=4)))
            got.append(wait_routed(d, before))
        a_engine = got[0]
        assert got == [a_engine, 1 - a_engine, a_engine, a_engine, 1 - a_engine], got
        assert routed(d, a_engine, "prefix") == (prefix0, prefix1)[a_engine] + 2
        assert routed(d, 1 - a_engine, "prefix") == (prefix0, prefix1)[1 - a_engine] + 1
    finally:
        hooks.release()
    for t, out in jobs:
        t.join(120)
        assert "result" in out, out
    _wait_idle(d)
    # now finished, the shared system prompt is in that engine's prefix cache: the next
    # request with it goes there and skips most of its prefill
    before = snapshot(d)
    r = client(d).invoke(messages=chat(SYSTEM_A, "Do you ship abroad?"), max_tokens=4)
    assert wait_routed(d, before) == a_engine
    assert r.usage.cached_prompt_tokens > 0.5 * r.usage.prompt_tokens, r.usage
    _wait_idle(d)


@needs_two_cpus
def test_one_engine_crash_fails_only_its_requests(tmp_path):
    hooks = Hooks(tmp_path / "hooks")
    ctl_sock = tmp_path / "ctl.sock"
    d = DaemonProc(tmp_path, "--engines", TWO_ENGINES, "--control-socket", str(ctl_sock),
                   env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    try:
        before = snapshot(d)
        s = client(d).stream(COUNT, max_tokens=400)  # engine 0 (both idle: lowest index)
        it = iter(s)
        next(it)  # text sent: its INTERNAL will not be retried
        assert wait_routed(d, before) == 0
        hooks.hold(d, 0)
        hooks.wait_held(d, 0)
        # engine 1 serves meanwhile: the new request goes there (engine 0 has one)
        before = snapshot(d)
        r1 = client(d).invoke("Say hello.", max_tokens=4)
        assert snapshot(d)[1] == before[1] + 1 and r1.text
        hooks.crash(0)
        hooks.release()
        with pytest.raises(InternalServerError, match="engine"):
            for _ in it:
                pass
        d.wait_for(lambda: d.metric("zerolayer_engine_up", 'engine="0"') == 0,
                   what="engine 0 reported down")
        assert d.proc.poll() is None  # the daemon serves on
        assert d.metric("zerolayer_engine_up", 'engine="1"') == 1
        body = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/readyz",
                                      timeout=5).read().decode()
        assert body.startswith("degraded") and "0" in body, body
        # every new request now goes to engine 1, and completes
        before = snapshot(d)
        for _ in range(3):
            assert client(d).invoke("Say hi.", max_tokens=4).text
        assert snapshot(d) == (before[0], before[1] + 3)
        # the operator sees which engine died
        out = subprocess.run([sys.executable, "-m", "zerolayer.daemon.programs.cli", "ctl", "status",
                              "--socket", str(ctl_sock)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        st = json.loads(out.stdout)
        assert [e["state"] for e in st["engines"]] == ["dead", "serving"], st
        assert st["degraded"] is True and "crash" in st["engines"][0]["error"]
        assert any("engine 0 failed" in line and "serve on" in line for line in d.log)
        # the last engine dies: every request fails, the daemon exits 1 (systemd restarts it)
        hooks.crash(1)
        with pytest.raises(InternalServerError):
            client(d, timeout=10).invoke("Say hi.", max_tokens=4)
        assert d.wait(60) == 1
    finally:
        hooks.release()
        d.stop()


# ---- without a daemon --------------------------------------------------------------------

def test_boundary_hashes_follow_the_leading_bytes():
    a = b"x" * 5000 + b"tail one"
    b = b"x" * 5000 + b"another tail, longer"
    assert boundary_hashes(b"short") == []
    ha, hb = boundary_hashes(a), boundary_hashes(b)
    assert len(ha) == len([x for x in BOUNDARIES if x <= len(a)]) == 3
    assert ha == hb  # the same first 4096 bytes
    c = b"y" + a[1:]
    assert not set(boundary_hashes(c)) & set(ha)


def test_router_prefers_the_prefix_then_the_load():
    r = Router(2, slack=2)
    h = boundary_hashes(b"s" * 2000)
    assert r.choose(h, [0, 0], [True, True]) == (0, "load")
    r.record(0, h)
    assert r.choose(h, [2, 0], [True, True]) == (0, "prefix")   # within the slack
    assert r.choose(h, [3, 0], [True, True]) == (1, "load")     # too busy: balance
    assert r.choose(h, [0, 0], [False, True]) == (1, "load")    # never a dead engine
    assert r.choose([], [1, 0], [True, True]) == (1, "load")
    assert r.choose(h, [0, 0], [False, False])[0] == -1
    longer = boundary_hashes(b"s" * 2000 + b"t" * 3000)
    r.record(1, longer)
    assert r.choose(longer, [1, 0], [True, True]) == (1, "prefix")  # the longest match wins
    small = Router(1, slack=0, remembered=3)
    small.record(0, h + longer)
    assert len(small.seen[0]) == 3
    r.forget(0)
    assert r.choose(h, [0, 1], [True, True]) == (1, "prefix")  # shares the first boundaries


def _args(*argv):
    ap = argparse.ArgumentParser()
    config.add_flags(ap)
    return ap.parse_args(list(argv))


def test_engines_config_from_the_file_and_the_flag(tmp_path):
    f = tmp_path / "z.toml"
    f.write_text('[[engines]]\ncpus = "0-1"\nthreads = 2\n\n[[engines]]\ncpus = "2"\n'
                 'device = 1\nkv_blocks = 64\n')
    cfg = config.load(_args("--config", str(f)), environ={})
    assert [(e.cpus, e.threads, e.device, e.kv_blocks) for e in cfg.engines] == \
        [("0-1", 2, -1, 0), ("2", 0, 1, 64)]
    cfg = config.load(_args("--config", str(f), "--engines", '[{cpus="3"}]'), environ={})
    assert [e.cpus for e in cfg.engines] == ["3"]
    cfg = config.load(_args(), environ={"ZEROLAYER_ENGINES": '[{threads=1}, {threads=1}]'})
    assert len(cfg.engines) == 2
    assert config.load(_args(), environ={}).engines == []  # no [[engines]]: one engine


@pytest.mark.parametrize("spec, needle", [
    ('[{cpus="0"}, {cpus="0-1"}]', "engines[1].cpus (--engines): CPU 0 is engines[0]'s"),
    ('[{cpu="1"}]', "engines[0] (--engines): unknown setting(s) ['cpu']"),
    ('[{threads=-1}]', "engines[0].threads (--engines): -1 is not in 0..1024"),
    ('[{threads="two"}]', "engines[0].threads (--engines): not an integer"),
    ('{cpus="0"}', "engines (--engines): must be a list of tables"),
])
def test_a_bad_engines_list_names_the_engine_and_source(spec, needle):
    with pytest.raises(config.ConfigError) as e:
        config.load(_args("--engines", spec), environ={})
    assert any(needle in p for p in e.value.problems), e.value.problems


def test_engine_cpus_and_engines_are_not_both_set():
    with pytest.raises(config.ConfigError, match="engine_cpus and \\[\\[engines\\]\\]"):
        config.load(_args("--engines", '[{cpus="0"}]', "--cpu-engine-cpus", "1"), environ={})


def test_the_daemon_refuses_engines_on_cpus_it_cannot_use(tmp_path):
    """Refused before the model loads (exit 2, the unit does not restart it), naming the
    engine; `zerolayerd --check` says the same."""
    bad = sorted(set(range(1024)) - os.sched_getaffinity(0))[0]
    keys = tmp_path / "keys"
    keys.write_text(f"7 {secrets.token_bytes(32).hex()}\n")
    keys.chmod(0o600)
    cmd = [sys.executable, "-m", "zerolayer.daemon.server", "--security-keys-file", str(keys),
           "--network-port", "0", "--metrics-port", "0",
           "--engines", f'[{{cpus="0"}}, {{cpus="{bad}"}}]']
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"engines[1].cpus '{bad}': CPU(s) [{bad}] not available" in r.stderr
    assert "loaded" not in r.stderr
    r = subprocess.run(cmd + ["--check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "FAIL engines: engines[1].cpus" in r.stdout, r.stdout
