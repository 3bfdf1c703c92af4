"""The SDK over a fleet: rendezvous hashing on the request id, every attempt
of a request to one node, failover only when that node is silent or DRAINING, one source
port per request, and a re-run on another node reported, never silent. Against three fake
daemons (tests/test_client.py's FakeDaemon: the real Ingress and ResultCache)."""
from __future__ import annotations

import asyncio
import secrets
import threading
import time

import pytest

from test_client import KEY_ID, SECRET, FakeDaemon, Script
from zerolayer.client import AsyncClient, Client
from zerolayer.client.fleet import node_name, rendezvous_order
from zerolayer.protocol.errors import ErrorCode


def _fleet(*scripts: Script) -> list[FakeDaemon]:
    return [FakeDaemon(s) for s in scripts]


def _client(ds: list[FakeDaemon], **kw: object) -> Client:
    opts: dict = dict(timeout=5.0, ack_timeout_s=0.05, backoff_initial_s=0.01,
                      backoff_max_s=0.2, probe_interval_s=0.05, contact_timeout_s=0.5,
                      failover_after_s=0.3)
    opts.update(kw)
    return Client([d.address for d in ds], KEY_ID, SECRET, **opts)


def _first(rid: bytes, ds: list[FakeDaemon]) -> FakeDaemon:
    first = rendezvous_order(rid, [d.address for d in ds])[0]
    return next(d for d in ds if d.address == first)


def test_rendezvous_order_is_stable_and_moves_only_a_removed_nodes_share() -> None:
    nodes = [("10.0.0.1", 7433), ("10.0.0.2", 7433), ("10.0.0.3", 7433)]
    ids = [secrets.token_bytes(16) for _ in range(3000)]
    firsts = [rendezvous_order(r, nodes)[0] for r in ids]
    assert firsts == [rendezvous_order(r, list(reversed(nodes)))[0] for r in ids]
    share = {n: firsts.count(n) / len(ids) for n in nodes}
    assert all(0.28 < s < 0.39 for s in share.values()), share
    # node 3 leaves: only its requests move, each to its own second choice
    two = nodes[:2]
    for r, f in zip(ids, firsts):
        after = rendezvous_order(r, two)[0]
        assert after == f if f != nodes[2] else after == rendezvous_order(r, nodes)[1]


def test_requests_spread_and_each_runs_on_its_own_first_node() -> None:
    ds = _fleet(Script(), Script(), Script())
    for d in ds:
        d.start()
    try:
        c = _client(ds)
        rids = [secrets.token_bytes(16) for _ in range(24)]
        results = [c.invoke(prompt="x", request_id=r) for r in rids]
        assert all(r.text == "Paris." and r.restarts == 0 for r in results)
        for r, res in zip(rids, results):
            d = _first(r, ds)
            assert res.node == node_name(d.address)
            assert any(i.request_id == r for i in d.invokes)
        assert all(d.runs > 0 for d in ds)          # all three used
        assert sum(d.runs for d in ds) == 24
        # a duplicate id goes to the same node, which replays it: no second run anywhere
        again = c.invoke(prompt="x", request_id=rids[0])
        assert again.node == results[0].node and sum(d.runs for d in ds) == 24
    finally:
        for d in ds:
            d.__exit__()


def test_all_attempts_of_a_request_share_one_source_port() -> None:
    # Two attempts are lost; the third is served. A 5-tuple-hashing balancer in front sees
    # one flow: every datagram of the request came from the same port.
    ds = _fleet(Script(drop_invokes=2), Script(drop_invokes=2))
    for d in ds:
        d.start()
    try:
        rid = secrets.token_bytes(16)
        d = _first(rid, ds)
        sources: list[tuple] = []
        real = d.on_invoke

        def on_invoke(r: object, addr: tuple) -> None:
            sources.append(addr)
            real(r, addr)                         # type: ignore[arg-type]
        d.on_invoke = on_invoke                   # type: ignore[method-assign]
        res = _client(ds, failover_after_s=10.0).invoke(prompt="x", request_id=rid)
        assert res.attempts == 3 and res.node == node_name(d.address)
        assert len({i.nonce for i in d.invokes}) == 3 and len(sources) == 3
        assert len(set(sources)) == 1
        other = _client(ds).invoke(prompt="x", request_id=rid)   # a replay, another client
        assert other.node == res.node
    finally:
        for d in ds:
            d.__exit__()


