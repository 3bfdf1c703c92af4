"""deploy/zerolayerd.service under a real systemd: a container booted with systemd as PID 1
(`podman run --systemd=always`) from the image scripts/image-check.sh builds, with systemd
added (tests/fixtures/systemd.Containerfile). The unit, the isolated-cores drop-in, the
config and a keys file are installed as docs/OPERATIONS.md says, and every check goes through
systemctl, journalctl, /proc and the ops scripts (scripts/zl-*.sh), never the daemon's word:

  - Type=notify: systemd holds the unit in "activating" while the model load is held by the
    test hook, and calls it active only after the daemon logged "ready on";
  - the isolated-cores drop-in (its CPU list moved to this host's CPU 1): every thread of the
    daemon may run on CPU 1 alone;
  - the journal has the daemon's lines with their unit, identifier and syslog priority;
  - `systemctl reload` re-reads the keys file (a new key works at once; a broken file is
    refused at priority err and the old keys stay);
  - `systemctl stop` drains: a stream in flight completes, the daemon exits 0;
  - WatchdogSec: a daemon stopped with SIGSTOP is killed by systemd's watchdog and restarted,
    and the client that was waiting completes;
  - zl-rollout.sh restarts two units one after the other under client load, none lost;
  - `systemd-analyze security`: the exposure score, at most 2.0.

Two additions for the test alone, as drop-ins: the engine test hooks' directory (read-write
for the service) and, for the rollout, a second unit made from the same file.

Root, podman and minutes: runs with ZEROLAYER_OPS_CHECK=1 (.ci/run sets it). The image comes
from test_image.py (ZEROLAYER_IMAGE_CHECK=1, which runs first); without it, this builds it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE = os.environ.get("ZEROLAYER_IMAGE_TAG", "localhost/zerolayerd:check")
TAG = "localhost/zerolayerd-systemd:check"
PODMAN = ["podman", "--runtime", "runc"]
VENV = "/opt/zerolayer/.venv"
HOOKS = "/var/lib/zl-hooks"
PY = f"{VENV}/bin/python /src/tests/systemd_client.py"

pytestmark = pytest.mark.skipif(
    os.environ.get("ZEROLAYER_OPS_CHECK") != "1",
    reason="boots systemd in a container (root, podman, minutes): set ZEROLAYER_OPS_CHECK=1")


def _ulimits() -> list[str]:
    hard = subprocess.run(["bash", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout
    return ["--ulimit", f"nofile={hard.strip()}:{hard.strip()}", "--ulimit", "nproc=4096:4096"]


class Box:
    """One container with systemd as PID 1."""

    def __init__(self, name: str):
        self.name = name

    def sh(self, script: str, check: bool = True, timeout: float = 300) -> str:
        r = subprocess.run([*PODMAN, "exec", self.name, "bash", "-c", script],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"`{script}` exited {r.returncode}\n{r.stdout}\n{r.stderr}"
                                 f"\n{self.journal()}")
        return r.stdout

    def bg(self, script: str) -> subprocess.Popen:
        return subprocess.Popen([*PODMAN, "exec", self.name, "bash", "-c", script],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def show(self, prop: str, unit: str = "zerolayerd") -> str:
        return self.sh(f"systemctl show -P {prop} {unit}").strip()

    def journal(self, unit: str = "zerolayerd", n: int = 40) -> str:
        return subprocess.run([*PODMAN, "exec", self.name, "journalctl", "-u", unit, "-n",
                               str(n), "--no-pager"], capture_output=True, text=True).stdout

    def wait(self, cond, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if cond():
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}\n{self.journal()}")


@pytest.fixture(scope="module")
def box():
    if os.geteuid() != 0:
        pytest.fail("ZEROLAYER_OPS_CHECK=1 needs root (rootful podman)")
    # image-check.sh installs podman where it is missing, and builds the image
    if (shutil.which("podman") is None
            or subprocess.run([*PODMAN, "image", "exists", BASE]).returncode != 0):
        subprocess.run(["bash", str(ROOT / "scripts" / "image-check.sh")], cwd=ROOT, check=True,
                       timeout=45 * 60)
    subprocess.run([*PODMAN, "build", "-q", "--layers", "--isolation", "chroot", "--network",
                    "host", *_ulimits(), "--build-arg", f"BASE={BASE}", "-t", TAG, "-f",
                    str(ROOT / "tests" / "fixtures" / "systemd.Containerfile"), str(ROOT)],
                   check=True, capture_output=True, timeout=20 * 60)
    name = f"zl-systemd-check-{os.getpid()}"
    # No network but loopback; the kernels' JIT cache is image-check's volume (warm after it).
    r = subprocess.run([*PODMAN, "run", "-d", "--name", name, "--systemd=always",
                        "--network", "none", *_ulimits(),
                        "-v", "zerolayer-image-check-cache:/var/cache/zerolayer",
                        "-v", f"{ROOT}:/src:ro", TAG], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"podman run --systemd=always failed: {r.stderr}")
    b = Box(name)
    try:
        b.wait(lambda: b.sh("systemctl is-system-running || true").strip()
               in ("running", "degraded"), 120, "systemd up")
        yield b
    finally:
        subprocess.run([*PODMAN, "rm", "-f", "-t", "5", name], capture_output=True)


INSTALL = f"""
set -e
cd /src
id zerolayer >/dev/null
install -d -m 0755 /etc/zerolayer
install -m 0644 deploy/zerolayerd.toml /etc/zerolayer/zerolayerd.toml
ZEROLAYER_BIN={VENV}/bin/zerolayer scripts/zl-keygen.sh >/dev/null
sed "s|@VENV@|{VENV}|g" deploy/zerolayerd.service > /etc/systemd/system/zerolayerd.service
install -d /etc/systemd/system/zerolayerd.service.d
# this host has CPUs 0-1: the drop-in's 2-3 becomes 1 ("adjust the CPU numbers")
sed 's/=2-3$/=1/' deploy/zerolayerd.service.d/isolated-cores.conf \
    > /etc/systemd/system/zerolayerd.service.d/isolated-cores.conf
