"""The same-host shared-memory carrier: the ring (protocol/shm_ring.py) on its own, then a real
zerolayerd with [shm] on (one daemon for the module): PING, invoke and stream through the
SDK (sync and asyncio); a request id shared with the UDP path (idempotency is global);
clients that die, write garbage, or take a dead client's slot; SO_PEERCRED; max_clients.

Nothing here waits on the clock for synchronisation: a test waits for an event (a frame, a
socket's EOF, a metric reaching a value, the engine held by daemon/test_hooks.py), with a
generous timeout that only bounds a failure.
"""
from __future__ import annotations

import asyncio
import os
import random
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from daemon_proc import DaemonProc, Hooks
from zerolayer.client import AsyncClient, Client
from zerolayer.client.invoke_body import build_invoke_body
from zerolayer.client.shm_transport import ShmConnector, ShmRefusedError, ShmSession
from zerolayer.protocol import shm_ring
from zerolayer.protocol.shm_ring import (
    HELLO,
    STATUS_FULL,
    STATUS_REFUSED_PEER,
    Region,
    Ring,
    RingCorrupt,
    unpack_hello,
)
from zerolayer.protocol.wire import (
    AckFrame,
    DoneFrame,
    MsgType,
    PongFrame,
    RunState,
    TokenFrame,
    decode_response,
    encode_control,
    encode_invoke,
)

COUNT = "Count from one to one thousand: one, two, three,"
REFUSED_UID = 4243


# -- the ring alone ---------------------------------------------------------------------------

def _pair(cap: int = 4096) -> tuple[Region, Ring, Ring]:
    """A region, and the request ring seen by both sides over two mappings of one memfd."""
    region, fd = Region.create(cap, cap)
    other = Region(fd, cap, cap)
    os.close(fd)
    return region, region.requests, other.requests


def test_ring_wraps_around_and_keeps_every_record() -> None:
    region, prod, cons = _pair(4096)
    rng = random.Random(1)
    sent: list[bytes] = []
    got: list[bytes] = []
    for _ in range(3000):          # many times around a 4 KiB ring, records of every size
        rec = rng.randbytes(rng.randint(1, shm_ring.MAX_RECORD))
        if prod.push(rec):
            sent.append(rec)
        else:                      # full: the consumer catches up, then it fits
            got += cons.pop_batch(1 << 20)
            assert prod.push(rec)
            sent.append(rec)
        if rng.random() < 0.3:
            got += cons.pop_batch(rng.randint(1, 4))
    got += cons.pop_batch(1 << 20)
    assert got == sent
    head, tail = cons.counters()
    assert head == tail > 4096 * 100
    assert cons.pop_batch(10) == []


def test_full_ring_refuses_then_has_room_again() -> None:
    _, prod, cons = _pair(4096)
    rec = b"x" * 100                                   # 104 bytes with its length, padded
    n = 0
    while prod.push(rec):
        n += 1
    assert n == 4096 // shm_ring.record_size(100)
    assert not prod.push(rec)                          # still full: lost, like UDP
    assert prod.push(b"y" * (4096 - n * 104 - 4))      # exactly what is left fits
    assert not prod.push(b"y")
    assert cons.pop_batch(n)[-1] == rec
    assert cons.pop_batch(1) == [b"y" * (4096 - n * 104 - 4)]
    assert prod.push(rec)
    assert cons.pop_batch(1000) == [rec]


def test_doorbell_only_when_the_consumer_sleeps() -> None:
    _, prod, cons = _pair()
    assert prod.push(b"a") and not prod.wants_doorbell()
    assert cons.arm()                                  # records there: don't sleep
    cons.disarm()
    cons.pop_batch(10)
    assert not cons.arm()                              # empty: sleep, and ask to be woken
    assert prod.push(b"b") and prod.wants_doorbell()


def _words(region: Region, ring: str) -> memoryview:
    off = shm_ring.REGION_HDR + (0 if ring == "req" else shm_ring.RING_HDR + 4096)
    return memoryview(region.mm)[off:off + shm_ring.RING_HDR].cast("Q")


