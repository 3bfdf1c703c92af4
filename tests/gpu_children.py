"""The GPU suites' child processes, started as soon as the session's tests are collected and
collected by the suites' fixtures.

test_cuda_sim, test_cuda_fused, test_cuda_prefill_gemm, test_architectures (Numba's CUDA
simulator, which must be on before numba.cuda is imported) and test_cuda_ptx (PTX for sm_90)
run their cases in child processes that spend minutes in pure Python. Run only when their
tests come up, they leave one of a 2-core CI machine's cores idle all that time while the
rest of the suite waits on sockets and daemons. Started at collection instead, at the lowest
CPU priority (nice 19), they use the time the rest of the suite leaves idle and yield to it
whenever it wants a core; their results do not depend on when or how fast they ran.

A suite module names its children with `early_children(items)`: (key, env) for each child
its selected tests need. conftest.py queues them; a feeder thread runs at most MAX_EARLY at
a time (a simulator child holds ~1.2 GB); a child is killed if pytest dies. `result` waits
for one: started then if it had not been, and back at normal priority from then on, so that
a busy machine can slow it but never starve it while a test waits on it. `stop_all` ends any
left when the session ends.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

MAX_EARLY = 2       # children run ahead at once: one per core of a 2-core CI machine
EARLY_NICE = 19
_PR_SET_PDEATHSIG = 1   # linux/prctl.h

Key = tuple[str, str]   # (script, key)


@dataclass
class _Child:
    proc: subprocess.Popen[bytes]
    out: IO[bytes]
    err: IO[bytes]
    t0: float


_lock = threading.Lock()
_queued: list[tuple[Key, dict[str, str]]] = []
_children: dict[Key, _Child] = {}
_feeder: threading.Thread | None = None
_stopping = threading.Event()


def _child_setup(nice: int) -> None:
    """In the child, before exec: its nice value, and SIGKILL when pytest dies, so that a
    killed session leaves no simulator running on (Linux's PR_SET_PDEATHSIG)."""
    if nice:
        os.nice(nice)
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _spawn(script: str, env: dict[str, str], nice: int) -> _Child:
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, script, "--child"], env=env, stdout=out,
                            stderr=err, preexec_fn=lambda: _child_setup(nice))
    return _Child(proc, out, err, time.monotonic())


def _feed() -> None:
    # Lives until the session ends: a child's PR_SET_PDEATHSIG fires when the thread that
    # started it exits, not the process.
    while not _stopping.is_set():
        with _lock:
            if _queued and sum(c.proc.poll() is None for c in _children.values()) < MAX_EARLY:
                key, env = _queued.pop(0)
                _children[key] = _spawn(key[0], env, EARLY_NICE)
                continue
        _stopping.wait(0.5)


def start(script: str, key: str, env: dict[str, str]) -> None:
    """Queue `script --child` with `env` to run ahead at low priority, once per key."""
    global _feeder
    with _lock:
        k = (script, key)
        if k in _children or any(q == k for q, _ in _queued):
            return
        _queued.append((k, env))
        if _feeder is None or not _feeder.is_alive():
            _feeder = threading.Thread(target=_feed, name="gpu-children", daemon=True)
            _feeder.start()


def _normal_priority(pid: int) -> None:
    """Every thread of the child back to this process's priority (Linux nice values are per
    thread). Raising a priority needs CAP_SYS_NICE (CI runs as root); without it the child
    keeps nice 19."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, own)
        except OSError:
            pass


def result(script: str, key: str, env: dict[str, str], timeout: float) -> dict:
    """The child's JSON report (its last stdout line), with `_wall_s` from its start. The
    timeout counts from now: before, a child started early may have had little CPU."""
    k = (script, key)
    with _lock:
        _queued[:] = [(q, e) for q, e in _queued if q != k]
        c = _children.get(k)
        if c is None:
            c = _children[k] = _spawn(script, env, 0)
    _normal_priority(c.proc.pid)
    try:
        c.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        c.proc.kill()
        c.proc.wait()
        raise
    c.out.seek(0)
    c.err.seek(0)
    stdout = c.out.read().decode(errors="replace")
    stderr = c.err.read().decode(errors="replace")
    assert c.proc.returncode == 0, \
        f"simulator child failed:\n{stdout[-4000:]}\n{stderr[-8000:]}"
    report = json.loads(stdout.strip().splitlines()[-1])
    report["_wall_s"] = time.monotonic() - c.t0
    return report


def sim_env(**extra: str) -> dict[str, str]:
    """A simulator child's environment: Numba's CUDA simulator behind the GPU backend, and the
    CPU model it is compared with on the float kernels, the CUDA kernels' twins (float32 KV)."""
    return dict(os.environ, ZEROLAYER_GPU_BACKEND="sim", NUMBA_ENABLE_CUDASIM="1",
                PYTHONUNBUFFERED="1", ZEROLAYER_CPU_KERNELS="float", ZEROLAYER_CPU_KV="f32",
                **extra)


def one_child(script: str, key: str, fixture: str, env: Callable[[], dict[str, str]],
              timeout: float) -> tuple[Callable[[list[Any]], list[tuple[str, dict[str, str]]]],
                                       Any]:
    """For a suite whose tests read one child's results through one module fixture: its
    `early_children` and that fixture, bound at module level as
    ``early_children, results = gpu_children.one_child(__file__, "key", "results", env, s)``
    (pytest finds a fixture by its name= wherever the module holds it)."""
    import pytest

    def early_children(items: list[Any]) -> list[tuple[str, dict[str, str]]]:
        return [(key, env())] if any(fixture in i.fixturenames for i in items) else []

    @pytest.fixture(scope="module", name=fixture)
    def results() -> dict:
        return result(script, key, env(), timeout)

    return early_children, results


def stop_all() -> None:
    _stopping.set()
    with _lock:
        _queued.clear()
        for c in _children.values():
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()
            c.out.close()
            c.err.close()
        _children.clear()
