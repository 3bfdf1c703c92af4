"""The kernel's copy of what it needs of the daemon's keys: zl_keys (key id -> XDP tag key)
and zl_auth_cfg (which checks are on, the timestamp window, the wall-clock offset).

The daemon's key set is the authority; this keeps the kernel's copy in step with it so that
no datagram the daemon would accept is ever dropped in the kernel, also while keys rotate. A
rotation is two steps around the daemon's own switch (KeyStore.reload):

    prepare(new)   before the daemon switches: every new key id is added, and a key id whose
                   secret changes verifies under its old and its new key;
    (the daemon swaps its key set)
    commit(new)    after: key ids the new set lacks are removed, and the old keys forgotten.

Between the steps the kernel accepts the union of both sets, which each side's view at any
moment is a part of. When the map cannot hold the union (ZL_MAX_KEYS), prepare turns the
unknown-key check off first (unknown key ids then go to the daemon, which decides), and
commit turns it back on once the new set fits.

    kk = KernelKeys(prog, skew_s=300.0)
    kk.publish({1: derived_key_1, 2: derived_key_2})   # at start: all keys, checks on
    kk.refresh_clock()                                  # every second: the wall-clock offset
"""
from __future__ import annotations

import time
from collections.abc import Mapping

from .loader import AUTH_KEYS, AUTH_REQUIRE_TAG, InvokeSteer, wall_clock_offset_ns

# Added to the daemon's skew in the kernel's window: the published offset may be up to a
# refresh old, and the wall clock may have been stepped since. The kernel is then a little
# more lenient than the daemon, never stricter (what it lets through, the daemon refuses).
CLOCK_MARGIN_S = 2.0
CLOCK_REFRESH_S = 1.0


class KernelKeys:
    def __init__(self, prog: InvokeSteer, *, skew_s: float, require_tag: bool = False,
                 clock_margin_s: float = CLOCK_MARGIN_S) -> None:
        self.prog = prog
        self.skew_us = int((skew_s + clock_margin_s) * 1e6)
        self.require_tag = require_tag
        self.capacity = prog.defines.get("ZL_MAX_KEYS", 0)
        self._keys: dict[int, bytes] = {}     # what the kernel holds as current keys
        self._check_keys = False
        self._last_clock = 0.0
        self.published = 0                    # clock offsets published (observability)

    # ---- the whole set ------------------------------------------------------------------------
    def publish(self, keys: Mapping[int, bytes]) -> None:
        """Make the kernel hold exactly `keys` (key id -> 16-byte XDP tag key) and turn the
        checks on; for a fresh program, or to repair a copy that drifted."""
        self.prepare(keys)
        self.commit(keys)

    def prepare(self, new: Mapping[int, bytes]) -> None:
        """Before the daemon switches to `new`: the kernel accepts the old and the new set."""
        union = set(self._keys) | set(new)
        if len(union) > self.capacity and self._check_keys:
            self._set_auth(check_keys=False)
        held = len(self.prog.tag_keys())
        for kid, key in new.items():
            old = self._keys.get(kid)
            if old == key:
                continue
            if old is None:
                if held >= self.capacity:
                    continue   # no room: unknown key ids go to the daemon (checks are off)
                held += 1
            self.prog.set_tag_key(kid, key, prev=old)

    def commit(self, new: Mapping[int, bytes]) -> None:
        """After the daemon switched to `new`: the kernel holds `new` only."""
        for kid in set(self._keys) - set(new):
            self.prog.delete_tag_key(kid)
        held = self.prog.tag_keys()
        for kid, key in new.items():
            if kid not in held and len(held) < self.capacity:
                self.prog.set_tag_key(kid, key)
                held[kid] = (key, None)
            elif kid in held and held[kid] != (key, None):
                self.prog.set_tag_key(kid, key)   # the old key of a changed secret goes
        self._keys = {kid: key for kid, key in new.items() if kid in held}
        self._set_auth(check_keys=len(self._keys) == len(new))

    # ---- the clock ----------------------------------------------------------------------------
    def refresh_clock(self, now: float | None = None) -> bool:
        """Publish the wall-clock offset again if CLOCK_REFRESH_S passed; True if it did."""
        now = time.monotonic() if now is None else now
        if now - self._last_clock < CLOCK_REFRESH_S:
            return False
        self._set_auth(self._check_keys)
        return True

    def _set_auth(self, check_keys: bool) -> None:
        self._check_keys = check_keys
        flags = (AUTH_KEYS if check_keys else 0) | (AUTH_REQUIRE_TAG if self.require_tag else 0)
        self.prog.set_auth(flags, self.skew_us, wall_clock_offset_ns())
        self._last_clock = time.monotonic()
        self.published += 1

    @property
    def checks_keys(self) -> bool:
        return self._check_keys
