"""Hooks that let tests put the engine thread in a known state, instead of hoping a step is
slow (or fast) enough on the machine at hand. Off unless $ZEROLAYER_TEST_HOOKS names a
directory; then, before every step, the engine thread looks in it for:

  hold    while this file exists the step waits (holding no GIL, like a long forward
          pass); the thread creates `held` while it waits, so a test knows it is there;
  crash   the engine thread raises, outside any one request's handling (a bug in the
          engine itself): the daemon must fail every request with INTERNAL and exit non-zero.

With several engines ([[engines]]), `hold` and `crash` apply to every engine, and
`hold-<i>` / `crash-<i>` to engine i alone (0-based, in the configuration's order); engine
i creates `held-<i>` while it waits (engine 0 also `held`, the single engine's old name).

and, once, before it loads the model:

  hold-load  while this file exists the load waits (creating `load-held`): the daemon is
             WARMING for as long as the test needs (its /readyz, its systemd messages).

and, from the I/O thread's systemd watchdog, each time a WATCHDOG=1 falls due while the engine
has not turned for longer than the watchdog allows:

  watchdog-withheld  rewritten as "<pings sent so far> <pings withheld in a row>": a test
                     waits for the watchdog to withhold a ping instead of sleeping through
                     a silence and hoping it was long enough.

Nothing here runs in production: with the variable unset, every hook is a no-op.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

_DIR = os.environ.get("ZEROLAYER_TEST_HOOKS")
POLL_S = 0.002


class EngineCrashHook(RuntimeError):
    """Raised by the crash hook: stands for any bug that escapes the engine's step."""


def before_load() -> None:
    if _DIR is not None:
        _hold_while(Path(_DIR), "hold-load", "load-held")


def before_step(engine: int = 0) -> None:
    if _DIR is None:
        return
    d = Path(_DIR)
    if (d / "crash").exists() or (d / f"crash-{engine}").exists():
        raise EngineCrashHook(f"test hook: the engine thread crashes (engine {engine})")
    _hold_while(d, ("hold", f"hold-{engine}"),
                (f"held-{engine}",) + (("held",) if engine == 0 else ()))


def _hold_while(d: Path, hold: str | tuple[str, ...], held: str | tuple[str, ...]) -> None:
    """Wait while a `hold` file exists, with the `held` files there meanwhile so the test
    knows."""
    holds = (hold,) if isinstance(hold, str) else hold
    marks = [d / m for m in ((held,) if isinstance(held, str) else held)]
    if any((d / h).exists() for h in holds):
        for mark in marks:
            mark.touch()
        try:
            while any((d / h).exists() for h in holds):
                time.sleep(POLL_S)
        finally:
            for mark in marks:
                mark.unlink(missing_ok=True)


def watchdog_withheld(pings: int, in_a_row: int) -> None:
    if _DIR is not None:
        d = Path(_DIR)
        tmp = d / "watchdog-withheld.tmp"
        tmp.write_text(f"{pings} {in_a_row}\n")
        tmp.replace(d / "watchdog-withheld")   # a reader never sees half a line
