"""A grid-wide barrier for a persistent kernel: every block of the grid waits at
``grid_sync`` until all blocks have arrived, so one launch can run the stages of a forward
pass that depend on each other (the QKV rows one stage writes are read by every block of the
next).

The state is three int32 words in device memory, ``bar``:

    bar[0]  arrivals at the current barrier (0 between barriers)
    bar[1]  generation: incremented once per completed barrier
    bar[2]  error flag: set when a block waited too long (see below)

Invariant: a block reads the generation *before* it arrives, and the last block to arrive
resets the arrivals *before* it increments the generation. So a block that leaves a barrier
(it saw the generation move) and arrives at the next one counts from zero, never into the
previous barrier's count; and no block can see the generation move before every block has
arrived, because only the last arrival moves it. Arrivals and the generation are read with
atomics (never from a cache), and every thread fences after the wait, so writes made before
the barrier by any block are visible to loads after it.

The barrier needs every block of the grid resident at once: a block that is not yet running
can never arrive. The launcher sizes the grid to one block per multiprocessor, checks it
against ``max_cooperative_grid_blocks``, launches it cooperatively (the driver then refuses
a grid that cannot be resident) and claims the device for one fused kernel
(gpu/cuda/residency.py). Should a block still wait too long, it gives up after
``SPIN_LIMIT`` polls and sets the error flag, which nothing clears: every later barrier, of
this launch and of any launch after it, passes at once and computes garbage, and the host,
which reads a copy of the flag after each step (step_launch.BarrierCheck), discards those
steps and stops using the fused kernel. A hang is never the outcome.

Where a stage reads only part of what the stage before it wrote, a grid barrier waits for
more than it needs: ``wait_at_least`` instead waits for a ready counter that the writers of
just those rows increment after a fence (the per-tile counters of published megakernels).
It gives up as the barrier does, after ``SPIN_LIMIT`` polls, setting the same sticky flag,
and passes at once once the flag is set.

Under the simulator blocks run one after another, so no barrier could ever complete: there,
the launcher runs a persistent kernel one stage per launch and the launch boundary is the
barrier; ``grid_sync`` is never reached between stages, and a counter is always complete
when it is waited for. One that is not would be a kernel bug, so there a wait gives up at
the first poll (``WAIT_SPIN_LIMIT``) and the step fails its check instead of spinning.
"""
from __future__ import annotations

import numpy as np

from ._cuda_shim import SIM, cuda, device, kernel

SPIN_LIMIT = 1 << 24  # polls of the generation before a block gives up (seconds, not ms)
WAIT_SPIN_LIMIT = 0 if SIM else SPIN_LIMIT  # polls of a ready counter (see above)
WORDS = 4              # int32 words of barrier state (one spare)


@device
def grid_sync(bar, tid):
    """Wait until every block of the grid has called this; all threads of each block call it."""
    cuda.syncthreads()
    if tid == 0:
        nblocks = cuda.gridDim.x
        gen = cuda.atomic.add(bar, 1, 0)
        cuda.threadfence()  # this block's writes, before its arrival is seen
        if cuda.atomic.add(bar, 0, 1) == nblocks - 1:
            cuda.atomic.exch(bar, 0, 0)
            cuda.threadfence()
            cuda.atomic.add(bar, 1, 1)
        else:
            spins = 0
            while cuda.atomic.add(bar, 1, 0) == gen:
                if cuda.atomic.add(bar, 2, 0) != 0:
                    break
                spins += 1
                if spins > SPIN_LIMIT:
                    cuda.atomic.max(bar, 2, 1)
                    break
    cuda.syncthreads()
    cuda.threadfence()  # other blocks' writes, before this block's next loads


@device
def wait_at_least(ctr, i0, i1, want, bar, tid):
    """Wait until ctr[i] >= want for every i in [i0, i1); all threads of the block call it.
    The writers fence their writes before they count, and every thread fences after the
    wait, so what they wrote before counting is visible to this block's loads after it."""
    cuda.syncthreads()  # type: ignore[call-arg]  # numba stubs: an intrinsic
    if tid == 0:
        spins = 0
        for i in range(i0, i1):
            while cuda.atomic.add(ctr, i, 0) < want:
                if cuda.atomic.add(bar, 2, 0) != 0:
                    break
                spins += 1
                if spins > WAIT_SPIN_LIMIT:
                    cuda.atomic.max(bar, 2, 1)
                    break
    cuda.syncthreads()
    cuda.threadfence()


@device
def count_ready(ctr, i, tid):
    """Count one more producer done at ctr[i], after this block's writes (all threads call
    it, after their last write)."""
    cuda.threadfence()
    cuda.syncthreads()  # type: ignore[call-arg]  # numba stubs: an intrinsic
    if tid == 0:
        cuda.atomic.add(ctr, i, 1)


def new_state():
    """Fresh barrier state on the device (zeros)."""
    return cuda.to_device(np.zeros(WORDS, np.int32))


@kernel(["void(int32[::1], int32[::1], int32[::1])"], name="grid_sync.selftest")
def selftest(bar, ids, out):
    """Each block writes its id, waits at the barrier, then sums every block's id: out[b] is
    n(n-1)/2 for every block b only if the barrier held (bench/gpu_bench.py's grid_barrier
    section runs it, launched cooperatively as the step kernel is)."""
    tid = cuda.threadIdx.x
    b = cuda.blockIdx.x
    if tid == 0:
        ids[b] = b
    grid_sync(bar, tid)
    if tid == 0:
        s = 0
        for i in range(cuda.gridDim.x):
            s += ids[i]
        out[b] = s