install -d -o zerolayer -g zerolayer {HOOKS}
printf '[Service]\\nEnvironment=ZEROLAYER_TEST_HOOKS={HOOKS}\\nReadWritePaths={HOOKS}\\n' \
    > /etc/systemd/system/zerolayerd.service.d/test-hooks.conf
systemctl daemon-reload
"""


def _ready_logged_before_started(box: Box) -> bool:
    lines = box.journal(n=400).splitlines()
    ready = [i for i, ln in enumerate(lines) if "zerolayerd: ready on" in ln]
    started = [i for i, ln in enumerate(lines) if "Started zerolayerd.service" in ln]
    return bool(ready and started) and ready[-1] < started[-1]


def test_notify_readiness_comes_after_warm_up(box):
    box.sh(INSTALL)
    box.sh(f"touch {HOOKS}/hold-load && systemctl start --no-block zerolayerd")
    box.wait(lambda: box.sh(f"test -e {HOOKS}/load-held && echo y || true").strip() == "y",
             300, "the model load held")
    assert box.show("ActiveState") == "activating" and box.show("SubState") == "start"
    assert "warming" in box.show("StatusText")
    box.sh(f"rm {HOOKS}/hold-load")
    box.wait(lambda: box.show("ActiveState") == "active", 300, "active")
    assert _ready_logged_before_started(box), box.journal()
    assert box.show("StatusText").startswith("ready")
    assert json.loads(box.sh(f"{PY} ping 7433 last"))["rtt"] > 0


def test_threads_run_on_the_drop_ins_cpus(box):
    pid = box.show("MainPID")
    allowed = box.sh(f"grep -h Cpus_allowed_list /proc/{pid}/task/*/status | sort | uniq -c")
    assert re.fullmatch(r"\s*\d+ Cpus_allowed_list:\s+1\n", allowed), allowed
    assert int(box.sh(f"ls /proc/{pid}/task | wc -l")) >= 2
    assert box.show("CPUAffinity") == "1" and box.show("Slice") == "zerolayer.slice"
    assert "I/O thread on CPUs [1]" in box.journal(n=400)


def test_journal_has_the_daemons_lines_with_their_fields(box):
    out = box.sh("journalctl -u zerolayerd -o json --no-pager")
    entries = [json.loads(ln) for ln in out.splitlines()]
    mine = [e for e in entries if e.get("_SYSTEMD_UNIT") == "zerolayerd.service"
            and e.get("SYSLOG_IDENTIFIER") == "zerolayerd"]
    ready = [e for e in mine if "ready on" in e["MESSAGE"]]
    assert ready and ready[-1]["PRIORITY"] == "6" and ready[-1]["_PID"] == box.show("MainPID")
    assert ready[-1]["_UID"] == box.sh("id -u zerolayer").strip()


def test_reload_rereads_the_keys_file_and_keeps_old_keys_on_a_bad_one(box):
    pid = box.show("MainPID")
    # a key appended behind the daemon's back is unknown to it until `systemctl reload`
    box.sh(f"{VENV}/bin/zerolayer keygen --append /etc/zerolayer/keys >/dev/null")
    refused = subprocess.run([*PODMAN, "exec", box.name, "bash", "-c", f"{PY} ping 7433 last"],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "UnknownKeyError" in refused.stderr, refused
    box.sh("systemctl reload zerolayerd")
    box.wait(lambda: "keys reloaded (2 keys)" in box.journal(), 60, "reload logged")
    assert json.loads(box.sh(f"{PY} ping 7433 last"))["rtt"] > 0
    # a broken file: refused, at priority err, and the old keys still serve
    box.sh("cp /etc/zerolayer/keys /root/keys.good && echo 'not a key' >> /etc/zerolayer/keys"
           " && systemctl reload zerolayerd")
    box.wait(lambda: "keys reload failed, old keys kept" in box.journal(), 60, "refusal logged")
    assert "keys reload failed" in box.sh("journalctl -u zerolayerd -p err --no-pager")
    assert json.loads(box.sh(f"{PY} ping 7433 last"))["rtt"] > 0
    box.sh("install -m 0600 -o zerolayer -g zerolayer /root/keys.good /etc/zerolayer/keys"
           " && systemctl reload zerolayerd")
    assert box.show("MainPID") == pid and box.show("NRestarts") == "0"


def _held(box) -> bool:
    """A request is in the daemon and its engine is held before the step (the hold hook)."""
    n = json.loads(box.sh(f"{PY} running 9433"))
    return (n["running"] + n["waiting"] >= 1
            and box.sh(f"test -e {HOOKS}/held && echo y || true").strip() == "y")


def test_stop_drains_a_stream_in_flight(box):
    # the engine is held before its first step until the drain has begun, so the stream is in
    # flight when the stop comes, however fast this machine decodes 200 tokens
    box.sh(f"touch {HOOKS}/hold")
    try:
        client = box.bg(f"{PY} invoke 7433 last 200")
        box.wait(lambda: _held(box), 120, "the request admitted, the engine held before its step")
        stop = box.bg("systemctl stop zerolayerd")
        box.wait(lambda: re.search(r"draining: [1-9]\d* requests in flight", box.journal(n=100)),
                 120, "the drain to begin with the stream in flight")
    finally:
        box.sh(f"rm -f {HOOKS}/hold")
    try:
        assert stop.wait(timeout=120) == 0
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err
        r = json.loads(out)
        assert r["finish_reason"] in ("stop", "length") and r["tokens"] > 0 and r["restarts"] == 0
        assert box.show("Result") == "success" and box.show("ExecMainStatus") == "0"
    finally:   # the tests after this one need the daemon, whatever happened here
        box.sh("systemctl start zerolayerd", timeout=320)


def test_watchdog_kills_and_restarts_a_stopped_daemon(box):
    pid = box.show("MainPID")
    # the engine is held before its first step, so the request is still in the daemon when
    # it stops, however fast this machine decodes 200 tokens
    box.sh(f"touch {HOOKS}/hold")
    try:
        client = box.bg(f"{PY} whole 7433 last 200")
        box.wait(lambda: _held(box), 120, "the request admitted, the engine held before its step")
        box.sh(f"kill -STOP {pid}")
    finally:
        box.sh(f"rm -f {HOOKS}/hold")   # the restarted daemon (or, on a failure, the tests
                                        # after this one) must not be held
    # WatchdogSec=30 as shipped: no ping for 30 s, then SIGABRT and Restart=on-failure
    box.wait(lambda: "Watchdog timeout" in box.journal(unit="zerolayerd", n=200), 120,
             "the watchdog timeout")
    box.wait(lambda: box.show("ActiveState") == "active" and box.show("MainPID") != pid, 320,
             "restarted and ready")
    assert box.show("NRestarts") == "1"
    out, err = client.communicate(timeout=180)
    assert client.returncode == 0, err
    r = json.loads(out)
    assert r["finish_reason"] in ("stop", "length") and r["text"] and r["restarts"] >= 1, r


def test_rollout_restarts_two_units_one_after_the_other_with_none_lost(box):
    # a second instance from the same unit file: its own config, port, runtime directory
    box.sh("""set -e
