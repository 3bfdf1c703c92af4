"""Drive an AsyncClient through the sync Client's interface, on a private event loop.

The client scenario tests (tests/test_client.py) are written once against the sync API; run
through this adapter they check that the asyncio client has the same reliability semantics
(both drive client/request_machine.py, but each has its own I/O driver).
"""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from zerolayer.client import AsyncClient, AsyncStream, InvokeResult

T = TypeVar("T")


class AsyncDriven:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client
        self._loop = asyncio.new_event_loop()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def invoke(self, *a: Any, **k: Any) -> InvokeResult:
        return self._run(self._c.invoke(*a, **k))

    def ping(self) -> float:
        return self._run(self._c.ping())

    def stream(self, *a: Any, **k: Any) -> DrivenStream:
        return DrivenStream(self._run(self._c.stream(*a, **k)), self)

    def __repr__(self) -> str:
        return repr(self._c)

    def __del__(self) -> None:
        if not self._loop.is_closed():
            self._loop.close()


class DrivenStream(Iterator[str]):
    def __init__(self, s: AsyncStream, driver: AsyncDriven) -> None:
        self._s = s
        self._d = driver

    @property
    def result(self) -> InvokeResult | None:
        return self._s.result

    def __next__(self) -> str:
        try:
            return self._d._run(self._s.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def cancel(self) -> InvokeResult | None:
        return self._d._run(self._s.cancel())

    def close(self) -> None:
        self._d._run(self._s.aclose())

    def __enter__(self) -> DrivenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