def test_a_silent_node_hands_its_requests_to_the_next_in_order() -> None:
    ds = _fleet(Script(), Script(), Script())
    for d in ds:
        d.start()
    try:
        dead = ds[0]
        dead.down.set()
        c = _client(ds)
        rids = [r for r in (secrets.token_bytes(16) for _ in range(200))
                if _first(r, ds) is dead][:4]
        for r in rids:
            res = c.invoke(prompt="x", request_id=r)
            second = rendezvous_order(r, [d.address for d in ds])[1]
            assert res.text == "Paris." and res.node == node_name(second)
            assert res.restarts == 0                # it had never run: nothing re-ran
        assert dead.runs == 0
    finally:
        for d in ds:
            d.__exit__()


def test_draining_moves_the_request_at_once() -> None:
    ds = _fleet(Script(error_code=ErrorCode.DRAINING, error_times=100), Script())
    for d in ds:
        d.start()
    try:
        rid = next(r for r in (secrets.token_bytes(16) for _ in range(100))
                   if _first(r, ds) is ds[0])
        t0 = time.monotonic()
        res = _client(ds, failover_after_s=30.0).invoke(prompt="x", request_id=rid)
        assert res.node == node_name(ds[1].address) and ds[0].runs == 0
        assert len([i for i in ds[0].invokes if i.request_id == rid]) == 1   # not retried there
        assert time.monotonic() - t0 < 30.0
    finally:
        for d in ds:
            d.__exit__()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_node_killed_mid_run_reruns_elsewhere_and_says_so(flavour: str) -> None:
    ds = _fleet(Script(chunks=["Par"], hold_done=True), Script())
    for d in ds:
        d.start()
    try:
        rid = next(r for r in (secrets.token_bytes(16) for _ in range(100))
                   if _first(r, ds) is ds[0])
        out: list[object] = []
        opts: dict = dict(timeout=5.0, ack_timeout_s=0.05, backoff_initial_s=0.01,
                          backoff_max_s=0.2, probe_interval_s=0.05, contact_timeout_s=0.5,
                          failover_after_s=0.3)
        addrs = [d.address for d in ds]
        if flavour == "sync":
            go = lambda: out.append(Client(addrs, KEY_ID, SECRET, **opts).invoke(  # noqa: E731
                prompt="x", request_id=rid))
        else:
            go = lambda: out.append(asyncio.run(AsyncClient(  # noqa: E731
                addrs, KEY_ID, SECRET, **opts).invoke(prompt="x", request_id=rid)))
        t = threading.Thread(target=go)
        t.start()
        while not ds[0].cache.running:           # accepted, "Par" sent, DONE held
            time.sleep(0.01)
        ds[0].down.set()                          # SIGKILL
        t.join(30)
        res = out[0]
        assert res.text == "Paris."               # type: ignore[attr-defined]
        assert res.restarts == 1                  # type: ignore[attr-defined]
        assert res.node == node_name(ds[1].address)  # type: ignore[attr-defined]
        assert ds[0].runs == 1 and ds[1].runs == 1
    finally:
        for d in ds:
            d.__exit__()


def test_a_dns_name_is_a_fleet_of_its_addresses() -> None:
    from zerolayer.client.fleet import parse_fleet
    nodes = parse_fleet("fleet://localhost:7433")
    assert nodes is not None and ("127.0.0.1", 7433) in nodes.current()
    assert parse_fleet(("127.0.0.1", 7433)) is None and parse_fleet("127.0.0.1:7433") is None
    with pytest.raises(ValueError):
        parse_fleet(["shm:///run/x.sock"])
