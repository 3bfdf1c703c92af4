"""Hooks that make the engine fail on purpose, so that tests see how the daemon answers a
failure instead of waiting for a broken machine to show one. Off unless
$ZEROLAYER_TEST_HOOKS names a directory (the same one as test_hooks.py, which holds and
crashes the engine); then:

  fail-load  looked for once, after the model is loaded and warmed up (and in
             `zerolayerd --check`'s model check): the load raises, as a warm-up whose
             kernels fail to build or run would. The daemon must exit non-zero at once,
             naming the cause, and never say ready.
  hang-exit  looked for with fail-load: before failing, the load starts a non-daemon thread
             that never ends, as a driver or library thread might: the failed daemon must
             still exit at once (server._failed_start), not wait for it.
  fail-step  looked for inside every forward pass, where a device error would surface:
             while it exists the model's launch raises, the requests of that step fail
             with INTERNAL (in their streams), and the daemon serves on.

Nothing here runs in production: with the variable unset, `after_warmup` is a no-op and the
model is not wrapped.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

_DIR = os.environ.get("ZEROLAYER_TEST_HOOKS")


class EngineLoadHook(RuntimeError):
    """Raised by fail-load: stands for kernels that fail during the warm-up."""


class StepFailHook(RuntimeError):
    """Raised by fail-step: stands for a forward pass that fails on the device."""


def after_warmup(engine: int = 0) -> None:
    if _DIR is None or not (Path(_DIR) / "fail-load").exists():
        return
    if (Path(_DIR) / "hang-exit").exists():
        threading.Thread(target=threading.Event().wait, name="left-behind",
                         daemon=False).start()
    raise EngineLoadHook(f"test hook: the warm-up's kernels fail (engine {engine})")


def wrap_model(model) -> None:
    """With hooks on, this model instance's launch raises while `fail-step` exists."""
    if _DIR is None:
        return
    launch, flag = model.launch_tokens, Path(_DIR) / "fail-step"

    def launch_tokens(*args, **kw):
        if flag.exists():
            raise StepFailHook("test hook: the forward pass fails")
        return launch(*args, **kw)
    model.launch_tokens = launch_tokens
