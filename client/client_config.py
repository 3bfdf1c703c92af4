"""What both clients are made of: the address and the retry policy (docs/PROTOCOL.md §8.6)."""
from __future__ import annotations

import threading

from zerolayer.protocol.wire import MAX_CHUNK, Mac

from .address import Address, parse_address
from .retry_policy import AuditHook, RetryPolicy


class ClientConfig:
    """The arguments Client and AsyncClient share.

    address: ("host", port), "host:port", "shm:///path/shm.sock" (same host), or a fleet: a
    list of addresses or "fleet://dns-name:port". key_id / secret: an entry of the daemon's
    keys file (secret as bytes or hex; only its HMAC key schedule is kept). timeout: the
    recovery window, seconds without any authenticated answer before a call fails;
    total_timeout: optional cap on a whole call; max_attempts: optional cap on INVOKE/PING
    attempts (None: as many as fit in the window); failover_after_s: a fleet node silent
    this long gives the request to the next one; xdp_tag: sign every request with the XDP tag
    too (docs/PROTOCOL.md §6.6; off only for a daemon older than the flag). The remaining
    knobs are the retry timers of docs/PROTOCOL.md §8.6.
    """

    def __init__(self, address: Address, key_id: int, secret: bytes | str,
                 timeout: float = 45.0, *, audit_log_hook: AuditHook | None = None,
                 max_attempts: int | None = None, ack_timeout_s: float = 0.2,
                 backoff_initial_s: float = 0.05, backoff_max_s: float = 2.0,
                 resend_interval_s: float = 0.03, probe_interval_s: float = 0.25,
                 contact_timeout_s: float = 2.0, total_timeout: float | None = None,
                 chunk_len: int = MAX_CHUNK,
                 pace_burst: int = 64, pace_gap_s: float = 0.0002,
                 failover_after_s: float = 1.0, xdp_tag: bool = True) -> None:
        if not 1 <= key_id <= 0xFFFFFFFF:
            raise ValueError("key_id must be in 1..2^32-1")
        raw = bytes.fromhex(secret) if isinstance(secret, str) else bytes(secret)
        self.policy = RetryPolicy(
            key_id=key_id, mac=Mac(raw), timeout=timeout, total_timeout=total_timeout,
            max_attempts=None if max_attempts is None else max(1, max_attempts),
            ack_timeout_s=ack_timeout_s, backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s, resend_interval_s=resend_interval_s,
            probe_interval_s=probe_interval_s, contact_timeout_s=contact_timeout_s,
            chunk_len=chunk_len, pace_burst=pace_burst, pace_gap_s=pace_gap_s,
            audit_log_hook=audit_log_hook, failover_after_s=failover_after_s, xdp_tag=xdp_tag)
        self.address = parse_address(address)[1]
        self._target = address
        self._lock = threading.Lock()   # the carrier's connector is made once, on first use

    @property
    def key_id(self) -> int:
        return self.policy.key_id

    @property
    def timeout(self) -> float:
        return self.policy.timeout

    def __repr__(self) -> str:  # never print the secret
        return f"{type(self).__name__}(address={self._target!r}, key_id={self.key_id})"
