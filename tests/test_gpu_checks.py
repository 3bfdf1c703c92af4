"""The GPU checks that need no model (tests/gpu_checks.py: every kernel against its CPU twin,
the device sampler and logprobs, the mapped UMEM, the cooperative grid barrier) at tiny
shapes, on a CUDA device where one is usable; skipped elsewhere. The checks that need the
whole model (forward vs float64, graphs, prefill paths) run in bench/gpu_bench.py, which
builds it once (scripts/gpu-check.sh; `--sim` under the simulator).

In a child interpreter: the CUDA backend is chosen when numba.cuda is first imported, and
other tests in this process may have chosen the simulator."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CHILD = """
import json, sys
sys.path.insert(0, %r)
from zerolayer.gpu.cuda import _cuda_shim
if not _cuda_shim.device_available():
    print(json.dumps(None)); sys.exit(0)
import gpu_checks as g
from gpu_warm import TINY
c = dict(TINY, ctx=2048)
out = {"kernels": g.kernel_checks(c, False), "sampler": g.sampling_check(c, False),
       "mapped": g.mapped_ring(c, False), "grid": g.grid_barrier_check(None, False)}
print(json.dumps(out, default=str))
"""


def test_the_model_free_gpu_checks_pass_on_a_device():
    env = {k: v for k, v in os.environ.items()
           if k not in ("ZEROLAYER_GPU_BACKEND", "NUMBA_ENABLE_CUDASIM")}
    env["ZEROLAYER_CPU_KERNELS"] = "float"  # the CPU twins the kernels are compared with
    r = subprocess.run([sys.executable, "-c", CHILD % str(TESTS)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if res is None:
        pytest.skip("no usable CUDA device here")
    assert res["kernels"]["failed"] == 0 and res["kernels"]["passed"] > 0, res["kernels"]
    assert res["sampler"]["same_token_as_cpu"] == res["sampler"]["rows"]
    assert res["mapped"]["ids_in_ok"] and res["mapped"]["ids_out_ok"]
    assert all(run["error_flag"] == 0 for run in res["grid"]["runs"])
