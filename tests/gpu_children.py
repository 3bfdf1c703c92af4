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
its selected tests need. conftest.py starts them; `result` waits for one (starting it then
if nothing did), and `stop_all` ends any left when the session ends.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO


@dataclass
class _Child:
    proc: subprocess.Popen[bytes]
    out: IO[bytes]
    err: IO[bytes]
    t0: float


_children: dict[tuple[str, str], _Child] = {}


def _lowest_priority() -> None:
    os.nice(19)


def start(script: str, key: str, env: dict[str, str]) -> None:
    """Start `script --child` with `env` unless it is already running for `key`."""
    if (script, key) in _children:
        return
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, script, "--child"], env=env, stdout=out,
                            stderr=err, preexec_fn=_lowest_priority)
    _children[(script, key)] = _Child(proc, out, err, time.monotonic())


def result(script: str, key: str, env: dict[str, str], timeout: float) -> dict:
    """The child's JSON report (its last stdout line), with `_wall_s` from its start. The
    timeout counts from now: a child started early at nice 19 may have had little CPU."""
    start(script, key, env)
    c = _children[(script, key)]
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


def stop_all() -> None:
    for c in _children.values():
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()
        c.out.close()
        c.err.close()
    _children.clear()
