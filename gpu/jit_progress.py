"""Progress of the first start's kernel compilation, for the operator: one line per kernel
that took a while to build, with a running count.

The first start in a fresh JIT cache compiles every Numba kernel (about a minute on the
development VM) and used to be silent all that time. Numba announces each compilation as a
"numba:compile" event (numba.core.event); a listener times them and reports those that took
at least `min_s` through the caller's `log`, so a start from a warm cache (each kernel loaded
in milliseconds) stays quiet. The daemon also tells systemd (EXTEND_TIMEOUT_USEC) while this
goes on.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from numba.core import event


class _CompileReporter(event.Listener):
    def __init__(self, log: Callable[[str], None], min_s: float, prefix: str):
        self.log = log
        self.min_s = min_s
        self.prefix = prefix
        self.started: dict[int, float] = {}
        self.done = 0
        self.slow = 0

    def on_start(self, ev: event.Event) -> None:
        self.started[id(ev.data.get("dispatcher"))] = time.perf_counter()

    def on_end(self, ev: event.Event) -> None:
        d = ev.data.get("dispatcher")
        t0 = self.started.pop(id(d), None)
        fn = getattr(d, "py_func", None)
        if t0 is None or fn is None or not getattr(fn, "__module__", "").startswith(self.prefix):
            return  # numba's own helpers, compiled inside ours: counted in our times
        self.done += 1
        took = time.perf_counter() - t0   # includes what it compiled inside
        if took >= self.min_s:
            self.slow += 1
            self.log(f"compiling kernels: {self.done} built, {fn.__module__.rsplit('.', 1)[-1]}."
                     f"{fn.__qualname__} took {took:.1f} s")


@contextmanager
def report_compiles(log: Callable[[str], None], min_s: float = 0.5,
                    prefix: str = "zerolayer.") -> Iterator[_CompileReporter]:
    """Report the kernels of modules under `prefix` that take >= min_s to build."""
    r = _CompileReporter(log, min_s, prefix)
    with event.install_listener("numba:compile", r):
        yield r
