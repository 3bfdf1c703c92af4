"""Which CPU matmul kernels this machine runs: decided once, at import.

The int8 kernels (gpu/ops/int8_matmul.py) need integer dot-product instructions that LLVM
only emits for a target that has them, so the choice follows the features LLVM itself
targets (llvmlite's view of the host CPU, which is also what Numba compiles for), not
/proc/cpuinfo alone (a VM may hide features from one and not the other).

Kernel sets, best first:

* ``vnni``  AVX-512 VNNI (``vpdpbusd`` on 512-bit vectors), or AVX-VNNI / AVX-512 VL on 256
* ``avx2``  AVX2 ``vpmaddubsw`` + ``vpmaddwd``
* ``float`` the float32 kernels of gpu/ops/matmul.py (the reference and the fallback)

and, for vnni and avx2, the activations' width: int16 (the default: the F32 model's answers),
int8 with the attention's Q|K|V projection at int16, or int8 (``ZEROLAYER_CPU_ACTIVATIONS``,
below).

``ZEROLAYER_CPU_KERNELS=float|avx2|vnni|auto`` overrides the default. Asking for a set the CPU
lacks falls back to the best one it has (with a warning), so a config written on one machine
still runs on another.
"""
from __future__ import annotations

import os
import warnings
from typing import TypeAlias

import numpy as np

ENV = "ZEROLAYER_CPU_KERNELS"
MODES = ("float", "avx2", "vnni")

# The default when the variable is unset: "auto", the best set the CPU supports, with the
# activations the accuracy rule picks (ACT_DEFAULT below).
# "float" runs the reference kernels (gpu/ops/matmul.py), which the CUDA kernels twin.
DEFAULT = "auto"

# ISA ids, shared with int8_matmul's format codes
ISA_AVX2, ISA_VNNI256, ISA_VNNI512 = 1, 2, 3


def host_features() -> frozenset[str]:
    """The x86 features LLVM targets here (names as LLVM spells them): Numba's own target,
    NUMBA_CPU_FEATURES where that is set (NUMBA_CPU_NAME=haswell with haswell's features
    compiles everything for an AVX2 machine, on any x86 host), else the host's."""
    try:
        from numba.core import config
        if config.CPU_FEATURES is not None:
            return frozenset(f[1:] for f in config.CPU_FEATURES.split(",") if f.startswith("+"))
    except ImportError:
        pass
    try:
        import llvmlite.binding as ll
        fm = ll.get_host_cpu_features()
        return frozenset(k for k, v in fm.items() if v)
    except Exception:  # no LLVM host info: read the kernel's flags instead
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("flags"):
                        flags = set(line.split(":", 1)[1].split())
                        # /proc spells avx512_vnni / avx_vnni
                        return frozenset(flags | {f.replace("_", "") for f in flags})
        except OSError:
            pass
        return frozenset()


def supported_isas(feats: frozenset[str] | None = None) -> tuple[int, ...]:
    """The int8 ISA ids this CPU can run, best first."""
    f = host_features() if feats is None else feats
    out = []
    if {"avx512vnni", "avx512bw", "avx512f"} <= f:
        out.append(ISA_VNNI512)
    if ({"avx512vnni", "avx512vl", "avx512bw"} <= f) or "avxvnni" in f:
        out.append(ISA_VNNI256)
    if "avx2" in f:
        out.append(ISA_AVX2)
    return tuple(out)


def isa_for_mode(mode: str, isas: tuple[int, ...]) -> int:
    """ISA id for a kernel set (0: the float kernels)."""
    if mode == "vnni":
        for i in (ISA_VNNI512, ISA_VNNI256):
            if i in isas:
                return i
        return 0
    if mode == "avx2":
        return ISA_AVX2 if ISA_AVX2 in isas else 0
    return 0


def select(env: str | None = None, feats: frozenset[str] | None = None) -> tuple[str, int]:
    """(mode, isa id) from the override (or DEFAULT) and the CPU's features."""
    isas = supported_isas(feats)
    want = (env if env is not None else os.environ.get(ENV, "")).strip().lower() or DEFAULT
    if want not in MODES + ("auto",):
        warnings.warn(f"{ENV}={want!r} is not one of {MODES + ('auto',)}; using auto", stacklevel=2)
        want = "auto"
    if want == "float":
        return "float", 0
    if want != "auto":
        isa = isa_for_mode(want, isas)
        if isa:
            return want, isa
        warnings.warn(f"{ENV}={want}: this CPU lacks the instructions; using the best it has", stacklevel=2)
    for mode in ("vnni", "avx2"):
        isa = isa_for_mode(mode, isas)
        if isa:
            return mode, isa
    return "float", 0