sed -e 's/^port = 7433 /port = 7434 /' -e 's/^port = 9433 /port = 9434 /' \
    /etc/zerolayer/zerolayerd.toml > /etc/zerolayer/zerolayerd-b.toml
grep -q '^port = 7434 ' /etc/zerolayer/zerolayerd-b.toml
grep -q '^port = 9434 ' /etc/zerolayer/zerolayerd-b.toml
sed -e 's|zerolayerd.toml|zerolayerd-b.toml|' \
    -e 's|^RuntimeDirectory=zerolayer$|RuntimeDirectory=zerolayer-b|' \
    /etc/systemd/system/zerolayerd.service > /etc/systemd/system/zerolayerd-b.service
systemctl daemon-reload
systemctl start zerolayerd-b
""", timeout=320)
    pids = {u: box.show("MainPID", u) for u in ("zerolayerd", "zerolayerd-b")}
    box.sh("rm -f /root/stop")
    load = box.bg(f"{PY} loop 7433,7434 /root/stop")
    for unit, sock, metrics in (("zerolayerd", "/run/zerolayer/control.sock", 9433),
                                ("zerolayerd-b", "/run/zerolayer-b/control.sock", 9434)):
        box.sh(f"cd /src && ZEROLAYER_BIN={VENV}/bin/zerolayer scripts/zl-rollout.sh "
               f"--socket {sock} --restart 'systemctl restart {unit}' "
               f"--ready-url http://127.0.0.1:{metrics}/readyz --timeout 300", timeout=620)
        assert box.show("MainPID", unit) != pids[unit]
    box.sh("touch /root/stop")
    out, err = load.communicate(timeout=240)
    r = json.loads(out)
    assert not r["failed"] and all(n > 0 for n in r["per_port"].values()), (r, err)
    print(f"\nrollout of two units: {r['completed']} invokes completed, 0 lost")
    box.sh("systemctl stop zerolayerd-b", timeout=120)


def test_security_exposure_is_at_most_2(box):
    out = box.sh("systemd-analyze security zerolayerd --no-pager")
    score = float(re.search(r"Overall exposure level for zerolayerd.service: ([\d.]+)", out)[1])
    flagged = [ln.split()[1] for ln in out.splitlines() if ln.startswith("✗")]
    print(f"\nsystemd-analyze security: {score}; flagged: {' '.join(flagged)}")
    assert score <= 2.0, out
    # the daemon under these settings served every test above
    assert box.show("ActiveState") == "active"
