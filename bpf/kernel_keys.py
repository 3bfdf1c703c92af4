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
moment is a part of. A key id the new set lacks but a running request was admitted under
stays, retired (only its CANCEL and RESEND pass, as the daemon honours only those), until
that request ends; refresh_clock() then removes it within a second. When the map cannot hold
the union (ZL_MAX_KEYS), prepare turns the unknown-key check off first (unknown key ids then
go to the daemon, which decides), and commit turns it back on once the new set fits.

    kk = KernelKeys(prog, skew_s=300.0)
    kk.publish({1: derived_key_1, 2: derived_key_2})   # at start: all keys, checks on
    kk.refresh_clock()                                  # every second: the wall-clock offset
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from .loader import AUTH_KEYS, AUTH_REQUIRE_TAG, InvokeSteer, wall_clock_offset_ns

# Added to the daemon's skew in the kernel's window: the published offset may be up to a
# refresh old, and the wall clock may have been stepped since. The kernel is then a little
# more lenient than the daemon, never stricter (what it lets through, the daemon refuses).
CLOCK_MARGIN_S = 2.0
CLOCK_REFRESH_S = 1.0


class KernelKeys:
    """The kernel's copy. `running`: key id -> the XDP tag keys of requests still running under
    it (the daemon's in-flight table); a key id the keys file lost stays in the kernel,
    retired, while one of them runs (docs/PROTOCOL.md §6.1, bpf/invoke_auth.h)."""

    def __init__(self, prog: InvokeSteer, *, skew_s: float, require_tag: bool = False,
                 clock_margin_s: float = CLOCK_MARGIN_S,
                 running: Callable[[], Mapping[int, Sequence[bytes]]] | None = None) -> None:
        self.prog = prog
        self.skew_us = int((skew_s + clock_margin_s) * 1e6)
        self.require_tag = require_tag
        self.capacity = prog.defines.get("ZL_MAX_KEYS", 0)
        self.running = running or dict
        self._keys: dict[int, bytes] = {}     # what the kernel holds as current keys
        self._retired: dict[int, bytes] = {}  # ... and as retired ones
        self._check_keys = False
        self._last_clock = 0.0
        self.published = 0                    # clock offsets published (observability)

    # ---- the whole set ------------------------------------------------------------------------
    def publish(self, keys: Mapping[int, bytes]) -> None:
        """Make the kernel hold exactly `keys` (key id -> 16-byte XDP tag key), and the keys of
        requests still running under ids it lacks, and turn the checks on; for a fresh
        program, or to repair a copy that drifted."""
        self.prepare(keys)
        self.commit(keys)

    def prepare(self, new: Mapping[int, bytes]) -> None:
        """Before the daemon switches to `new`: the kernel accepts the old and the new set."""
        union = set(self._keys) | set(self._retired) | set(new)
        if len(union) > self.capacity and self._check_keys:
            self._set_auth(check_keys=False)
        held = len(self.prog.tag_keys())
        for kid, key in new.items():
            old = self._keys.get(kid, self._retired.get(kid))
            if old == key and kid in self._keys:
                continue
            if kid not in self._keys and kid not in self._retired:
                if held >= self.capacity:
                    continue   # no room: unknown key ids go to the daemon (checks are off)
                held += 1
            self.prog.set_tag_key(kid, key, prev=old if old != key else None)

    def commit(self, new: Mapping[int, bytes]) -> None:
        """After the daemon switched to `new`: the kernel holds `new`, and retired the ids
        that only running requests still use."""
        running = {kid: list(keys)[:2] for kid, keys in self.running().items()
                   if kid not in new and keys}
        for kid in (set(self._keys) | set(self._retired)) - set(new) - set(running):
            self.prog.delete_tag_key(kid)
        held = self.prog.tag_keys()
        for kid, key in new.items():
            if kid not in held and len(held) < self.capacity:
                self.prog.set_tag_key(kid, key)
                held[kid] = (key, None)
            elif kid in held and held[kid] != (key, None) or kid in self._retired:
                self.prog.set_tag_key(kid, key)   # the old key of a changed secret goes
        retired: dict[int, bytes] = {}
        for kid, keys in running.items():
            if kid in held or len(held) < self.capacity:
                # a running request's CANCEL/RESEND verify under its own key (two at most:
                # a secret replaced, then the id removed, while both requests ran)
                self.prog.set_tag_key(kid, keys[0], prev=keys[1] if len(keys) > 1 else None,
                                      retired=True)
                held[kid] = (keys[0], None)
                retired[kid] = keys[0]
        self._keys = {kid: key for kid, key in new.items() if kid in held}
        self._retired = retired
        self._set_auth(check_keys=len(self._keys) == len(new) and len(retired) == len(running))

    def prune(self) -> int:
        """Forget retired ids no running request uses any more; how many went."""
        running = self.running()
        gone = [kid for kid in self._retired if not running.get(kid)]
        for kid in gone:
            self.prog.delete_tag_key(kid)
            del self._retired[kid]
        return len(gone)

    # ---- the clock ----------------------------------------------------------------------------
    def refresh_clock(self, now: float | None = None) -> bool:
        """Publish the wall-clock offset again if CLOCK_REFRESH_S passed, and forget retired
        ids whose last request ended; True if it did."""
        now = time.monotonic() if now is None else now
        if now - self._last_clock < CLOCK_REFRESH_S:
            return False
        if self._retired:
            self.prune()
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
