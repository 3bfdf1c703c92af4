"""The edge's side of the signed protocol: one AsyncClient per key id, and the health probe.

Secrets come from the daemon's own keys file (read with the daemon's loader, so both parse
it the same way and the edge refuses the same unsafe modes). Each bearer token maps to a key
id; requests are signed with that key, so the daemon's per-key limits, logs and rotation
apply to HTTP callers exactly as to SDK callers.
"""
from __future__ import annotations

import time

import anyio

from zerolayer.client import AsyncClient
from zerolayer.daemon.auth import load_keys

from .config import EdgeConfig
from .tokens import TokenFileError, TokenTable


class Backend:
    def __init__(self, cfg: EdgeConfig, tokens: TokenTable) -> None:
        keys = load_keys(cfg.keys)          # raises KeyFileError: fatal at start
        missing = sorted(tokens.key_ids() - set(keys))
        if missing:
            raise TokenFileError(f"{cfg.tokens}: key id(s) {missing} are not in {cfg.keys}")
        self.cfg = cfg
        # Only the key ids some token uses: a secret no token can reach is not held.
        self._clients = {kid: AsyncClient(cfg.daemon, kid, keys[kid],
                                          timeout=cfg.daemon_timeout_s,
                                          max_attempts=cfg.max_attempts)
                         for kid in sorted(tokens.key_ids())}

    def client(self, key_id: int) -> AsyncClient:
        return self._clients[key_id]

    async def ping(self) -> float:
        """The daemon's PING round trip in seconds (any of our keys: PING is authenticated).
        Raises TimeoutError past cfg.health_timeout_s, ZerolayerError if refused."""
        c = next(iter(self._clients.values()))
        t0 = time.monotonic()
        with anyio.fail_after(self.cfg.health_timeout_s):
            await c.ping()
        return time.monotonic() - t0

    async def aclose(self) -> None:
        for c in self._clients.values():
            await c.aclose()
