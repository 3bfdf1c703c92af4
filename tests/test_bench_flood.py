"""bench/bench_flood.py's own logic, without timings: what its trafgen configurations really
put on the wire (trafgen writes them to a pcap, decoded here with protocol/ and classified by
the daemon's order of checks), the spoofed sources, the generic kernel-counter reading, and
that its testbed goes away."""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import bench_flood as fp  # noqa: E402

from zerolayer.protocol import wire, xdp_tag  # noqa: E402
from zerolayer.protocol.errors import MalformedError  # noqa: E402

KEY_ID, SECRET = 7, secrets.token_bytes(32)
EP = fp.Endpoints(bytes.fromhex("02aa00000003"), bytes.fromhex("02aa00000001"),
                  socket.inet_aton("10.201.0.3"), socket.inet_aton("10.201.0.1"), 40000, 7433)

needs_trafgen = pytest.mark.skipif(shutil.which("trafgen") is None,
                                   reason="trafgen (netsniff-ng) not installed: scripts/bootstrap.sh")


def classify(dg: bytes, keys: dict[int, bytes], now_us: int, skew_s: float = 300.0,
             seen: set[bytes] | None = None) -> str:
    """Which class the daemon's checks put a datagram in (daemon/ingress.py's order:
    structure, key id, XDP tag, HMAC, timestamp, nonce). `seen`: nonces already accepted."""
    try:
        req = wire.parse_request(dg)
    except MalformedError:
        return "malformed"
    if req.key_id not in keys:
        return "unknown_key"
    flags = struct.unpack_from("<H", dg, fp.FLAGS_OFF)[0]
    if flags & wire.XDP_TAG and not xdp_tag.valid(xdp_tag.derive_key(keys[req.key_id]), dg):
        return "forged_tag"
    tag = hmac.new(keys[req.key_id], dg[:-wire.TAG_LEN], hashlib.sha256).digest()
    if not hmac.compare_digest(tag, dg[-wire.TAG_LEN:]):
        return "wrong_mac"
    if abs(req.timestamp_us - now_us) > skew_s * 1_000_000:
        return "stale_timestamp"
    if seen is not None:
        if req.nonce in seen:
            return "replay"
        seen.add(req.nonce)
    return "valid"


def read_pcap(data: bytes) -> list[bytes]:
    """The frames of a classic pcap file (what `trafgen -o file.pcap` writes)."""
    end = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",
           b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}[data[:4]]
    off, out = 24, []
    while off + 16 <= len(data):
        incl = struct.unpack_from(end + "IIII", data, off)[2]
        out.append(data[off + 16:off + 16 + incl])
        off += 16 + incl
    return out


def split_frame(fr: bytes) -> tuple[bytes, bytes, bool]:
    """(IPv4 source, UDP payload, IPv4 checksum valid) of an Ethernet/IPv4/UDP frame."""
    ip = fr[fp.IP_OFF:fp.UDP_OFF]
    return ip[12:16], fr[fp.UDP_OFF + fp.UDP_LEN:], fp.ip_checksum(ip) == 0


def existing(name: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in listed.splitlines() if ln.startswith(f"{name}-")]


def trafgen_frames(cls: str, spoof: bool, n: int, tmp_path: Path) -> list[bytes]:
    cfg, pcap = tmp_path / f"{cls}.cfg", tmp_path / f"{cls}.pcap"
    cfg.write_text(fp.trafgen_config(cls, EP, KEY_ID, SECRET, spoof))
    subprocess.run(["trafgen", "-i", str(cfg), "-o", str(pcap), "-n", str(n), "-P", "1",
                    "--no-sock-mem", "--notouch-irq"], check=True, capture_output=True,
                   timeout=60)
    return read_pcap(pcap.read_bytes())


