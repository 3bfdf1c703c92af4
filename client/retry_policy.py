"""The SDK's timers and signing identity (docs/PROTOCOL.md §8.6), and which frames it believes.

Nothing here reads a clock or draws randomness on its own behalf when a driver supplies
them: the request machine and the ping rule pass their `now`, wall-clock timestamp and
random generator in, so a test can run the whole retry schedule on a fake clock. The
defaults (`unix_us`, `SYSTEM_RANDOM`) are what a real driver passes.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from zerolayer.protocol.errors import ErrorCode, ZerolayerError
from zerolayer.protocol.wire import (
    MAX_CHUNK,
    NONCE_LEN,
    ErrorFrame,
    Mac,
    MsgType,
    Response,
    decode_response,
    encode_control,
)

AuditHook = Callable[[bytes, bytes, int], None]
WallClock = Callable[[], int]

# Nonces must be unpredictable to anyone without the key, so a real driver draws them (and
# request ids, and the backoff jitter) from the OS: os.urandom, as secrets.token_bytes does.
SYSTEM_RANDOM = random.SystemRandom()

# Pre-authentication errors the daemon can only send unsigned (it could not, or did not yet,
# verify us); any other unsigned frame is a spoof.
UNSIGNED_OK = frozenset({ErrorCode.UNKNOWN_KEY, ErrorCode.INVALID_SIGNATURE,
                         ErrorCode.MALFORMED})


def unix_us() -> int:
    """The signed timestamp: the daemon checks it against its own wall clock, so it is the
    system's wall clock, apart from the monotonic `now` that times the SDK's own timers."""
    return time.time_ns() // 1000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The SDK's timers (docs/PROTOCOL.md §8.6) and the identity that signs requests."""
    key_id: int
    mac: Mac
    timeout: float = 45.0
    total_timeout: float | None = None
    max_attempts: int | None = None
    ack_timeout_s: float = 0.2
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0
    resend_interval_s: float = 0.03
    probe_interval_s: float = 0.25
    contact_timeout_s: float = 2.0
    chunk_len: int = MAX_CHUNK
    pace_burst: int = 64
    pace_gap_s: float = 0.0002
    audit_log_hook: AuditHook | None = None
    failover_after_s: float = 1.0    # a fleet node silent this long: try the next one
    # Every request carries the XDP tag (docs/PROTOCOL.md §6.6), so a daemon's XDP program
    # can tell it from a forgery in the kernel. Off only to talk to a daemon older than it.
    xdp_tag: bool = True

    def may_retry(self, attempts: int) -> bool:
        """Whether another attempt may follow `attempts` sent (the window is the caller's)."""
        return self.max_attempts is None or attempts < self.max_attempts

    def ack_wait(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.ack_timeout_s * (2.0 ** attempt))

    def backoff(self, attempt: int, rng: random.Random = SYSTEM_RANDOM) -> float:
        base = min(self.backoff_max_s, self.backoff_initial_s * (2.0 ** attempt))
        return base * (0.5 + rng.random() / 2)   # jitter: no synchronised retry storms

    def pause_before(self, i: int) -> float:
        """Seconds to pause before sending fragment i of an attempt. Small requests go out
        at once; past the first burst, fragments are paced so a large request does not
        overrun the daemon's socket buffer in one blast (a lost fragment costs the whole
        request a retry: v1 has no per-fragment NACK)."""
        burst = self.pace_burst
        if i >= burst and i % (burst // 4 or 1) == 0 and self.pace_gap_s > 0:
            return self.pace_gap_s
        return 0.0

    def control(self, mt: MsgType, request_id: bytes, arg: int = 0, *,
                ts_us: int | None = None, rng: random.Random = SYSTEM_RANDOM) -> bytes:
        """A signed control datagram; a driver that keeps the time passes `ts_us`."""
        return encode_control(mt, self.key_id, self.mac, request_id,
                              unix_us() if ts_us is None else ts_us,
                              rng.randbytes(NONCE_LEN), arg, xdp_tag=self.xdp_tag)


def authenticate(datagram: bytes, mac: Mac, request_id: bytes) -> Response | None:
    """The datagram as a frame for this request, or None (forged, corrupted, foreign,
    or an unsigned error of a kind the daemon never sends unsigned)."""
    try:
        frame = decode_response(datagram, mac)
    except ZerolayerError:
        return None
    if frame.request_id != request_id:
        return None
    if isinstance(frame, ErrorFrame) and not frame.signed:
        try:
            if ErrorCode(frame.code) not in UNSIGNED_OK:
                return None
        except ValueError:
            return None
    return frame
