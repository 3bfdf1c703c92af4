"""The asyncio SDK against a real zerolayerd serving the real model: the same answers as the
sync client, many streams on one event loop, a duplicate request id that attaches, and a
stream abandoned by a cancelled task that the daemon sees as CANCEL."""
from __future__ import annotations

import asyncio
import secrets

import pytest

from answers import FRANCE_ANSWER, FRANCE_QUESTION
from daemon_proc import DaemonProc
from zerolayer.client import AsyncClient, ChatMessage, Client
from zerolayer.protocol.errors import ContextOverflowError

FRANCE = [ChatMessage("user", FRANCE_QUESTION)]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = DaemonProc(tmp_path_factory.mktemp("zld_async"))
    yield d
    assert d.stop() == 0


def _async(d: DaemonProc) -> AsyncClient:
    return AsyncClient(d.addr, d.key_id, d.secret, timeout=60)


def test_async_invoke_and_stream_give_the_sync_answer(daemon):
    want = Client(daemon.addr, daemon.key_id, daemon.secret, timeout=60).invoke(
        messages=FRANCE, max_tokens=16)

    async def go():
        async with _async(daemon) as c:
            r = await c.invoke(messages=FRANCE, max_tokens=16)
            chunks = []
            async with await c.stream(messages=FRANCE, max_tokens=16) as s:
                async for chunk in s:
                    chunks.append(chunk)
            assert await c.ping() > 0
            return r, chunks, s.result

    r, chunks, streamed = asyncio.run(go())
    assert FRANCE_ANSWER in want.text
    assert r.text == want.text and "".join(chunks) == want.text
    assert streamed is not None and streamed.text == want.text
    assert r.finish_reason == want.finish_reason and r.usage.prompt_tokens == 37


def test_eight_streams_on_one_event_loop(daemon):
    async def one(c: AsyncClient, i: int) -> str:
        s = await c.stream(prompt=f"{i} + {i} =", max_tokens=8)
        return "".join([chunk async for chunk in s])

    async def go():
        async with _async(daemon) as c:
            return await asyncio.gather(*(one(c, i) for i in range(8)))

    texts = asyncio.run(go())
    assert len(texts) == 8 and all(t for t in texts)


def test_a_duplicate_request_id_attaches_across_both_clients(daemon):
    runs = daemon.metric("zerolayer_model_runs_total")
    rid = secrets.token_bytes(16)

    async def go():
        c = _async(daemon)
        return await asyncio.gather(*(c.invoke(messages=FRANCE, request_id=rid, max_tokens=12)
                                      for _ in range(2)))

    a, b = asyncio.run(go())
    c = Client(daemon.addr, daemon.key_id, daemon.secret, timeout=60).invoke(
        messages=FRANCE, request_id=rid, max_tokens=12)
    assert a.text == b.text == c.text
    assert daemon.metric("zerolayer_model_runs_total") == runs + 1


def test_a_cancelled_task_cancels_its_request(daemon):
    cancelled = daemon.metric("zerolayer_requests_total", 'outcome="cancelled"')

    async def go():
        c = _async(daemon)
        first = asyncio.Event()

        async def reader():
            async with await c.stream(prompt="Count from one to one thousand: one, two,",
                                      max_tokens=400) as s:
                async for _ in s:
                    first.set()

        task = asyncio.create_task(reader())
        await first.wait()
        task.cancel()                     # e.g. an HTTP client went away
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    daemon.wait_for(lambda: daemon.metric("zerolayer_requests_total", 'outcome="cancelled"')
                    == cancelled + 1, what="the request cancelled")
    daemon.wait_for(lambda: daemon.metric("zerolayer_kv_cache_usage_ratio") == 0.0,
                    what="KV freed")


def test_errors_raise_the_same_typed_exceptions(daemon):
    async def go():
        await _async(daemon).invoke(prompt="hello " * 600, max_tokens=2000)

    with pytest.raises(ContextOverflowError):
        asyncio.run(go())
