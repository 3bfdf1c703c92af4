"""The backend choice (gpu/backend.py) and the daemon on the device backend.

The choice happens once, when zerolayer.gpu is imported, so every case runs in a fresh
process. The device path is exercised end to end under Numba's CUDA simulator
(ZEROLAYER_GPU_BACKEND=sim): a real zerolayerd subprocess loads a tiny GGUF (with a small
tokenizer), wraps it in the CUDA model, and serves a signed invoke whose greedy answer must
equal the CPU runtime's. On a machine with a GPU, auto picks cuda (checked against the
driver probe, so this file is right on both kinds of machine).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from daemon_proc import DaemonProc
from tiny_gguf import write_tiny_llama
from zerolayer.client import Client


def fresh(code: str, **env_values: str | None) -> list[str]:
    """The output lines of code run in a fresh interpreter (the choices are made at import),
    without the backend variables of this process, plus env_values."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ZEROLAYER_GPU_BACKEND", "NUMBA_ENABLE_CUDASIM", "ZEROLAYER_CUDA_MEMORY")}
    env.update({k: v for k, v in env_values.items() if v is not None})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.splitlines()


def choose(env_value: str | None) -> list[str]:
    out = fresh("from zerolayer.gpu import backend as b; "
                "print(b.NAME, b.USABLE, b.ON_DEVICE, sep='|'); print(b.REASON); "
                "print(b.probe_cuda()[0])", ZEROLAYER_GPU_BACKEND=env_value)
    return out[0].split("|") + [out[1], out[2]]


def test_auto_follows_the_driver_probe():
    name, usable, on_device, reason, has_gpu = choose(None)
    assert name == ("cuda" if has_gpu == "True" else "cpu") and usable == "True"
    assert reason  # says why: the device found, or what was missing
    assert choose("auto")[0] == name


def test_explicit_choices():
    assert choose("cpu")[:3] == ["cpu", "True", "False"]
    assert choose("sim")[:3] == ["sim", "True", "True"]
    bogus = choose("tpu")
    assert bogus[0] == "cpu" and "tpu" in bogus[3]


def memory_manager(env_value: str | None) -> list[str]:
    """(MEMORY, the class numba will allocate device memory with) on the real CUDA target
    (numba.cuda imported, no context needed)."""
    return fresh("from zerolayer.gpu.cuda import _cuda_shim as s; "
                 "from numba.cuda.cudadrv import driver as d; d._ensure_memory_manager(); "
                 "print(s.MEMORY); print(d._memory_manager.__name__)", ZEROLAYER_CUDA_MEMORY=env_value)


def test_device_memory_comes_from_cupys_pool():
    """Numba accepted the CuPy EMM plugin (it checks the interface version when it is set),
    unless told otherwise. The allocations themselves need a GPU: bench/gpu_bench.py checks
    that the model's weights land in CuPy's pool."""
    assert memory_manager(None) == ["cupy memory pool", "CupyPoolMemory"]
    assert memory_manager("numba") == ["numba (ZEROLAYER_CUDA_MEMORY=numba)", "NumbaCUDAMemoryManager"]
    bogus = memory_manager("rmm")
    assert "rmm" in bogus[0] and bogus[1] == "NumbaCUDAMemoryManager"


def test_cuda_without_a_gpu_refuses_to_start_the_daemon(tmp_path):
    name, usable, _, reason, has_gpu = choose("cuda")
    if has_gpu == "True":
        pytest.skip("this machine has a GPU: cuda is usable here")
    assert (name, usable) == ("cuda", "False") and "no CUDA" in reason
    model = tmp_path / "tiny.gguf"
    write_tiny_llama(str(model), tokenizer=True)
    keys = tmp_path / "keys"
    keys.write_text("1 " + "ab" * 32 + "\n")
    keys.chmod(0o600)
    env = dict(os.environ, ZEROLAYER_GPU_BACKEND="cuda")
    p = subprocess.run([sys.executable, "-m", "zerolayer.daemon.server", "--model-path", str(model),
                        "--security-keys-file", str(keys), "--network-port", "0",
                        "--metrics-port", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "cannot start" in p.stderr and "ZEROLAYER_GPU_BACKEND=cuda but no CUDA" in p.stderr


def test_daemon_serves_on_the_device_backend_under_the_simulator(tmp_path):
    """Slow by nature (every simulated GPU thread is a Python thread): 3 prompt tokens and 3
    generated ones, on a 2-layer model."""
    model = tmp_path / "tiny.gguf"
    write_tiny_llama(str(model), tokenizer=True)
    from zerolayer.gpu.generate import Generator, SamplingParams
    from zerolayer.gpu.ops import cpu_features
    from zerolayer.gpu.ops.int8_matmul import kernel_set
    # The device kernels keep float activations; of the CPU's modes int16 follows them (the
    # default's int8 ones round this random model's near-ties another way).
    with kernel_set(cpu_features.ISA, "int16"):
        cpu = Generator.load(str(model), max_seq_len=64, warmup=False)
    want = "".join(cpu.generate(token_ids=[5, 6, 7], params=SamplingParams(max_tokens=3)))
    want_ids = cpu.last.token_ids

    d = DaemonProc(tmp_path, "--model-path", str(model), "--model-max-seq-len", "64",
                   "--engine-kv-blocks", "4", "--engine-max-running", "2",
                   "--cache-lease-s", "120", "--lifecycle-warmup", "false",
                   env={"ZEROLAYER_GPU_BACKEND": "sim", "NUMBA_ENABLE_CUDASIM": "1"})
    try:
        assert any("on sim (CUDA simulator)" in line for line in d.log), d.log
        assert d.metric("zerolayer_model_backend_info",
                        'backend="sim",device="CUDA simulator"') == 1
        c = Client(d.addr, d.key_id, d.secret, timeout=120)
        r = c.invoke(token_ids=[5, 6, 7], max_tokens=3)
        assert r.text == want and r.usage.completion_tokens == len(want_ids) == 3
        assert r.finish_reason == "length"
    finally:
        assert d.stop() == 0


def test_numpy_without_row_stack_still_compiles_cuda():
    """numba-cuda 0.30's array lowering refers to numpy.row_stack, which numpy 2.5 removed:
    backend.py (imported before numba.cuda) puts the alias back only where it is missing."""
    out = fresh("import numpy; had = numpy.row_stack; del numpy.row_stack; "
                "from zerolayer.gpu import backend; print(numpy.row_stack is numpy.vstack); "
                "import numba.cuda.np.arrayobj; print('lowering imported')")
    assert out == ["True", "lowering imported"]
    kept = fresh("import numpy; f = getattr(numpy, 'row_stack', None); "
                 "from zerolayer.gpu import backend; print(getattr(numpy, 'row_stack', None) is f)")
    assert kept == ["True"]  # a numpy that still has it keeps its own
