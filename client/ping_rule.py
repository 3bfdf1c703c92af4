"""Client.ping()'s rule, for both drivers, without I/O and without a clock of its own.

Attempts go out at the ack-wait intervals within the recovery window; a PONG ends it with
the round trip, a final error raises, a retryable one (signed) is remembered and raised if
nothing better follows. The driver passes `now` (monotonic seconds) to every call, and the
random generator and wall clock at construction, so the schedule can be checked on a fake
clock.
"""
from __future__ import annotations

import random

from zerolayer.protocol.errors import ERROR_INFO, ZerolayerError, ZerolayerTimeoutError, error_for
from zerolayer.protocol.wire import REQUEST_ID_LEN, ErrorFrame, MsgType, PongFrame

from .retry_policy import SYSTEM_RANDOM, RetryPolicy, WallClock, authenticate, unix_us


class PingAttempts:
    def __init__(self, policy: RetryPolicy, now: float, *, rng: random.Random = SYSTEM_RANDOM,
                 wall_us: WallClock = unix_us) -> None:
        self._p = policy
        self._rng = rng
        self._wall_us = wall_us
        self.request_id = rng.randbytes(REQUEST_ID_LEN)
        self._deadline = now + policy.timeout
        self._refusal: ZerolayerError | None = None
        self._attempt = 0
        self._sent = 0.0

    def next(self, now: float) -> tuple[bytes, float] | None:
        """The next PING to send and when to stop waiting for its answer; None: give up."""
        if not self._p.may_retry(self._attempt) or (self._attempt and now >= self._deadline):
            return None
        self._attempt += 1
        self._sent = now
        ping = self._p.control(MsgType.PING, self.request_id, ts_us=self._wall_us(),
                               rng=self._rng)
        return ping, min(self._deadline, now + self._p.ack_wait(self._attempt - 1))

    def receive(self, datagram: bytes, now: float) -> float | None:
        """The round trip in seconds if this is our PONG; raises a final error."""
        frame = authenticate(datagram, self._p.mac, self.request_id)
        if isinstance(frame, PongFrame):
            return now - self._sent
        if isinstance(frame, ErrorFrame):
            exc = error_for(frame.code, frame.message, request_id=self.request_id)
            assert exc.code is not None
            if not (frame.signed and ERROR_INFO[exc.code].retryable):
                raise exc
            self._refusal = exc
        return None

    def give_up(self) -> ZerolayerError:
        return self._refusal or ZerolayerTimeoutError("no PONG", request_id=self.request_id)
