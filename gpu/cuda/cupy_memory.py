"""Device memory from CuPy's pool: a Numba EMM plugin (External Memory Management).

Every device allocation Numba makes for us (weights, KV pools, activation buffers, graph
inputs) is then a block of CuPy's default memory pool, so the daemon has one allocator and
one pool to account for and to hand back, and CuPy code (sampling, a future op written with
CuPy) shares memory with the Numba kernels without copies. The kernels still receive Numba
device arrays, so a launch costs what it always did (a CuPy array passed to a Numba kernel is
re-wrapped through ``__cuda_array_interface__`` at every launch).

Chosen with ``ZEROLAYER_CUDA_MEMORY``: ``cupy`` (default; falls back to Numba's allocator,
with the reason in ``MEMORY``, where CuPy is not installed) or ``numba``. The plugin must be
installed before the first CUDA context exists; _cuda_shim does it at import, which is
before any kernel module can create one. Nothing of it applies under the simulator.

Lifetime: a Numba MemoryPointer holds the CuPy block and returns it to the pool when Numba
lets go of it. CuPy may hand a returned block out again at once, before kernels queued on
another stream are done with it; every step here ends with a synchronous copy of its result
to the host, and the per-step inputs live in fixed buffers (staging.Staging), so no
block is returned while a kernel can still read it.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
from collections.abc import Callable

from numba import cuda

CHOICES = ("cupy", "numba")


def _release(holder: list) -> Callable[[], None]:
    def free():
        holder.clear()  # the last reference to the CuPy block: it goes back to the pool
    return free


class CupyPoolMemory(cuda.GetIpcHandleMixin, cuda.HostOnlyCUDAMemoryManager):
    """Numba's device allocations served by ``cupy.get_default_memory_pool()``. Host
    allocations (pinned and mapped memory) stay Numba's (HostOnlyCUDAMemoryManager)."""

    def initialize(self):
        # Numba calls this whenever it (re)enters the context: at every launch and most API
        # calls. Only the first call does anything (memGetInfo alone costs microseconds).
        if getattr(self, "_pool", None) is not None:
            return
        import cupy
        self._pool = cupy.get_default_memory_pool()
        self._runtime = cupy.cuda.runtime
        # as Numba's own manager does: pinned-host frees are batched up to a share of the
        # device's memory (otherwise each one flushes the queue)
        self.deallocations.memory_capacity = self.get_memory_info().total

    def memalloc(self, size):
        block = self._pool.malloc(size)
        return cuda.MemoryPointer(self.context, ctypes.c_void_p(int(block.ptr)), size,
                                  finalizer=_release([block]))

    def get_memory_info(self):
        free, total = self._runtime.memGetInfo()
        return cuda.MemoryInfo(free=free, total=total)

    def reset(self):
        super().reset()
        self._pool.free_all_blocks()

    @property
    def interface_version(self):
        return 1


def install() -> str:
    """Install the allocator ZEROLAYER_CUDA_MEMORY asks for; returns what is in use, in words."""
    want = os.environ.get("ZEROLAYER_CUDA_MEMORY", "cupy").strip().lower() or "cupy"
    if want not in CHOICES:
        return f"numba (ZEROLAYER_CUDA_MEMORY={want!r} is not one of {CHOICES})"
    if want == "numba":
        return "numba (ZEROLAYER_CUDA_MEMORY=numba)"
    if importlib.util.find_spec("cupy") is None:
        return "numba (cupy is not installed)"
    import cupy  # noqa: F401  (fails here, with a reason, rather than at context creation)
    cuda.set_memory_manager(CupyPoolMemory)
    return "cupy memory pool"


def pool_bytes() -> tuple[int, int] | None:
    """(used, held) bytes of CuPy's default pool, or None when CuPy isn't in use."""
    import sys
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    pool = cupy.get_default_memory_pool()
    return int(pool.used_bytes()), int(pool.total_bytes())