@needs_trafgen
@pytest.mark.parametrize("spoof", [False, True], ids=["one-source", "spoofed"])
@pytest.mark.parametrize("cls", fp.CLASSES)
def test_trafgen_sends_the_class_it_was_built_for(cls: str, spoof: bool, tmp_path) -> None:
    frames = trafgen_frames(cls, spoof, 12, tmp_path)
    assert len(frames) == 12
    seen: set[bytes] = set()
    got = []
    for fr in frames:
        assert fr[:6] == EP.dst_mac and fr[6:12] == EP.src_mac
        src, payload, ip_ok = split_frame(fr)
        assert ip_ok, "trafgen's csumip left a bad IPv4 header checksum"
        udp = fr[fp.UDP_OFF:fp.UDP_OFF + fp.UDP_LEN]
        assert udp[2:4] == EP.dport.to_bytes(2, "big") and udp[6:8] == b"\0\0"
        assert int.from_bytes(udp[4:6], "big") == len(payload) + fp.UDP_LEN
        got.append(classify(payload, {KEY_ID: SECRET}, time.time_ns() // 1000, seen=seen))
    if cls == "replay":  # one valid request, then copies of it
        assert got == ["valid"] + ["replay"] * 11
        assert len({split_frame(f)[1] for f in frames}) == 1
    else:
        assert got == [cls] * 12


@needs_trafgen
def test_malformed_sends_each_broken_field_in_turn(tmp_path) -> None:
    reasons = set()
    for fr in trafgen_frames("malformed", False, 6, tmp_path):
        with pytest.raises(MalformedError) as e:
            wire.parse_request(split_frame(fr)[1])
        reasons.add(str(e.value).split()[0])
    assert reasons == {"bad", "unsupported", "declared"}


@needs_trafgen
def test_spoofed_sources_vary_and_one_source_does_not(tmp_path) -> None:
    spoofed = {split_frame(f)[0] for f in trafgen_frames("wrong_mac", True, 64, tmp_path)}
    assert len(spoofed) >= 60
    assert all(s[:2] == bytes(fp.SPOOF_NET) for s in spoofed)
    one = {split_frame(f)[0] for f in trafgen_frames("wrong_mac", False, 16, tmp_path)}
    assert one == {EP.src_ip}


def test_classify_tells_a_fresh_request_from_junk() -> None:
    now = time.time_ns() // 1000
    (valid,) = fp.datagrams("replay", KEY_ID, SECRET)
    assert classify(valid, {KEY_ID: SECRET}, now) == "valid"
    assert classify(valid, {KEY_ID + 1: SECRET}, now) == "unknown_key"
    assert classify(valid, {KEY_ID: secrets.token_bytes(32)}, now) == "wrong_mac"
    assert classify(valid, {KEY_ID: SECRET}, now + 3600 * 10**6) == "stale_timestamp"


def test_kernel_counters_are_read_by_whatever_reason_the_program_reports() -> None:
    delta = {'zerolayer_xdp_packets_total{action="drop",reason="drop_bad_magic"}': 5.0,
             'zerolayer_xdp_packets_total{action="drop",reason="drop_a_reason_added_later"}': 3.0,
             'zerolayer_xdp_packets_total{action="redirect",reason="redirect"}': 2.0,
             "zerolayer_xsk_rx_dropped_total": 4.0, "kernel_udp:RcvbufErrors": 9.0,
             "zerolayer_ingress_datagrams_total": 2.0}
    assert fp.kernel_reasons(delta) == {
        "drop_bad_magic": 5.0, "drop_a_reason_added_later": 3.0, "redirect": 2.0,
        "xsk_ring_full": 4.0, "udp_rcvbuf_full": 9.0}


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@needs_trafgen
def test_a_bounded_flood_reaches_the_server_and_the_testbed_goes_away(tmp_path) -> None:
    name = None
    with pytest.raises(RuntimeError, match="stop here"), fp.flood_testbed("zlt") as bed:
        name = bed.name
        assert sorted(existing(name)) == sorted(bed[1:4])
        cfg = tmp_path / "junk.cfg"
        ep = fp.Endpoints(bed.fld_mac, bed.srv_mac, socket.inet_aton(fp.FLD_V4),
                          socket.inet_aton(fp.SRV_V4), 40000, 7433)
        cfg.write_text(fp.trafgen_config("malformed", ep, KEY_ID, SECRET, True))
        rx0 = fp.link_stats(bed.srv, fp.SRV_IF)["rx"]["packets"]
        # 1500 packets at 1000/s: bounded by count; the time bound (20 s) is only a backstop.
        # The last CPU: trafgen pins its worker to CPU 0 itself, the sender moves it back.
        cpu = max(os.sched_getaffinity(0))
        s = fp.trafgen(bed.fld, fp.FLD_IF, cpu, cfg, "1000", 20, tmp_path / "trafgen.log",
                            count=1500)
        workers = fp.workers_of(s.proc.pid, "trafgen")
        assert len(workers) == 1 and os.sched_getaffinity(workers[0]) == {cpu}
        assert os.getpriority(os.PRIO_PROCESS, workers[0]) == 19
        s.proc.wait(30)
        out = s.stop()
        assert s.proc.returncode == 0, out
        res = fp.parse_trafgen(out)
        assert res.sent == 1500 and res.seconds > 0
        assert fp.link_stats(bed.srv, fp.SRV_IF)["rx"]["packets"] - rx0 >= res.sent
        raise RuntimeError("stop here")   # teardown must run on an error too
    assert name is not None and existing(name) == []
