"""The control socket (daemon/ops/control.py) against a real zerolayerd: every command, its
errors, the socket's permissions, `zerolayer ctl`, drain and undrain with traffic, and the
data plane answering while the control socket is hammered. The engine is held inside a step
(daemon/test_hooks.py) where a test needs a request to stay in flight, so nothing here bets
on the machine's speed."""
from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq

from answers import FRANCE_ANSWER, FRANCE_QUESTION
from daemon_proc import DaemonProc
from test_dataplane import Hooks
from zerolayer.client import Client
from zerolayer.daemon.ops import control
from zerolayer.protocol.errors import DrainingError
from zerolayer.protocol.wire import ChatMessage

FRANCE = [ChatMessage("user", FRANCE_QUESTION)]


@pytest.fixture(scope="module")
def ctl_daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zl-control")
    hooks = Hooks(tmp / "hooks")
    sock = tmp / "control.sock"
    d = DaemonProc(tmp, "--control-socket", str(sock), "--cache-lease-s", "30",
                   env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    try:
        yield d, hooks, str(sock)
    finally:
        hooks.release()
        assert d.stop() == 0
    assert not sock.exists()  # removed on the way out


def ctl(path: str, cmd: str, **args) -> dict:
    reply = control.request(path, cmd, args)
    assert reply["v"] == 1
    return reply


def ok(path: str, cmd: str) -> dict:
    reply = ctl(path, cmd)
    assert reply["ok"], reply
    return reply["result"]


def client(d: DaemonProc, **kw) -> Client:
    return Client(d.addr, d.key_id, d.secret, timeout=kw.pop("timeout", 60), **kw)


def test_the_socket_is_reachable_only_by_its_owner(ctl_daemon):
    d, _, path = ctl_daemon
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()
    assert "control socket ipc://" in "".join(d.log)


def test_status_config_kv_and_xdp(ctl_daemon):
    d, _, path = ctl_daemon
    s = ok(path, "status")
    assert s["state"] == "ready" and s["drain"] is None and s["pid"] == d.proc.pid
    assert s["ingress"] == "udp" and s["keys"] == 1 and s["requests"]["in_flight"] == 0
    c = ok(path, "config")
    assert c["control"]["socket"] == path and c["model"]["max_seq_len"] == 2048
    assert c["security"]["keys_file"] == str(d.keys_file)  # a path; the secret never
    assert d.secret.hex() not in json.dumps(c)
    kv = ok(path, "kv-stats")
    assert kv["blocks"] > 0 and 0 <= kv["free_blocks"] <= kv["blocks"]
    assert ok(path, "xdp-status") == {"attached": False, "ingress": "udp"}
    for budget in ("rate-limit", "untagged-rate"):
        assert ctl(path, budget, rate_pps=5)["error"]["code"] == "UNAVAILABLE"


def test_the_wire_names_every_command_the_daemon_runs():
    """control.py refuses a name it doesn't list before the I/O thread sees the call: the
    list and the handlers are the same set."""
    from zerolayer.daemon.ops import control_commands
    assert set(control.COMMANDS) == set(control_commands.COMMANDS)


def test_errors_have_closed_codes(ctl_daemon):
    _, _, path = ctl_daemon
    assert ctl(path, "no-such")["error"]["code"] == "UNKNOWN_COMMAND"
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.connect(f"ipc://{path}")
    try:
        for raw in (b"not json", json.dumps({"v": 2, "cmd": "status"}).encode(),
                    json.dumps({"v": 1, "cmd": 5}).encode(), json.dumps([1]).encode()):
            s.send_multipart([b"", raw])
            assert s.poll(10_000)
            reply = json.loads(s.recv_multipart()[-1])
            assert not reply["ok"] and reply["error"]["code"] == "BAD_REQUEST", raw
    finally:
        s.close(0)
    assert set(control.ERROR_CODES) >= {"BAD_REQUEST", "UNKNOWN_COMMAND", "UNAVAILABLE"}


def test_drain_refuses_new_work_finishes_in_flight_then_undrain(ctl_daemon):
    d, hooks, path = ctl_daemon
    (hooks.dir / "hold").touch()                               # held at its first step
    try:
        s = client(d).stream(messages=FRANCE, max_tokens=8)
        d.wait_for(lambda: (hooks.dir / "held").exists(), timeout=120, what="engine held")
        assert ok(path, "status")["requests"]["in_flight"] == 1
        r = ok(path, "drain")
        assert r == {"state": "draining", "in_flight": 1}
        with pytest.raises(DrainingError):
            client(d, max_attempts=1, timeout=10).invoke(messages=FRANCE, max_tokens=4)
        assert client(d, timeout=10).ping() > 0               # control traffic still served
        assert ok(path, "status")["drain"] == "operator"
    finally:
        hooks.release()
    text = "".join(s)                                          # the in-flight one completes
    assert FRANCE_ANSWER in text and s.result.finish_reason in ("stop", "length")
    assert ok(path, "status")["state"] == "draining"           # and the daemon stays up
    assert ok(path, "undrain") == {"state": "ready"}
    assert FRANCE_ANSWER in client(d).invoke(messages=FRANCE, max_tokens=8).text


def test_cache_stats_and_flush(ctl_daemon):
    d, _, path = ctl_daemon
    rid = secrets.token_bytes(16)
    client(d).invoke(messages=FRANCE, max_tokens=4, request_id=rid)
    st = ok(path, "cache-stats")
    assert st["entries"] >= 1 and st["bytes"] > 0 and st["max_bytes"] == 256 << 20
    runs = d.metric("zerolayer_model_runs_total")
    client(d).invoke(messages=FRANCE, max_tokens=4, request_id=rid)    # served from the cache
    assert d.metric("zerolayer_model_runs_total") == runs
    assert ok(path, "cache-flush")["flushed"] >= 1
    client(d).invoke(messages=FRANCE, max_tokens=4, request_id=rid)    # forgotten: runs again
    assert d.metric("zerolayer_model_runs_total") == runs + 1


def test_reload_keys(ctl_daemon):
    d, _, path = ctl_daemon
    original = d.keys_file.read_text()
    extra = secrets.token_bytes(32)
    try:
        d.keys_file.write_text(original + f"8 {extra.hex()}\n")
        assert ok(path, "reload-keys") == {"keys": 2}
        assert Client(d.addr, 8, extra, timeout=20).ping() > 0
        d.keys_file.write_text("# nothing\n")                   # refused, old keys kept
        r = ctl(path, "reload-keys")
        assert not r["ok"] and r["error"]["code"] == "BAD_ARGUMENT"
        assert ok(path, "status")["keys"] == 2
    finally:
        d.keys_file.write_text(original)
        ok(path, "reload-keys")


def test_the_cli(ctl_daemon):
    _, _, path = ctl_daemon
    run = [sys.executable, "-m", "zerolayer.daemon.programs.cli", "ctl"]
    out = subprocess.run([*run, "status", "--socket", path], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "ready"
    env = {**os.environ, "ZEROLAYER_CONTROL_SOCKET": path}
    out = subprocess.run([*run, "kv-stats"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["blocks"] > 0
    out = subprocess.run([*run, "status", "--socket", path + ".nope"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 4 and "NO_SOCKET" in out.stderr


def test_a_hammered_control_socket_never_stops_the_data_plane(ctl_daemon):
    d, _, path = ctl_daemon
    stop = threading.Event()
    served = [0]

    def hammer():
        while not stop.is_set():
            assert ctl(path, "status")["ok"]
            served[0] += 1

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        c = client(d, timeout=20)
        for _ in range(20):
            assert c.ping() > 0
        assert FRANCE_ANSWER in c.invoke(messages=FRANCE, max_tokens=8).text
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert served[0] > 20


def test_resolve_path() -> None:
    assert control.resolve_path("auto", {}) == ""
    assert control.resolve_path("auto", {"RUNTIME_DIRECTORY": "/run/zl"}) == "/run/zl/control.sock"
    assert control.resolve_path("", {"RUNTIME_DIRECTORY": "/run/zl"}) == ""
    assert control.resolve_path("/x/c.sock", {}) == "/x/c.sock"


def _http(d: DaemonProc, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_health_and_readiness_follow_the_state(ctl_daemon):
    d, _, path = ctl_daemon
    assert _http(d, "/healthz") == (200, "ok\n")
    assert _http(d, "/readyz") == (200, "ready\n")
    assert _http(d, "/nothing")[0] == 404
    assert d.metric("zerolayer_server_state", 'state="ready"') == 1
    ok(path, "drain")
    try:
        assert _http(d, "/readyz") == (503, "draining\n")
        assert _http(d, "/healthz")[0] == 200
        d.wait_for(lambda: d.metric("zerolayer_server_state", 'state="draining"') == 1,
                   what="state gauge")
    finally:
        ok(path, "undrain")
    assert _http(d, "/readyz") == (200, "ready\n")


def test_stage_histograms_and_prefix_cache_counters(ctl_daemon):
    d, _, _ = ctl_daemon
    hit = d.metric("zerolayer_prefix_cache_tokens_total", 'result="hit"')
    client(d).invoke(messages=FRANCE, max_tokens=4)
    client(d).invoke(messages=FRANCE, max_tokens=4)        # the same prompt: its prefix reused
    d.wait_for(lambda: d.metric("zerolayer_prefix_cache_tokens_total", 'result="hit"') > hit,
               what="prefix hits counted")
    for stage in ("queue", "tokenize", "prefill", "decode"):
        assert d.metric("zerolayer_request_stage_seconds_count", f'stage="{stage}"') >= 2
    assert d.metric("zerolayer_token_gap_seconds_count") >= 2     # 4 tokens each, 3 gaps
    assert d.metric("zerolayer_overloaded_total", 'bound="nonce_cache"') == 0


def test_log_level_at_run_time(ctl_daemon):
    d, _, path = ctl_daemon
    assert ok(path, "log-level") == {"level": "info"}
    r = control.request(path, "log-level", {"level": "debug"})
    assert r["ok"] and r["result"] == {"level": "debug"}
    r = control.request(path, "log-level", {"level": "loud"})
    assert not r["ok"] and r["error"]["code"] == "BAD_ARGUMENT"
    out = subprocess.run([sys.executable, "-m", "zerolayer.daemon.programs.cli", "ctl", "log-level",
                          "level=info", "--socket", path], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout) == {"level": "info"}
    assert any("log level debug (set by the operator)" in line for line in d.log)


def test_journal_priorities():
    import io
    import logging

    from zerolayer.daemon.ops import logs
    buf = io.StringIO()
    logs.setup({"JOURNAL_STREAM": "8:123"}, stream=buf)
    try:
        logs.LOGGER.error("boom")
        logs.LOGGER.info("fine")
        logs.LOGGER.debug("hidden at info")
        assert buf.getvalue().splitlines() == ["<3>zerolayerd: boom", "<6>zerolayerd: fine"]
        buf2 = io.StringIO()
        logs.setup({}, stream=buf2)
        logs.LOGGER.warning("plain")
        assert buf2.getvalue() == "zerolayerd: plain\n"
    finally:
        logs.setup()
        logging.getLogger("zerolayerd").setLevel(logging.INFO)


def test_zl_status_script(ctl_daemon):
    d, _, path = ctl_daemon
    client(d).invoke(messages=FRANCE, max_tokens=4)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "ZEROLAYER_KEY_ID": str(d.key_id), "ZEROLAYER_SECRET": d.secret.hex(),
           "ZEROLAYER_CONTROL_SOCKET": path,
           "ZEROLAYER_BIN": str(Path(sys.executable).parent / "zerolayer")}
    out = subprocess.run(["bash", str(root / "scripts" / "zl-status.sh"), "--addr",
                          f"127.0.0.1:{d.port}", "--metrics",
                          f"http://127.0.0.1:{d.metrics_port}/metrics", "--count", "2"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "state            ready" in text and "requests         stop=" in text
    assert "ttft             n=" in text and "p99" in text
    assert f"control {path}" in text and '"state": "ready"' in text


def test_readyz_says_warming_until_the_model_is_loaded(tmp_path):
    """The model load held by a test hook: /healthz answers, /readyz is 503 "warming", the
    state gauge says warming; released, the daemon becomes ready."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "hold-load").touch()
    d = DaemonProc(tmp_path, env={"ZEROLAYER_TEST_HOOKS": str(hooks)}, wait_ready=False)
    try:
        d.wait_for(lambda: (hooks / "load-held").exists(), timeout=120, what="load held")

        def http_up() -> bool:
            try:
                return _http(d, "/healthz")[0] == 200
            except OSError:
                return False
        d.wait_for(http_up, timeout=60, what="/healthz")
        assert _http(d, "/readyz") == (503, "warming\n")
        assert d.metric("zerolayer_server_state", 'state="warming"') == 1
        (hooks / "hold-load").unlink()
        d.wait_for(lambda: _http(d, "/readyz")[0] == 200, timeout=300, what="ready")
        assert any("ready on" in line for line in d.log)
    finally:
        (hooks / "hold-load").unlink(missing_ok=True)
        assert d.stop() == 0


def test_remote_control_over_tcp_needs_a_known_curve_key(tmp_path):
    """[control] tcp: encrypted (CURVE), and only operators whose public key is in
    curve_dir/clients get answers; an unknown key gets none. Plain TCP is refused."""
    from daemon_proc import free_port
    keys = tmp_path / "curve"
    run = [sys.executable, "-m", "zerolayer.daemon.programs.cli"]
    assert subprocess.run([*run, "ctl-keys", str(keys)], timeout=60).returncode == 0
    stranger = tmp_path / "stranger"
    assert subprocess.run([*run, "ctl-keys", str(stranger)], timeout=60).returncode == 0
    assert stat.S_IMODE(os.stat(keys / "server.key_secret").st_mode) & 0o077 == 0
    endpoint = f"tcp://127.0.0.1:{free_port(socket.SOCK_STREAM)}"
    d = DaemonProc(tmp_path, "--control-socket", "", "--control-tcp", endpoint,
                   "--control-curve-dir", str(keys))
    try:
        r = control.request(endpoint, "status", curve=(str(keys / "operator.key_secret"),
                                                      str(keys / "server.key")))
        assert r["ok"] and r["result"]["state"] == "ready"
        out = subprocess.run([*run, "ctl", "kv-stats", "--connect", endpoint, "--curve-dir",
                              str(keys)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and json.loads(out.stdout)["blocks"] > 0
        with pytest.raises(TimeoutError):              # its key is not in clients/
            control.request(endpoint, "status", timeout_s=3,
                            curve=(str(stranger / "operator.key_secret"),
                                   str(keys / "server.key")))
    finally:
        assert d.stop() == 0
    bad = subprocess.run([sys.executable, "-m", "zerolayer.daemon.server",
                          "--security-keys-file", str(d.keys_file), "--control-socket", "",
                          "--control-tcp", endpoint, "--network-port", "0",
                          "--metrics-port", "0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "curve_dir" in bad.stderr
