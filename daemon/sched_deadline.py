"""SCHED_DEADLINE for the calling thread: a CPU budget at the highest priority.

Where the I/O thread shares its CPUs with an engine's kernel threads, a datagram that wakes
it waits for a CPU behind them: the scheduler lets a running thread finish its slice, often
until the next tick (4 ms at HZ=250). SCHED_FIFO removes that wait but also any bound: a
flood would keep the thread running and starve the engine. SCHED_DEADLINE gives both: the
thread runs ahead of every other as soon as it wakes, for at most `runtime` of each
`period`, after which it waits for the next period (the kernel's constant-bandwidth server).

Python has no binding for sched_setattr(2); this is the syscall through ctypes, x86-64 and
arm64 numbers. SCHED_FLAG_RESET_ON_FORK: threads and processes the thread starts later
run with normal scheduling (a deadline task may not fork otherwise). The kernel refuses it
(EPERM) without CAP_SYS_NICE, or for a thread whose affinity is narrower than its root
domain (an I/O thread pinned to one CPU of several: it has that CPU to itself anyway).
"""
from __future__ import annotations

import ctypes
import os
import platform

SCHED_DEADLINE = 6
SCHED_FLAG_RESET_ON_FORK = 0x01
_SYSCALL = {"x86_64": (314, 315), "aarch64": (274, 275)}


class _Attr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32),
                ("flags", ctypes.c_uint64), ("nice", ctypes.c_int32),
                ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64)]


def _calls() -> tuple[int, int]:
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise OSError(f"sched_setattr: no syscall number known for {platform.machine()}")
    return nr


def set_deadline(runtime_us: int, period_us: int) -> None:
    """This thread: SCHED_DEADLINE with `runtime_us` of every `period_us` (deadline = period).
    OSError with the kernel's reason when refused."""
    setattr_nr, _ = _calls()
    a = _Attr(ctypes.sizeof(_Attr), SCHED_DEADLINE, SCHED_FLAG_RESET_ON_FORK, 0, 0,
              runtime_us * 1000, period_us * 1000, period_us * 1000)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(setattr_nr, 0, ctypes.byref(a), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def policy_of(tid: int = 0) -> tuple[int, int, int]:
    """(policy, runtime ns, period ns) of a thread (0: this one), from sched_getattr(2)."""
    _, getattr_nr = _calls()
    a = _Attr()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(getattr_nr, tid, ctypes.byref(a), ctypes.sizeof(_Attr), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return a.policy, a.runtime, a.period