def test_garbage_is_refused_with_a_reason_never_read_out_of_bounds() -> None:
    region, prod, cons = _pair(4096)
    w = _words(region, "req")
    w[0] = 4096 + 8                                    # tail beyond head + capacity
    with pytest.raises(RingCorrupt) as e:
        cons.pop_batch(1)
    assert e.value.reason == "bad_index"
    w[0] = 12                                          # not 8-aligned
    with pytest.raises(RingCorrupt) as e:
        cons.pop_batch(1)
    assert e.value.reason == "bad_index"
    for length in (0, shm_ring.MAX_RECORD + 1, 0xFFFFFFFF, 100):   # 100: beyond tail (16)
        struct.pack_into("<I", region.mm, shm_ring.REGION_HDR + shm_ring.RING_HDR, length)
        w[0] = 16
        with pytest.raises(RingCorrupt) as e:
            cons.pop_batch(1)
        assert e.value.reason == "bad_length", length
    w[8] = 1 << 40                                     # a producer facing an impossible head
    with pytest.raises(RingCorrupt):
        prod.push(b"z")
    w.release()


def test_random_garbage_never_escapes_as_anything_but_ringcorrupt() -> None:
    rng = random.Random(7)
    for _ in range(300):
        region, _, cons = _pair(4096)
        data_off = shm_ring.REGION_HDR + shm_ring.RING_HDR
        region.mm[data_off:data_off + 4096] = rng.randbytes(4096)
        w = _words(region, "req")
        w[0] = rng.choice([rng.randrange(0, 1 << 64), rng.randrange(0, 4097) & ~7,
                           rng.randrange(0, 8192)])
        w.release()
        try:
            for rec in cons.pop_batch(1 << 20):
                assert 0 < len(rec) <= shm_ring.MAX_RECORD
        except RingCorrupt as e:
            assert e.reason in ("bad_index", "bad_length")


def test_memfd_size_is_sealed() -> None:
    """A client must not shrink the region under the daemon's mapping (a fault there)."""
    region, fd = Region.create(4096, 4096)
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
        region.close()


# -- a real daemon ----------------------------------------------------------------------------


class Shm:
    def __init__(self, d: DaemonProc, hooks: Hooks, path: str):
        self.d, self.hooks, self.path = d, hooks, path
        self.address = f"shm://{path}"

    def client(self, **kw: object) -> Client:
        return Client(self.address, self.d.key_id, self.d.secret, timeout=60, **kw)

    def metric(self, name: str, labels: str = "") -> float:
        return self.d.metric(name, labels)

    def wait_metric(self, name: str, labels: str, cond, what: str) -> None:
        self.d.wait_for(lambda: cond(self.metric(name, labels)), timeout=60, what=what)


@pytest.fixture(scope="module")
def shm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zl-shm")
    hooks = Hooks(tmp / "hooks")
    # Under /tmp, world-traversable: the SO_PEERCRED test connects as another uid, so the
    # file mode lets everyone in and the allowed list is what refuses it.
    sockdir = tempfile.mkdtemp(prefix="zl-shm-", dir="/tmp")
    os.chmod(sockdir, 0o755)
    path = os.path.join(sockdir, "shm.sock")
    d = DaemonProc(tmp, "--shm-socket", path, "--shm-mode", "0666", "--shm-allowed-uids", "0",
                   "--shm-ring-bytes", "65536", "--shm-max-clients", "8",
                   "--cache-lease-s", "30", env={"ZEROLAYER_TEST_HOOKS": str(hooks.dir)})
    try:
        yield Shm(d, hooks, path)
    finally:
        hooks.release()
        rc = d.stop()
        shutil.rmtree(sockdir, ignore_errors=True)
        assert rc == 0, "".join(d.log[-60:])
        shutil.rmtree(sockdir, ignore_errors=True)


