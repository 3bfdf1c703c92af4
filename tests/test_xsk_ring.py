"""The pure-Python AF_XDP rings (daemon/carriers/xsk_ring.py, daemon/carriers/xdp_io.py) on the veth testbed:
the real XDP program redirects datagrams from a client namespace into an AF_XDP socket per RX
queue, and replies written into UMEM TX frames come back to the client's UDP socket.
Root only (CI runs as root); nothing here touches the host's own interfaces."""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time

import pytest

from netns import CLI_V4, CLI_V6, SRV_IF, SRV_V4, SRV_V6, in_netns, xdp_testbed
from zerolayer.protocol import wire
from zerolayer.protocol.wire import MsgType

if os.geteuid() != 0:  # pragma: no cover - CI runs as root
    pytest.skip("AF_XDP and network namespaces need root", allow_module_level=True)

from zerolayer.bpf.kernel_keys import KernelKeys  # noqa: E402
from zerolayer.daemon.carriers.xdp_io import XdpIO, XdpSettings  # noqa: E402
from zerolayer.daemon.carriers.xsk_ring import TX_BUDGET_PER_CALL  # noqa: E402

PORT = 7433


def ping_datagram() -> bytes:
    return wire.encode_control(MsgType.PING, 1, b"k" * 32, secrets.token_bytes(16),
                               time.time_ns() // 1000, secrets.token_bytes(32))


@pytest.fixture(scope="module", params=[1, 2], ids=["1queue", "2queues"])
def bed(request):
    with xdp_testbed(queues=request.param) as (srv, cli):
        io = in_netns(srv, lambda: XdpIO.open(XdpSettings(SRV_IF, (PORT,), ring_size=512)))
        try:
            yield io, srv, cli, request.param
        finally:
            io.close()


def echo_until(io: XdpIO, n: int, timeout: float = 10.0, transform=lambda d: d) -> int:
    got = 0
    end = time.monotonic() + timeout
    while got < n and time.monotonic() < end:
        batch = io.recv_batch()
        if batch:
            io.send_batch([(transform(d), p) for d, p in batch])
            got += len(batch)
    io.poll_tx()
    return got


def client_socket(cli: str, v6: bool = False) -> socket.socket:
    def make():
        s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((CLI_V6 if v6 else CLI_V4, 0))
        s.connect((SRV_V6 if v6 else SRV_V4, PORT))
        s.settimeout(2.0)
        return s
    return in_netns(cli, make)


def test_one_socket_per_rx_queue(bed):
    io, _, _, queues = bed
    assert [x.queue for x in io.socks] == list(range(queues))
    assert not io.zerocopy  # veth has no zero-copy: copy mode, chosen by "auto"


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_round_trip_through_the_rings(bed, v6):
    io, _, cli, _ = bed
    s = client_socket(cli, v6)
    before = io.packet_counts()["redirect"]
    for _ in range(20):
        dg = ping_datagram()
        s.send(dg)
        assert echo_until(io, 1, transform=lambda d: b"R" + d[1:]) == 1
        assert s.recv(4096) == b"R" + dg[1:]  # the reply is ours, not the kernel's echo
    assert io.packet_counts()["redirect"] - before == 20
    s.close()


def test_burst_larger_than_the_tx_budget_is_sent_whole(bed):
    """Copy mode sends at most 32 frames per sendto(): the kick loop must drain the ring."""
    io, _, cli, _ = bed
    socks = [client_socket(cli) for _ in range(4)]  # several flows: spread over the queues
    n = 10 * TX_BUDGET_PER_CALL
    sent = {s.getsockname()[1]: [] for s in socks}
    for i in range(n):
        s = socks[i % len(socks)]
        dg = ping_datagram()
        s.send(dg)
        sent[s.getsockname()[1]].append(dg)
    assert echo_until(io, n) == n
    kicks = sum(x.kicks for x in io.socks)
    for s in socks:
        got = []
        while len(got) < len(sent[s.getsockname()[1]]):
            got.append(s.recv(4096))
        assert got == sent[s.getsockname()[1]]  # all of them, in order, per flow
        s.close()
    assert kicks >= 1
    st = io.xsk_stats()
    assert st.rx_dropped == 0 and st.rx_invalid_descs == 0 and st.tx_invalid_descs == 0


def test_no_free_tx_frame_is_counted_not_fatal(bed):
    io, _, cli, _ = bed
    s = client_socket(cli)
    s.send(ping_datagram())
    got = []
    end = time.monotonic() + 5
    while not got and time.monotonic() < end:
        got = io.recv_batch()
    data, peer = got[0]
    x = io.socks[peer.queue]
    x.reap()
    taken = []
    while (a := x.tx_frame()) is not None:
        taken.append(a)
    before = io.tx_no_frame
    assert io.send_batch([(data, peer)]) == 0
    assert io.tx_no_frame == before + 1
    x._tx_free.extend(taken)  # hand them back: the pool is whole again
    assert io.send_batch([(data, peer)]) == 1
    assert s.recv(4096) == data
    s.close()


def test_ring_occupancy_and_kernel_counters(bed):
    io, _, _, _ = bed
    occ = io.ring_occupancy()
    assert set(occ) == {"rx", "tx", "fill", "completion"}
    assert occ["fill"] > 0  # RX frames are waiting in the fill ring for the kernel
    counts = io.packet_counts()
    assert counts["drop_bad_magic"] == 0 and counts["redirect"] > 0


def test_pinned_maps_for_ops_tools_go_away_on_close(tmp_path):
    d = tmp_path / "bpffs"
    d.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(d)], check=True)
    try:
        with xdp_testbed() as (srv, cli):
            io = in_netns(srv, lambda: XdpIO.open(XdpSettings(
                SRV_IF, (PORT,), ring_size=512, pin_dir=str(d / "zerolayer"),
                untagged_pps=7, untagged_burst=3)))
            try:
                assert io.prog.untagged_rate() == (7, 3)
                assert sorted(p.name for p in io.pins.values()) == [
                    "zl_auth_cfg", "zl_keys", "zl_ports", "zl_rate_cfg", "zl_rate_state",
                    "zl_stats", "zl_untagged_state", "zl_xsks"]
                assert all(p.exists() for p in io.pins.values())
            finally:
                io.close()
            assert not any((d / "zerolayer").iterdir())
    finally:
        subprocess.run(["umount", str(d)], check=True)


