"""The one record of in-flight work, on the I/O thread: every request handed to an engine
whose last frame is not yet sent, and what follows from that set.

Three questions used to be answered from three places kept in step by hand: which request
runs under a (key id, request id) (a live map, and a handle on the result cache's entry),
and how many requests each engine holds (a counter per engine). Here they are one set:
`admit` and `close` are the only writers, each engine's load is counted in the same
statements that add and remove, so no view can disagree with another.

`close` finishes the request's result-cache entry too: the entry stops being RUNNING in the
same call that takes the request out of the set, so "running in the cache" and "in flight
here" are the same fact. (An entry is RUNNING a little earlier than this: from the cache's
`start`, which gives the run id, to the routing decision; a request refused there is
finished uncacheable and never enters.)
"""
from __future__ import annotations

from collections.abc import Iterator

from .request import Admitted, Request
from .result_cache import CacheKey, ResultCache


class InFlight:
    def __init__(self, cache: ResultCache, n_engines: int) -> None:
        self.cache = cache
        self._by_key: dict[CacheKey, Request] = {}
        self._per_engine = [0] * n_engines
        # Body bytes ever handed to the engines; what is still queued is this minus what the
        # engine threads have taken (memory_bounds.buffers).
        self.admitted_bytes = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[Request]:
        """A copy: closing requests while iterating is the common case (drain, death)."""
        return iter(list(self._by_key.values()))

    def get(self, key: CacheKey) -> Request | None:
        return self._by_key.get(key)

    def record(self, req: Admitted) -> Request | None:
        """The I/O side's record of the request an engine's event names; None once it is
        closed (its last frame sent), and for an earlier run under the same key."""
        r = self._by_key.get(req.key)
        return r if r is not None and r.admitted is req else None

    def load(self) -> list[int]:
        """Requests held by each engine: handed to it, not yet closed (routing.py's load)."""
        return list(self._per_engine)

    def on_engine(self, index: int) -> int:
        return self._per_engine[index]

    def of_engine(self, index: int) -> list[Request]:
        return [r for r in self._by_key.values() if r.engine == index]

    def admit(self, req: Request) -> None:
        """The request was handed to engine `req.engine`."""
        self._by_key[req.key] = req
        self._per_engine[req.engine] += 1
        self.admitted_bytes += req.admitted.body_bytes

    def close(self, req: Request, cacheable: bool) -> None:
        """Its last frame (DONE or ERROR) is stored: no longer in flight, its cache entry
        finished (kept for replay when `cacheable`)."""
        req.closed = True
        self.cache.finish(req.key, cacheable=cacheable)
        if self._by_key.pop(req.key, None) is not None:
            self._per_engine[req.engine] -= 1