def _frames(recv, secret: bytes, until, timeout: float = 120) -> list:
    """Authenticated frames from `recv(timeout)` until `until(frames)` holds."""
    out: list = []
    end = time.monotonic() + timeout
    while not until(out):
        left = end - time.monotonic()
        assert left > 0, f"timed out; got {out}"
        dg = recv(left)
        if dg is not None:
            out.append(decode_response(dg, secret))
    return out


def _invoke(d: DaemonProc, rid: bytes, prompt: str, max_tokens: int) -> list[bytes]:
    body = build_invoke_body(prompt, None, None, max_tokens=max_tokens, temperature=0.0,
                             top_k=0, top_p=1.0, seed=None, stop=())
    return encode_invoke(d.key_id, d.secret, rid, time.time_ns() // 1000,
                         secrets.token_bytes(32), body)


def _control(d: DaemonProc, mt: MsgType, rid: bytes) -> bytes:
    return encode_control(mt, d.key_id, d.secret, rid, time.time_ns() // 1000,
                          secrets.token_bytes(32))


def test_ping_invoke_and_stream_over_shm(shm) -> None:
    assert os.stat(shm.path).st_mode & 0o777 == 0o666
    with shm.client() as c:
        for _ in range(5):
            assert c.ping() > 0
        via_shm = c.invoke("The capital of France is", max_tokens=12)
        assert via_shm.text and via_shm.usage.completion_tokens > 0
        s = c.stream("The capital of France is", max_tokens=12)
        assert "".join(s) == via_shm.text      # greedy: the same text, streamed
    udp = Client(shm.d.addr, shm.d.key_id, shm.d.secret, timeout=60)
    assert udp.invoke("The capital of France is", max_tokens=12).text == via_shm.text


def test_asyncio_client_over_shm(shm) -> None:
    async def main() -> tuple[str, list[float]]:
        async with AsyncClient(shm.address, shm.d.key_id, shm.d.secret, timeout=60) as c:
            pings = await asyncio.gather(*(c.ping() for _ in range(8)))
            r = await c.invoke("The capital of France is", max_tokens=12)
            return r.text, list(pings)
    text, pings = asyncio.run(main())
    assert text and all(p > 0 for p in pings)


def test_threads_share_one_ring_pair(shm) -> None:
    """One Client, many threads: each gets its own answers (demultiplexed by request id)."""
    errors: list[BaseException] = []
    with shm.client() as c:
        def worker() -> None:
            try:
                for _ in range(25):
                    c.ping()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors
        conn = c._connector
        assert isinstance(conn, ShmConnector) and conn.unrouted == 0


def test_request_id_is_one_across_udp_and_shm(shm) -> None:
    d = shm.d
    # replay: finished over UDP, asked again over shm
    rid = secrets.token_bytes(16)
    first = Client(d.addr, d.key_id, d.secret, timeout=60).invoke(
        "The capital of France is", max_tokens=8, request_id=rid)
    replayed = d.metric("zerolayer_idempotent_hits_total", 'kind="replayed"')
    with shm.client() as c:
        again = c.invoke("The capital of France is", max_tokens=8, request_id=rid)
    assert again.text == first.text
    assert d.metric("zerolayer_idempotent_hits_total", 'kind="replayed"') == replayed + 1
    # attach: running (the engine held) over UDP, a duplicate over shm takes the stream over
    rid = secrets.token_bytes(16)
    attached = d.metric("zerolayer_idempotent_hits_total", 'kind="attached"')
    conn = ShmConnector(shm.path)
    ch = conn.open(rid)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.connect(d.addr)
        for f in _invoke(d, rid, COUNT, 1500):
            u.send(f)
        u.settimeout(120)
        _frames(lambda t: u.recv(2048), d.secret,
                lambda fs: any(isinstance(f, TokenFrame) for f in fs))
        shm.hooks.hold(d)
        try:
            for f in _invoke(d, rid, COUNT, 1500):      # the same request, a fresh nonce
                ch.send(f)
            got = _frames(ch.recv, d.secret,
                          lambda fs: any(isinstance(f, AckFrame) for f in fs))
            ack = next(f for f in got if isinstance(f, AckFrame))
            assert ack.state is RunState.RUNNING
            assert d.metric("zerolayer_idempotent_hits_total", 'kind="attached"') == attached + 1
            ch.send(_control(d, MsgType.CANCEL, rid))  # the rest of the stream: over shm
        finally:
            shm.hooks.release()
        got += _frames(ch.recv, d.secret, lambda fs: any(isinstance(f, DoneFrame) for f in fs))
    assert all(f.request_id == rid for f in got)
    ch.close()
    conn.close()


