"""Which device runs the model: chosen once, when zerolayer.gpu is first imported, before
numba is. The choice cannot change in a running process (Numba's CUDA simulator can only be
switched on before numba.cuda is imported), and nothing on the hot path asks again: the
daemon builds either a CPU model or a CUDA model at start, and the engine calls ``step`` on
whichever it got.

    ZEROLAYER_GPU_BACKEND=auto (default)  cuda when the driver probe finds a GPU, else cpu
    ZEROLAYER_GPU_BACKEND=cpu             the Numba CPU kernels (gpu/ops/)
    ZEROLAYER_GPU_BACKEND=cuda            the Numba CUDA kernels (gpu/cuda/); fails at model
                                          load, with the probe's reason, if there is no GPU
    ZEROLAYER_GPU_BACKEND=sim             the CUDA kernels under Numba's simulator (tests only:
                                          every GPU thread is a Python thread)

The probe asks the driver itself through ctypes (libcuda: cuInit, cuDeviceGetCount) rather
than through numba, so that deciding costs no numba import and no CUDA context.
"""
from __future__ import annotations

import ctypes
import os
import sys

import numpy as _np

# numba-cuda 0.30 registers an overload for numpy.row_stack when its array lowering is
# imported, and numpy 2.5 removed that alias of vstack: there, every CUDA compile fails with
# an AttributeError. This module is imported before numba.cuda (gpu/cuda/_cuda_shim.py), so
# the alias is put back here, only where numpy no longer has it.
if not hasattr(_np, "row_stack"):
    _np.row_stack = _np.vstack

CHOICES = ("auto", "cpu", "cuda", "sim")


def probe_cuda() -> tuple[bool, str]:
    """(usable, why): is there a CUDA driver with at least one device?"""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False, "no CUDA driver (libcuda.so.1 not found)"
    rc = lib.cuInit(0)
    if rc != 0:
        return False, f"cuInit failed (CUresult {rc})"
    n = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(n))
    if rc != 0 or n.value < 1:
        return False, f"no CUDA device (CUresult {rc}, {n.value} devices)"
    name = ctypes.create_string_buffer(128)
    dev = ctypes.c_int(0)
    if lib.cuDeviceGet(ctypes.byref(dev), 0) == 0 and lib.cuDeviceGetName(name, 128, dev) == 0:
        return True, f"{n.value} device(s), first: {name.value.decode(errors='replace')}"
    return True, f"{n.value} device(s)"


def _choose() -> tuple[str, str, bool]:
    """(backend, why, usable)."""
    want = os.environ.get("ZEROLAYER_GPU_BACKEND", "auto").strip().lower() or "auto"
    if want not in CHOICES:
        return "cpu", f"ZEROLAYER_GPU_BACKEND={want!r} is not one of {CHOICES}; using cpu", True
    if want == "sim":
        if "numba.cuda" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
            raise RuntimeError("ZEROLAYER_GPU_BACKEND=sim must be set before numba.cuda is imported")
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        return "sim", "Numba CUDA simulator (ZEROLAYER_GPU_BACKEND=sim)", True
    if want == "cpu":
        return "cpu", "ZEROLAYER_GPU_BACKEND=cpu", True
    ok, why = probe_cuda()
    if want == "cuda":
        return "cuda", why if ok else f"ZEROLAYER_GPU_BACKEND=cuda but {why}", ok
    return ("cuda", why, True) if ok else ("cpu", why, True)


NAME, REASON, USABLE = _choose()
ON_DEVICE = NAME in ("cuda", "sim")   # the model runs on gpu/cuda/'s kernels


class BackendUnavailable(RuntimeError):
    """The chosen backend cannot run here (cuda without a GPU)."""
