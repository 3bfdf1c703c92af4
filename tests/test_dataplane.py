"""The data plane never waits for the model: a real zerolayerd with the engine thread held
inside a step (daemon/test_hooks.py), so "a step is running" is a fact of the test, not a
bet on the machine's speed. While it is held the I/O thread still reads every datagram,
answers PING, takes and acknowledges new requests, answers CANCEL at once, and refuses
admissions beyond `[engine] queue_depth` with OVERLOADED. An engine that dies fails every
request with INTERNAL and the daemon exits non-zero.
"""
from __future__ import annotations

import secrets
import signal
import socket
import threading
import time

import pytest

from daemon_proc import DaemonProc, Hooks
from zerolayer.client import Client
from zerolayer.protocol import wire
from zerolayer.protocol.errors import ErrorCode, InternalServerError, OverloadedError, UnknownKeyError

COUNT = "Count from one to one thousand: one, two, three,"


@pytest.fixture(scope="module")
def held_daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zl-dataplane")
    hooks = Hooks(tmp / "hooks")
    d = DaemonProc(tmp, "--engine-queue-depth", "1", "--cache-lease-s", "30",
                   env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    try:
        yield d, hooks
    finally:
        hooks.release()
        assert d.stop() == 0


def client(d: DaemonProc, **kw) -> Client:
    return Client(d.addr, d.key_id, d.secret, timeout=kw.pop("timeout", 60), **kw)


def _wait_idle(d: DaemonProc) -> None:
    d.wait_for(lambda: d.metric("zerolayer_requests_running") == 0
               and d.metric("zerolayer_requests_waiting") == 0, timeout=120, what="engine idle")


def test_ping_cancel_and_datagrams_are_served_while_a_step_runs(held_daemon):
    d, hooks = held_daemon
    s = client(d).stream(COUNT, max_tokens=400)
    it = iter(s)
    next(it)  # decoding
    hooks.hold(d)
    try:
        c = client(d, timeout=5)
        for _ in range(20):
            assert c.ping() > 0
        # a flood of datagrams is read (and counted) while the step is held, not left in
        # the socket buffer until it ends
        before = d.metric("zerolayer_ingress_datagrams_total")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _ in range(500):
                sock.sendto(secrets.token_bytes(64), d.addr)
        d.wait_for(lambda: d.metric("zerolayer_ingress_datagrams_total") >= before + 500,
                   timeout=30, what="datagrams read during the step")
        assert (hooks.dir / "held").exists()  # still inside the same held step
        r = s.cancel()  # answered by the I/O thread, the engine still held
        assert r is not None and r.finish_reason == "cancelled"
        assert r.usage.completion_tokens < 400
        assert (hooks.dir / "held").exists()
    finally:
        hooks.release()
    _wait_idle(d)
    d.wait_for(lambda: d.metric("zerolayer_kv_cache_usage_ratio") == 0.0, what="KV freed")


def test_a_request_is_acknowledged_while_a_step_runs_then_served(held_daemon):
    d, hooks = held_daemon
    first = client(d).stream(COUNT, max_tokens=300)
    it = iter(first)
    next(it)
    hooks.hold(d)
    try:
        late = client(d, timeout=120).stream("Say hello.", max_tokens=4)
        got: list[str] = []
        t = threading.Thread(target=lambda: got.extend(late))
        t.start()
        # accepted and queued on the I/O thread: the admissions counter moves while held
        d.wait_for(lambda: d.metric("zerolayer_requests_waiting") >= 1, timeout=30,
                   what="the new request admitted during the step")
        assert (hooks.dir / "held").exists() and not got
        first.cancel()
    finally:
        hooks.release()
    t.join(120)
    assert not t.is_alive()
    assert late.result.finish_reason in ("stop", "length") and late.result.text == "".join(got)
    assert late.result.attempts == 1  # the ACK came at once: no re-send was needed
    _wait_idle(d)


def test_a_removed_key_still_serves_the_requests_admitted_under_it(held_daemon):
    """Key rotation (PROTOCOL §6.1): key 8 is removed while its stream runs; that stream's
    control messages (RESEND, keepalive, CANCEL) still verify, new work under key 8 does not."""
    d, hooks = held_daemon
    secret8 = secrets.token_bytes(32)
    original = d.keys_file.read_text()
    ok0 = d.metric("zerolayer_key_reloads_total", 'result="ok"')
    d.keys_file.write_text(original + f"8 {secret8.hex()}\n")
    d.signal(signal.SIGHUP)
    d.wait_for(lambda: d.metric("zerolayer_key_reloads_total", 'result="ok"') > ok0,
               what="key 8 added")
    c8 = Client(d.addr, 8, secret8, timeout=30)
    s = c8.stream(COUNT, max_tokens=300)
    it = iter(s)
    next(it)
    hooks.hold(d)
    try:
        d.keys_file.write_text(original)  # key 8 removed
        d.signal(signal.SIGHUP)
        d.wait_for(lambda: d.metric("zerolayer_key_reloads_total", 'result="ok"') > ok0 + 1,
                   what="key 8 removed")
        with pytest.raises(UnknownKeyError):
            c8.invoke("Say hi.", max_tokens=2)
        s._send([c8.policy.control(wire.MsgType.RESEND, s.request_id, 0)])  # frames again, key 8
        r = s.cancel()
        assert r is not None and r.finish_reason == "cancelled"
    finally:
        hooks.release()
    _wait_idle(d)


def test_admissions_beyond_the_queue_depth_get_overloaded(held_daemon):
    """queue_depth 1 and the engine held: one request running (held), one queued in the
    hand-off, the next refused OVERLOADED at once, counted; nothing accepted is lost."""
    d, hooks = held_daemon
    full0 = d.metric("zerolayer_handoff_full_total", 'queue="admissions"')
    over0 = d.metric("zerolayer_request_errors_total", 'code="OVERLOADED"')
    a = client(d).stream(COUNT, max_tokens=200)
    ia = iter(a)
    next(ia)
    hooks.hold(d)
    try:
        results: dict[str, object] = {}
        b = client(d, timeout=120).stream("Say hello.", max_tokens=4)
        tb = threading.Thread(target=lambda: results.setdefault("b", "".join(b)))
        tb.start()
        d.wait_for(lambda: d.metric("zerolayer_requests_waiting") >= 1, timeout=30,
                   what="B queued in the hand-off")
        with pytest.raises(OverloadedError, match="admission queue full"):
            client(d, max_attempts=1, timeout=10).invoke("Say hi.", max_tokens=4)
        # on the wire: an admission refusal, outside any stream (docs/PROTOCOL.md §5.3)
        body = wire.encode_invoke_body(wire.SamplingParams(max_tokens=4), wire.PayloadKind.PROMPT,
                                       b"Say hi.")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for dg in wire.encode_invoke(d.key_id, d.secret, secrets.token_bytes(16),
                                         time.time_ns() // 1000, secrets.token_bytes(32), body):
                sock.sendto(dg, d.addr)
            sock.settimeout(10)
            f = wire.decode_response(sock.recv(2048), d.secret)
        assert isinstance(f, wire.ErrorFrame) and f.code == ErrorCode.OVERLOADED
        assert f.seq == wire.NO_SEQ and f.run_id == 0
        d.wait_for(lambda: d.metric("zerolayer_handoff_full_total", 'queue="admissions"')
                   >= full0 + 1, what="the full hand-off counted")
        assert d.metric("zerolayer_request_errors_total", 'code="OVERLOADED"') >= over0 + 1
        # and which bound was full: the hand-off to the engine thread
        d.wait_for(lambda: d.metric("zerolayer_overloaded_total", 'bound="admissions"')
                   >= 2, what="the bound counted")
        a.cancel()
    finally:
        hooks.release()
    tb.join(120)
    assert not tb.is_alive() and b.result.finish_reason in ("stop", "length")
    _wait_idle(d)


def test_sigterm_drains_in_flight_then_exits_zero(tmp_path):
    """SIGTERM while a step is held: new work gets DRAINING, the in-flight request still
    completes once the step goes on, and the daemon exits 0."""
    from zerolayer.protocol.errors import DrainingError
    hooks = Hooks(tmp_path / "hooks")
    d = DaemonProc(tmp_path, "--lifecycle-drain-linger-s", "600",
                   env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    try:
        s = client(d).stream("Count from one to ten: one, two,", max_tokens=12)
        it = iter(s)
        first = next(it)
        hooks.hold(d)
        d.signal()
        d.wait_for(lambda: any("draining" in line for line in d.log), what="draining")
        with pytest.raises(DrainingError):  # new work is refused while draining
            client(d, timeout=3, max_attempts=1).invoke("hi", max_tokens=2)
        assert d.proc.poll() is None  # still there: a request is in flight
        hooks.release()
        rest = "".join(it)  # the in-flight request completes
        assert s.result.finish_reason in ("length", "stop") and (first + rest) == s.result.text
        # lingering: a client that lost the tail still gets it with RESEND
        d.wait_for(lambda: any("drained" in line for line in d.log), what="linger")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(wire.encode_control(wire.MsgType.RESEND, d.key_id, d.secret,
                                            s.request_id, time.time_ns() // 1000,
                                            secrets.token_bytes(32), 0), d.addr)
            sock.settimeout(30)
            frames = [wire.decode_response(sock.recv(2048), d.secret)]
            while not isinstance(frames[-1], wire.DoneFrame):
                frames.append(wire.decode_response(sock.recv(2048), d.secret))
        assert "".join(f.text for f in frames if isinstance(f, wire.TokenFrame)) == s.result.text
        assert d.proc.poll() is None
        d.signal()  # a second SIGTERM ends the linger
        assert d.wait(60) == 0
    finally:
        hooks.release()
        d.stop()


def test_drain_timeout_cancels_with_an_error_never_silence(tmp_path):
    """The drain timeout passes while the step is held: the request ends with ERROR
    CANCELLED (drain), and the daemon still exits 0."""
    from zerolayer.protocol.errors import RequestCancelledError
    hooks = Hooks(tmp_path / "hooks")
    d = DaemonProc(tmp_path, "--lifecycle-drain-timeout-s", "0.5",
                   env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    try:
        s = client(d).stream(COUNT, max_tokens=400)
        it = iter(s)
        next(it)
        hooks.hold(d)
        d.signal()
        with pytest.raises(RequestCancelledError, match="drain"):
            for _ in it:
                pass
        hooks.release()  # the engine thread is joined on the way out
        assert d.wait(60) == 0
    finally:
        hooks.release()
        d.stop()


def test_engine_crash_fails_every_request_and_exits_non_zero(tmp_path):
    hooks = Hooks(tmp_path / "hooks")
    d = DaemonProc(tmp_path, env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    try:
        s = client(d).stream(COUNT, max_tokens=400)
        it = iter(s)
        next(it)
        hooks.hold(d)
        # INTERNAL is retryable before any text: this client retries, finds the daemon gone,
        # and after `timeout` of silence raises the INTERNAL it was given
        queued = client(d, timeout=5).stream("Say hello.", max_tokens=4)
        errs: list[BaseException] = []

        def drain_queued() -> None:
            try:
                list(queued)
            except BaseException as e:  # noqa: BLE001
                errs.append(e)

        t = threading.Thread(target=drain_queued)
        t.start()
        d.wait_for(lambda: d.metric("zerolayer_requests_waiting") >= 1, timeout=30,
                   what="a second request admitted")
        hooks.crash()
        hooks.release()
        with pytest.raises(InternalServerError, match="engine"):
            for _ in it:
                pass
        t.join(60)
        assert not t.is_alive()
        assert len(errs) == 1 and isinstance(errs[0], InternalServerError), (errs, queued.result, d.log)
        assert d.wait(60) == 1
        assert any("engine thread died" in line for line in d.log)
    finally:
        hooks.release()
        d.stop()


def test_no_hooks_without_the_variable(tmp_path, monkeypatch):
    """Production: with ZEROLAYER_TEST_HOOKS unset the hook is a no-op, whatever files exist."""
    monkeypatch.delenv("ZEROLAYER_TEST_HOOKS", raising=False)
    import importlib

    from zerolayer.daemon import test_hooks
    importlib.reload(test_hooks)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "crash").touch()
    assert test_hooks._DIR is None
    test_hooks.before_step()  # does not raise
