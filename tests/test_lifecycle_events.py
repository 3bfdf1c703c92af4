"""The lifecycle event feed ([control] events, daemon/lifecycle_events.py): a real daemon's
admitted / first_token / finished / failed events, and a slow subscriber's overflow dropped
and counted, never blocking the publisher."""
from __future__ import annotations

import json

import zmq

from daemon_proc import DaemonProc
from zerolayer.client import Client
from zerolayer.daemon.lifecycle_events import Publisher
from zerolayer.protocol.errors import ContextOverflowError


def _events_of(sub: zmq.Socket, rid: bytes, n: int) -> list[dict]:
    """The next n events of one request (others, e.g. the warm-up's, are skipped)."""
    out = []
    while len(out) < n:
        assert sub.poll(30_000), out
        topic, body = sub.recv_multipart()
        ev = json.loads(body)
        assert ev["v"] == 1 and ev["event"] == topic.decode()
        if ev["request_id"] == rid.hex():
            out.append(ev)
    return out


def test_a_daemon_publishes_each_requests_lifecycle(tmp_path):
    path = tmp_path / "events.sock"
    d = DaemonProc(tmp_path, "--control-events", str(path))
    sub = zmq.Context.instance().socket(zmq.SUB)
    try:
        sub.connect(f"ipc://{path}")
        sub.subscribe(b"")
        c = Client(d.addr, d.key_id, d.secret, timeout=60)
        # a subscription takes a moment to reach the publisher: requests until the feed
        # carries one, then the requests under test, whose events are picked by their ids
        for _ in range(50):
            c.invoke("Say hello.", max_tokens=2)
            if sub.poll(2000):
                break
        r = c.invoke("Say hello.", max_tokens=4)
        evs = _events_of(sub, r.request_id, 3)
        assert [e["event"] for e in evs] == ["admitted", "first_token", "finished"]
        assert all(e["key_id"] == d.key_id for e in evs)
        fin = evs[-1]
        assert fin["finish_reason"] in ("stop", "length")
        assert fin["usage"]["completion_tokens"] == r.usage.completion_tokens
        assert fin["timings"]["total_us"] > 0 and evs[1]["ttft_s"] > 0
        rid = bytes(range(16))
        try:
            c.invoke("word " * 2500, max_tokens=8, request_id=rid)
        except ContextOverflowError:
            pass
        evs = _events_of(sub, rid, 2)
        assert [e["event"] for e in evs] == ["admitted", "failed"]
        assert evs[1]["code"] == "CONTEXT_OVERFLOW"
        d.wait_for(lambda: d.metric("zerolayer_lifecycle_events_total",
                                    'result="published"') >= 5, what="published counted")
    finally:
        sub.close(0)
        assert d.stop() == 0
    assert not path.exists()


def test_a_slow_subscriber_loses_events_counted_never_blocks_the_publisher():
    ctx = zmq.Context()
    pub = Publisher("inproc://lifecycle-test", hwm=10, ctx=ctx)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 10)
    sub.connect("inproc://lifecycle-test")
    sub.subscribe(b"")
    # the subscription reaches the XPUB as a message: read it, so that sends go to the SUB
    assert pub.sock.poll(5000) and pub.sock.recv() == b"\x01"
    for i in range(1000):                      # never read: its queues fill up
        pub.publish("finished", n=i)
    assert pub.published + pub.dropped == 1000
    assert 0 < pub.published <= 100 and pub.dropped >= 900
    got = 0
    while sub.poll(100):
        sub.recv_multipart()
        got += 1
    assert got == pub.published                # what was published arrived, in full
    pub.publish("finished", n=1000)            # and the feed flows again once read
    assert pub.published == got + 1
    sub.close(0)
    pub.close()
    ctx.term()