MODE, ISA = select()

# The activations' width for the integer kernels: int16 (two byte dot products per int8
# one, or vpdpwssd on zero-extended Q8 bytes) keeps the float kernels' answers (an
# activation is off by at most 1/65534 of its block's largest, against 1/254 with int8) at
# the int8 path's memory traffic, which is what decode waits on; int8 (llama.cpp's choice)
# has twice the arithmetic throughput, which prefill uses, and flips near-ties. int8-qkv16:
# int8 everywhere but the fused Q|K|V projection, whose error the attention's softmax
# amplifies.
# The default is the accuracy rule's pick (bench/accuracy_metrics.py; tests/test_accuracy.py
# holds it): the fastest mode that gives the F32 model's own answers, top-1 agreement >= 99.5%
# and mean KL <= 1e-5 on the accuracy text. That is int16 (top-1 99.8-100%, KL 5e-7); the
# int8 modes agree at ~97%, as llama.cpp does on the same file, and answer the France chat
# question with llama.cpp's "L'Étoile, ..." instead of the model's "The capital of France is
# Paris." They stay opt-in for prefill speed (1.2-1.5x int16's where the CPU has the
# arithmetic to spare; decode is level: the weight bytes set it).
ACT_ENV = "ZEROLAYER_CPU_ACTIVATIONS"
ACT_DEFAULT = "int16"
ACT_MODES = ("int16", "int8", "int8-qkv16")
# each mode's suffix of the cached weight layout's key (layout_key)
_ACT_KEYS = {"int16": "w", "int8": "", "int8-qkv16": "q"}


def select_activations(env: str | None = None) -> str:
    want = (env if env is not None else os.environ.get(ACT_ENV, "")).strip().lower() or ACT_DEFAULT
    if want not in ACT_MODES:
        warnings.warn(f"{ACT_ENV}={want!r} is not one of {', '.join(ACT_MODES)}; using "
                      f"{ACT_DEFAULT}", stacklevel=2)
        want = ACT_DEFAULT
    return want


ACTIVATIONS = select_activations()


def use_activations(mode: str) -> None:
    """Set the activations for the models loaded from now on (a setting read after import:
    the daemon's [cpu] activations, `zerolayer generate --cpu-activations`); "" keeps the
    current choice. The kernels read ACTIVATIONS when a model's weights are laid out."""
    global ACTIVATIONS
    if not mode:
        return
    if mode not in ACT_MODES:
        raise ValueError(f"CPU activations {mode!r}: not one of {', '.join(ACT_MODES)}")
    ACTIVATIONS = mode


# The KV cache's element type (gpu/kv_cache.py, gpu/ops/attention.py): float16, llama.cpp's
# default cache type, halves the cache's memory and the bytes a decode step reads at depth
# (at 1000 positions the float32 cache was a third of SmolLM2's decode traffic); float32 keeps
# keys and values exact (the float64-reference tests use it).
KV_ENV = "ZEROLAYER_CPU_KV"
KV_DEFAULT = "f16"
KVType: TypeAlias = type[np.uint16] | type[np.float32]
# float16 lives as its bits (gpu/ops/half.py)
_KV_TYPES: dict[str, KVType] = {"f16": np.uint16, "f32": np.float32}


def select_kv(env: str | None = None) -> KVType:
    want = (env if env is not None else os.environ.get(KV_ENV, "")).strip().lower() or KV_DEFAULT
    if want not in _KV_TYPES:
        warnings.warn(f"{KV_ENV}={want!r} is not f16 or f32; using {KV_DEFAULT}", stacklevel=2)
        want = KV_DEFAULT
    return _KV_TYPES[want]


KV_DTYPE = select_kv()


def layout_key() -> str | None:
    """Names the weight layout the selected kernels run on (the model cache keeps one per
    key); None for the float kernels."""
    return f"{ISA}{_ACT_KEYS[ACTIVATIONS]}" if ISA else None


def describe() -> str:
    """The selected kernels, for logs: "vnni kernels, int16 activations, f16 KV cache"."""
    kv = "f16" if KV_DTYPE == np.uint16 else "f32"
    if not ISA:
        return f"float kernels, {kv} KV cache"
    return f"{MODE} kernels, {ACTIVATIONS} activations, {kv} KV cache"