_KILLED_CLIENT = """
import sys
from zerolayer.client import Client
c = Client(sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3]), timeout=60)
for piece in c.stream(sys.argv[4], max_tokens=1500):
    if piece:
        print("streaming", flush=True)
        break
sys.stdin.read()      # stay connected, mid-stream, until killed
"""


def test_client_killed_mid_stream_frees_its_ring(shm) -> None:
    d = shm.d
    with shm.client() as other:
        other.ping()
        # the gauge is copied at housekeeping (every 0.25 s): wait for it, never read it once
        base = 1                                     # `other`; earlier tests closed theirs
        shm.wait_metric("zerolayer_shm_connections_open", "", lambda v: v == base,
                        "only this test's client connected")
        p = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT, shm.address,
                              str(d.key_id), d.secret.hex(), COUNT],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "streaming"
            shm.wait_metric("zerolayer_shm_connections_open", "", lambda v: v == base + 1,
                            "the killed client's connection counted")
            p.send_signal(signal.SIGKILL)
            p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
        shm.wait_metric("zerolayer_shm_connections_open", "", lambda v: v == base,
                        "the dead client's ring freed")
        assert other.ping() > 0                      # the others are served on
        assert other.invoke("The capital of France is", max_tokens=4).text


def _raw(path: str) -> ShmSession:
    return ShmSession.connect(path)


def _dropped(sess: ShmSession) -> None:
    """Wait (an event, bounded) for the daemon to close this connection."""
    sess.sock.setblocking(True)
    sess.sock.settimeout(60)
    assert sess.sock.recv(16) == b""


@pytest.mark.parametrize("reason", ["bad_index", "bad_length", "protocol"])
def test_garbage_drops_only_that_connection(shm, reason) -> None:
    d = shm.d
    with shm.client() as other:
        other.ping()
        before = shm.metric("zerolayer_shm_ring_errors_total", f'reason="{reason}"')
        bad = _raw(shm.path)
        region = bad.region
        cap = region.requests.capacity
        w = memoryview(region.mm)[shm_ring.REGION_HDR:shm_ring.REGION_HDR + 64].cast("Q")
        if reason == "bad_index":
            w[0] = cap * 3 + 8                       # tail far beyond any head
        elif reason == "bad_length":
            data = shm_ring.REGION_HDR + shm_ring.RING_HDR
            region.mm[data:data + 64] = os.urandom(64)
            struct.pack_into("<I", region.mm, data, 0x7FFFFFF0)
            w[0] = 64
        else:
            bad.sock.send(b"hello?")                 # the socket carries nothing after setup
        w.release()
        os.eventfd_write(bad.req_efd, 1)             # wake the daemon if it sleeps
        _dropped(bad)
        bad.close()
        shm.wait_metric("zerolayer_shm_ring_errors_total", f'reason="{reason}"',
                        lambda v: v == before + 1, f"{reason} counted")
        assert d.proc.poll() is None
        assert other.ping() > 0
        assert other.invoke("The capital of France is", max_tokens=4).text