def test_ops_tool_reads_counters_and_sets_the_rate_through_the_pins(tmp_path):
    """bpf/pinned.py against a live program's pins: counters as the program sees them, and a
    rate limit changed without a restart."""
    import json
    import sys
    d = tmp_path / "bpffs"
    d.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(d)], check=True)
    try:
        with xdp_testbed() as (srv, cli):
            pins = str(d / "zerolayer")
            io = in_netns(srv, lambda: XdpIO.open(XdpSettings(SRV_IF, (PORT,), ring_size=512,
                                                              pin_dir=pins)))
            try:
                s = client_socket(cli)
                s.send(ping_datagram())
                assert echo_until(io, 1) == 1
                s.close()
                tool = [sys.executable, "-m", "zerolayer.bpf.pinned", "--dir", pins]
                out = json.loads(subprocess.run(tool + ["show", "--json"], check=True,
                                                capture_output=True, text=True).stdout)
                assert out["auth"] == {"key_ids": [], "check_keys": False,
                                       "require_tag": False, "skew_us": 0}
                KernelKeys(io.prog, skew_s=300).publish({4: bytes(16), 9: bytes(range(16))})
                out = json.loads(subprocess.run(tool + ["show", "--json"], check=True,
                                                capture_output=True, text=True).stdout)
                assert out["auth"] == {"key_ids": [4, 9], "check_keys": True,
                                       "require_tag": False, "skew_us": 302_000_000}
                assert out["ports"] == [PORT] and out["rate_pps"] == 0
                assert out["packets"]["redirect"] == io.packet_counts()["redirect"] >= 1
                subprocess.run(tool + ["rate", "500", "20"], check=True, capture_output=True)
                assert io.prog.rate() == (500, 20)  # the running program sees it at once
                subprocess.run(tool + ["untagged-rate", "70", "9"], check=True,
                               capture_output=True)
                assert io.prog.untagged_rate() == (70, 9) and io.prog.rate() == (500, 20)
            finally:
                io.close()
        bad = subprocess.run([sys.executable, "-m", "zerolayer.bpf.pinned", "--dir",
                              str(d / "nothing"), "show"], capture_output=True, text=True)
        assert bad.returncode == 2 and "cannot open the pinned maps" in bad.stderr
    finally:
        subprocess.run(["umount", str(d)], check=True)
