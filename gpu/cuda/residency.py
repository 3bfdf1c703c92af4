"""Whether the fused step kernel's grid can be resident all at once, decided before the
first step rather than discovered by a barrier that waits forever.

The kernel's grid barrier (grid_sync.py) needs every block running at the same time. Three
things are checked when a model's fused kernel is set up on a device, and any of them
refuses it (the model then runs per op and says why in its kernel path):

  * the grid must fit: at most ``max_cooperative_grid_blocks`` (the occupancy the driver
    reports for this kernel and block size, times the multiprocessors);
  * one fused kernel per device: a second one (another engine of this daemon given the same
    device, or another process) would hold multiprocessors the first one's grid waits for.
    The claim is an exclusive ``flock`` on a file named by the device's UUID, so it holds
    across processes and within one (each claim opens its own file description), and the
    kernel releases it when the model goes away or the process dies;
  * the launch itself is cooperative (``cooperative_launch``): the driver then refuses a
    grid that cannot be co-resident instead of starting some blocks and not others.

Why not numba-cuda's ``cuda.cg.this_grid().sync()``: typing it needs a CUDA driver, so the
kernel could no longer be compiled to PTX where CI runs (tests/test_cuda_ptx.py, no GPU);
the cooperative launch gives the guarantee that matters (all blocks resident) with the
barrier CI can check. Under the simulator none of this applies: blocks run one after
another, and the kernel runs one stage per launch with no barrier at all.
"""
from __future__ import annotations

import fcntl
import os
import re
import tempfile

LOCK_DIR_ENV = "ZEROLAYER_LOCK_DIR"  # where the per-device claim files live (default: /tmp)


def grid_refusal(blocks: int, max_cooperative: int) -> str | None:
    """Why a grid of `blocks` cannot be co-resident, or None when it can."""
    if max_cooperative < 1:
        return "the kernel fits no block on a multiprocessor (max_cooperative_grid_blocks 0)"
    if blocks > max_cooperative:
        return (f"a grid of {blocks} blocks is over max_cooperative_grid_blocks "
                f"{max_cooperative}: not every block could be resident")
    return None


class DeviceClaim:
    """An exclusive claim of one device for a fused kernel, held while this object lives."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the file description drops its flock
            self.fd = -1

    def __del__(self) -> None:
        self.release()


def claim_device(device_key: str, lock_dir: str | None = None) -> DeviceClaim | str:
    """Claim the device for one fused kernel: a DeviceClaim, or why not (a string)."""
    d = lock_dir or os.environ.get(LOCK_DIR_ENV) or tempfile.gettempdir()
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device_key)
    path = os.path.join(d, f"zerolayer-fused-{safe}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return (f"another fused step kernel holds device {device_key} ({path}); two would "
                "wait on each other's multiprocessors")
    return DeviceClaim(fd, path)


def make_cooperative(overload: object) -> str | None:
    """Have numba-cuda launch this compiled kernel cooperatively (its launcher reads the
    ``cooperative`` flag it sets itself for kernels that use cooperative groups); why not,
    when this numba-cuda has no such flag."""
    if not hasattr(overload, "cooperative"):
        return f"this numba-cuda's kernels ({type(overload).__name__}) have no cooperative launch"
    overload.cooperative = True
    return None


def reserve(overloads: list, blocks: int, threads: int, device_key: str,
            lock_dir: str | None = None) -> DeviceClaim | str:
    """All three checks for a grid of `blocks` x `threads` of the given compiled kernels
    (every variant the model may launch): the device's claim, or why the fused kernel is
    refused. Nothing is claimed when the grid is refused."""
    if not overloads:
        return "no compiled fused kernel to launch"
    fits = min(int(ov.max_cooperative_grid_blocks(threads)) for ov in overloads)
    why = grid_refusal(blocks, fits)
    for ov in overloads:
        why = why or make_cooperative(ov)
    return why if why is not None else claim_device(device_key, lock_dir)