def test_a_new_client_in_a_dead_clients_slot_gets_a_clean_ring(shm) -> None:
    d = shm.d
    conn_a = ShmConnector(shm.path)
    rid_a = secrets.token_bytes(16)
    ch = conn_a.open(rid_a)
    sess_a = conn_a.session
    assert sess_a is not None
    for f in _invoke(d, rid_a, COUNT, 1500):
        ch.send(f)
    _frames(ch.recv, d.secret, lambda fs: any(isinstance(f, TokenFrame) for f in fs))
    shm.wait_metric("zerolayer_shm_connections_open", "", lambda v: v == 1,
                    "only A connected")
    slot_a = sess_a.slot
    conn_a.close()                                  # A goes away mid-stream
    shm.wait_metric("zerolayer_shm_connections_open", "", lambda v: v == 0, "A's ring freed")
    # B takes the lowest free slot, A's; its rings are new and empty, and A's stream, still
    # generating, never reaches it
    b = _raw(shm.path)
    try:
        assert b.slot == slot_a
        assert b.region.requests.counters() == (0, 0)
        assert b.region.responses.counters() == (0, 0)
        mine = set()
        for _ in range(10):
            rid = secrets.token_bytes(16)
            mine.add(rid)
            b.send(_control(d, MsgType.PING, rid))
        got: list = []
        end = time.monotonic() + 60
        while len(got) < 10:
            assert time.monotonic() < end, got
            for rec in b.region.responses.pop_batch(100):
                got.append(decode_response(rec, d.secret))
        assert all(isinstance(f, PongFrame) and f.request_id in mine for f in got)
        assert b.region.responses.pop_batch(100) == []
    finally:
        b.close()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:   # stop A's request
            u.connect(d.addr)
            u.send(_control(d, MsgType.CANCEL, rid_a))


