"""A daemon whose engine cannot load or warm up exits at once, non-zero, saying why; it never
says ready on the way. The failure is the fail-load hook (daemon/fault_hooks.py: the
warm-up's kernels fail), so the tests wait for the process to end, never for a timer."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import urllib.error
import urllib.request

from daemon_proc import DaemonProc

CAUSE = "EngineLoadHook: test hook: the warm-up's kernels fail"
# bounds the kernels' first build in a fresh JIT cache; the failure comes right after it
START_S = 600


def _hooks(tmp_path, *files: str) -> dict:
    d = tmp_path / "hooks"
    d.mkdir()
    for f in files:
        (d / f).touch()
    return {"ZEROLAYER_TEST_HOOKS": str(d)}


class ReadyWatch(threading.Thread):
    """Every /readyz status answered until the process ends."""

    def __init__(self, d: DaemonProc):
        super().__init__(daemon=True)
        self.d, self.seen = d, []
        self.start()

    def run(self) -> None:
        url = f"http://127.0.0.1:{self.d.metrics_port}/readyz"
        while self.d.proc.poll() is None:
            try:
                self.seen.append(urllib.request.urlopen(url, timeout=2).status)
            except urllib.error.HTTPError as e:
                self.seen.append(e.code)
            except OSError:
                pass                     # not listening yet, or gone
            threading.Event().wait(0.05)


def test_a_failed_warmup_exits_2_naming_the_cause_and_is_never_ready(tmp_path):
    d = DaemonProc(tmp_path, env=_hooks(tmp_path, "fail-load"), wait_ready=False)
    watch = ReadyWatch(d)
    rc = d.wait(timeout=START_S)
    watch.join(10)
    log = "".join(d.log)
    assert rc == 2, log
    assert f"cannot start: {CAUSE}" in log, log
    assert "ready on" not in log
    assert 503 in watch.seen and 200 not in watch.seen, watch.seen


def test_a_failed_start_exits_even_if_a_thread_is_left_behind(tmp_path):
    """A library thread that never ends (the hang-exit hook) would keep the interpreter
    alive after main returns: the daemon does not return into it, it ends the process."""
    d = DaemonProc(tmp_path, env=_hooks(tmp_path, "fail-load", "hang-exit"), wait_ready=False)
    rc = d.wait(timeout=START_S)
    log = "".join(d.log)
    assert rc == 2, log
    assert f"cannot start: {CAUSE}" in log, log


def test_check_reports_a_failed_warmup(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"7 {secrets.token_hex(32)}\n")
    keys.chmod(0o600)
    out = subprocess.run(
        [sys.executable, "-m", "zerolayer.daemon.server", "--check",
         "--security-keys-file", str(keys), "--model-max-seq-len", "2048"],
        capture_output=True, text=True, timeout=START_S,
        env={**os.environ, **_hooks(tmp_path, "fail-load")})
    assert out.returncode == 2, out
    assert f"FAIL model: {CAUSE}" in out.stdout, out.stdout


def test_a_load_that_hangs_past_its_timeout_exits_2_naming_it(tmp_path):
    """The load is held by the hold-load hook (it never finishes, on any machine): when
    model.load_timeout_s runs out the daemon ends at once, exit 2, saying why, never ready."""
    env = _hooks(tmp_path, "hold-load")
    d = DaemonProc(tmp_path, "--model-load-timeout-s", "1", env=env, wait_ready=False)
    rc = d.wait(timeout=START_S)
    log = "".join(d.log)
    assert rc == 2, log
    assert ("cannot start: the model did not load and warm up within 1 s "
            "(model.load_timeout_s)") in log, log
    assert (tmp_path / "hooks" / "load-held").exists()   # it expired while the load was held
    assert "ready on" not in log
