"""A ZeroMQ feed of request lifecycle events, for audit and tracing ([control] events).

One multipart message per event: the topic (`admitted`, `first_token`, `finished`, `failed`,
so a SUB socket can subscribe to a prefix) and a JSON object, version 1:
    {"v": 1, "event": "finished", "t": <unix time>, "key_id": 7, "request_id": "<hex>",
     "run_id": 12, ...}   finished: "finish_reason", "usage", "timings" (µs);
                          failed: "code", "message"
Refusals before admission (bad signatures, floods) are counted in metrics, not published:
an attacker must not be able to fill the feed.

Published from the I/O thread, never blocking it: an XPUB socket with XPUB_NODROP, sent
non-blocking, so a subscriber that reads too slowly fills its queue (`hwm` messages) and
each further event is dropped for everyone and counted (`dropped`,
zerolayer_lifecycle_events_dropped_total) instead of being lost silently or stalling the
data plane.
"""
from __future__ import annotations

import json
import os
import time

import zmq

from .json_value import JSONValue


class Publisher:
    def __init__(self, endpoint: str, hwm: int = 10_000, ctx: zmq.Context | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.XPUB_NODROP, 1)
        self.path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else ""
        if self.path and os.path.exists(self.path):
            os.unlink(self.path)
        old = os.umask(0o177)  # mode 0600, as the control socket: requests are private
        try:
            self.sock.bind(endpoint)
        finally:
            os.umask(old)
        self.published = 0
        self.dropped = 0

    def publish(self, event: str, **fields: JSONValue) -> None:
        body = {"v": 1, "event": event, "t": round(time.time(), 6), **fields}
        try:
            self.sock.send_multipart([event.encode(), json.dumps(body).encode()], zmq.NOBLOCK)
            self.published += 1
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self.sock.close(0)
        if self.path:
            try:
                os.unlink(self.path)
            except OSError:
                pass