def _connect_as(uid: int, path: str) -> tuple[int, int]:
    """Connect to the shm socket from a forked child running as `uid` (no exec: the child
    needs no access to the interpreter's files, which a 0700 checkout would deny it);
    returns (hello status, fds received)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                      # the child: never returns
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.settimeout(60)
            s.connect(path)
            msg, fds, _, _ = socket.recv_fds(s, 256, 3)
            os.write(w, struct.pack("<HH", struct.unpack_from("<4sHH", msg)[2], len(fds)))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        data = os.read(r, 4)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and len(data) == 4
    return struct.unpack("<HH", data)


def test_peer_credentials_are_checked(shm) -> None:
    """allowed_uids = "0": root connects (every other test), uid 4243 is refused by
    SO_PEERCRED even though the file mode (0666) lets it connect."""
    before = shm.metric("zerolayer_shm_connections_total", 'result="refused_peer"')
    assert _connect_as(REFUSED_UID, shm.path) == (STATUS_REFUSED_PEER, 0)
    shm.wait_metric("zerolayer_shm_connections_total", 'result="refused_peer"',
                    lambda v: v == before + 1, "refusal counted")


def test_refusal_raises_in_the_sdk() -> None:
    msg = shm_ring.pack_hello(STATUS_REFUSED_PEER)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        with pytest.raises(ShmRefusedError):
            ShmSession.adopt(a, msg, [])
    assert unpack_hello(msg)[0] == STATUS_REFUSED_PEER


def test_max_clients_is_enforced(shm) -> None:
    before = shm.metric("zerolayer_shm_connections_total", 'result="refused_full"')
    held: list[socket.socket] = []
    try:
        for _ in range(9):                             # max_clients = 8
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.settimeout(60)
            s.connect(shm.path)
            msg, fds, _, _ = socket.recv_fds(s, HELLO.size + 64, 3)
            for fd in fds:
                os.close(fd)
            held.append(s)
            if unpack_hello(msg)[0] == STATUS_FULL:
                break
        else:
            pytest.fail("never refused")
    finally:
        for s in held:
            s.close()
    shm.wait_metric("zerolayer_shm_connections_total", 'result="refused_full"',
                    lambda v: v == before + 1, "refusal counted")
    with shm.client() as c:                            # the slots come back
        assert c.ping() > 0


# -- the SDK's connector against a stand-in daemon ------------------------------------------

class FakeDaemon(threading.Thread):
    """Serves shm connections one at a time like the daemon, echoing each request record
    back (the request id is at the same offset both ways). restart() ends the current
    connection as a dying daemon would: its socket closes, its region goes away."""

    def __init__(self, path: str):
        super().__init__(daemon=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(8)
        self.listener.settimeout(0.05)
        self.stop = threading.Event()
        self.kill = threading.Event()
        self.served = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            region, memfd = Region.create(4096, 4096)
            q = os.eventfd(0, os.EFD_NONBLOCK)
            r = os.eventfd(0, os.EFD_NONBLOCK)
            try:
                socket.send_fds(conn, [shm_ring.pack_hello(shm_ring.STATUS_OK, 0, 4096, 4096)],
                                [memfd, q, r])
                self.served += 1
                while not (self.stop.is_set() or self.kill.is_set()):
                    for rec in region.requests.pop_batch(10):
                        region.responses.push(rec)
                        if region.responses.wants_doorbell():
                            os.eventfd_write(r, 1)
            except OSError:   # a client that gave up waiting for its greeting
                pass
            finally:
                self.kill.clear()
                conn.close()
                region.close()
                for fd in (memfd, q, r):
                    os.close(fd)


def test_connector_demultiplexes_and_reconnects_after_a_restart(tmp_path) -> None:
    path = str(tmp_path / "s.sock")
    fake = FakeDaemon(path)
    fake.start()
    conn = ShmConnector(path)
    try:
        ch_a = conn.open(b"A" * 16)
        ch_b = conn.open(b"B" * 16)
        dg_a = b"\0" * 16 + b"A" * 16 + b"payload-a"
        dg_b = b"\0" * 16 + b"B" * 16 + b"payload-b"
        ch_b.send(dg_b)
        ch_a.send(dg_a)
        assert ch_a.recv(60) == dg_a        # a's read sorted b's answer into b's queue
        assert ch_b.recv(60) == dg_b
        assert conn.unrouted == 0
        first = conn.session
        fake.kill.set()                     # the daemon "restarts"
        end = time.monotonic() + 60
        while True:                         # the SDK's way: resend until answered
            assert time.monotonic() < end
            ch_a.send(dg_a)
            if ch_a.recv(0.2) == dg_a and conn.session is not first:
                break
        assert fake.served >= 2
        ch_a.close()
        ch_b.close()
    finally:
        conn.close()
        fake.stop.set()
        fake.join(10)
        fake.listener.close()


def test_async_connector_demultiplexes_and_reconnects(tmp_path) -> None:
    from zerolayer.client.shm_transport import AsyncShmConnector
    path = str(tmp_path / "s.sock")
    fake = FakeDaemon(path)
    fake.start()
    dg_a = b"\0" * 16 + b"A" * 16 + b"payload-a"
    dg_b = b"\0" * 16 + b"B" * 16 + b"payload-b"

    async def main() -> None:
        conn = AsyncShmConnector(path)
        try:
            ch_a = await conn.open(b"A" * 16)
            ch_b = await conn.open(b"B" * 16)
            ch_b.send(dg_b)
            ch_a.send(dg_a)
            assert await ch_a.recv(60) == dg_a
            assert await ch_b.recv(60) == dg_b
            first = conn.session
            fake.kill.set()
            end = time.monotonic() + 60
            while True:
                assert time.monotonic() < end
                ch_a.send(dg_a)
                if await ch_a.recv(0.2) == dg_a and conn.session is not first:
                    break
            ch_a.close()
            ch_b.close()
        finally:
            await conn.aclose()
    try:
        asyncio.run(main())
    finally:
        fake.stop.set()
        fake.join(10)
        fake.listener.close()


def test_the_shm_address_carries_the_busy_poll_knob():
    from zerolayer.client.address import parse_address, shm_busy_poll_us
    from zerolayer.client.connect import connector_for
    assert shm_busy_poll_us("shm:///run/zl/shm.sock?busy_poll_us=50") == 50
    assert shm_busy_poll_us("shm:///run/zl/shm.sock") == 0
    assert parse_address("shm:///run/zl/shm.sock?busy_poll_us=50") == ("shm", "/run/zl/shm.sock")
    assert connector_for("shm:///run/zl/shm.sock?busy_poll_us=7").busy_poll_us == 7
    with pytest.raises(ValueError):
        shm_busy_poll_us("shm:///x.sock?busy_poll_us=lots")
