"""The daemon with --network-ingress xdp on the veth testbed: a client in its own namespace
invokes through the XDP program and the AF_XDP rings, and gets the streamed answer back over
the same rings. Garbage is dropped in the kernel before the daemon sees it. SIGKILL leaves no
program behind: traffic goes back to the kernel stack, the client fails in bounded time, and
after a restart its retry with the same request id completes. Root only (CI runs as root)."""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import pytest

from answers import FRANCE_ANSWER, FRANCE_ENDS_TURN, FRANCE_QUESTION
from daemon_proc import DaemonProc
from netns import CLI_V4, SRV_IF, SRV_V4, SRV_V6, in_netns, xdp_testbed
from zerolayer.client import Client
from zerolayer.protocol import wire
from zerolayer.protocol.errors import ContextOverflowError, ZerolayerTimeoutError
from zerolayer.protocol.wire import ChatMessage, MsgType

if os.geteuid() != 0:  # pragma: no cover - CI runs as root
    pytest.skip("XDP and network namespaces need root", allow_module_level=True)

FRANCE = [ChatMessage("user", FRANCE_QUESTION)]
XDP_ARGS = ("--network-ingress", "xdp", "--network-interface", SRV_IF, "--cache-lease-s", "5")
REDIRECT = 'action="redirect",reason="redirect"'


@pytest.fixture(scope="module")
def bed():
    with xdp_testbed() as names:
        yield names


@pytest.fixture(scope="module")
def daemon(bed, tmp_path_factory):
    srv, _ = bed
    tmp = tmp_path_factory.mktemp("zlx")
    d = DaemonProc(tmp, *XDP_ARGS, "--control-socket", str(tmp / "control.sock"), netns=srv,
                   host="::")
    d.control = str(tmp / "control.sock")
    yield d
    assert d.stop() == 0
    assert xdp_prog_on(srv) is None  # a clean stop detaches too


def xdp_prog_on(ns: str) -> str | None:
    out = subprocess.run(["ip", "-n", ns, "-d", "link", "show", SRV_IF], capture_output=True,
                         text=True, check=True).stdout
    return "xdp" if "prog/xdp" in out else None


def client(d: DaemonProc, host: str = SRV_V4, **kw) -> Client:
    return Client((host, d.port), d.key_id, d.secret, timeout=kw.pop("timeout", 60), **kw)


def redirected(d: DaemonProc) -> float:
    return d.metric("zerolayer_xdp_packets_total", REDIRECT)


def test_daemon_says_it_serves_xdp(daemon, bed):
    assert any("ingress xdp on zl-s" in line for line in daemon.log)
    assert xdp_prog_on(bed[0]) == "xdp"
    daemon.wait_for(lambda: daemon.metric("zerolayer_xdp_attached") == 1, what="xdp gauge")
    # the UMEM is accounted for among the daemon's buffers while AF_XDP is attached
    daemon.wait_for(lambda: daemon.metric("zerolayer_memory_bytes", 'buffer="umem"') > 0,
                    what="umem in the memory gauges")


def test_xdp_status_and_rate_limit_through_the_control_socket(daemon, bed):
    from zerolayer.daemon.ops import control
    st = control.request(daemon.control, "xdp-status")["result"]
    assert st["attached"] and st["interface"] == SRV_IF and st["ports"] == [daemon.port]
    assert st["rate"] == {"rate_pps": 0, "burst": 0} and st["packets"]["redirect"] >= 0
    r = control.request(daemon.control, "rate-limit", {"rate_pps": "1000", "burst": "50"})
    assert r["ok"] and r["result"] == {"rate_pps": 1000, "burst": 50}
    assert control.request(daemon.control, "xdp-status")["result"]["rate"] == r["result"]
    bad = control.request(daemon.control, "rate-limit", {"rate_pps": "-1"})
    assert bad["error"]["code"] == "BAD_ARGUMENT"
    r = control.request(daemon.control, "rate-limit", {"rate_pps": "0"})
    assert r["result"] == {"rate_pps": 0, "burst": 0}
    # the untagged requests' budget: its own command, the same arguments, the config's default
    # until set
    assert st["untagged_rate"] == {"rate_pps": 500, "burst": 2000}
    r = control.request(daemon.control, "untagged-rate", {"rate_pps": "40", "burst": "8"})
    assert r["result"] == {"rate_pps": 40, "burst": 8}
    st = control.request(daemon.control, "xdp-status")["result"]
    assert st["untagged_rate"] == r["result"] and st["rate"] == {"rate_pps": 0, "burst": 0}
    bad = control.request(daemon.control, "untagged-rate", {"burst": "x"})
    assert bad["error"]["code"] == "BAD_ARGUMENT"
    control.request(daemon.control, "untagged-rate", {"rate_pps": "500", "burst": "2000"})
    assert in_netns(bed[1], lambda: client(daemon).ping()) > 0


@pytest.mark.parametrize("host", [SRV_V4, SRV_V6], ids=["ipv4", "ipv6"])
def test_chat_question_streams_its_answer_through_the_rings(daemon, bed, host):
    _, cli = bed
    before = redirected(daemon)
    dgrams = daemon.metric("zerolayer_ingress_datagrams_total")
    s = in_netns(cli, lambda: client(daemon, host).stream(messages=FRANCE, max_tokens=16))
    chunks = list(s)
    assert FRANCE_ANSWER in "".join(chunks) and len(chunks) >= 3
    assert s.result.finish_reason == ("stop" if FRANCE_ENDS_TURN else "length")
    assert s.result.attempts == 1
    # every datagram the daemon took in came through the XDP program's redirect
    daemon.wait_for(lambda: redirected(daemon) - before
                    >= daemon.metric("zerolayer_ingress_datagrams_total") - dgrams > 0,
                    what="redirect counter")
    assert daemon.metric("zerolayer_xdp_packets_total", 'action="pass",reason="pass_no_xsk"') == 0


def test_ping_over_both_families(daemon, bed):
    _, cli = bed
    for host in (SRV_V4, SRV_V6):
        rtt = in_netns(cli, lambda h=host: client(daemon, h).ping())
        assert 0 < rtt < 5


def test_garbage_is_dropped_in_the_kernel(daemon, bed):
    srv, cli = bed
    valid = wire.encode_control(MsgType.PING, daemon.key_id, daemon.secret,
                                secrets.token_bytes(16), time.time_ns() // 1000,
                                secrets.token_bytes(32))
    bad_magic = b"XXXX" + valid[4:]
    lying = valid[:-20]  # shorter than its header says
    drops = {r: daemon.metric("zerolayer_xdp_packets_total", f'action="drop",reason="{r}"')
             for r in ("drop_bad_magic", "drop_bad_length")}
    seen = daemon.metric("zerolayer_ingress_datagrams_total")

    def flood():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((CLI_V4, 0))
            for _ in range(500):
                s.sendto(bad_magic, (SRV_V4, daemon.port))
                s.sendto(lying, (SRV_V4, daemon.port))
    in_netns(cli, flood)
    for r, n in drops.items():
        daemon.wait_for(lambda r=r, n=n: daemon.metric(
            "zerolayer_xdp_packets_total", f'action="drop",reason="{r}"') - n >= 500, what=r)
    assert daemon.metric("zerolayer_ingress_datagrams_total") == seen  # none reached the daemon
    r = in_netns(cli, lambda: client(daemon).invoke(messages=FRANCE, max_tokens=8))
    assert r.text


def test_sigkill_falls_back_to_the_kernel_and_the_retry_completes(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with xdp_testbed() as (srv, cli):
        d = DaemonProc(tmp_path / "a", *XDP_ARGS, netns=srv, host="::")
        secret = d.secret
        rid = secrets.token_bytes(16)
        c = client(d, timeout=3, contact_timeout_s=0.5)
        long_ask = [ChatMessage("user", "Write a long story about a lighthouse keeper.")]
        try:
            s = in_netns(cli, lambda: c.stream(messages=long_ask, max_tokens=300, request_id=rid))
            first = next(s)
            assert first
            d.signal(signal.SIGKILL)
            assert d.wait(30) == -signal.SIGKILL
        finally:
            d.stop()
        # The bpf_link died with its owner: no program left on the device.
        assert xdp_prog_on(srv) is None
        # The client doesn't hang: it re-sends for a while, then fails with a timeout.
        t0 = time.monotonic()
        with pytest.raises(ZerolayerTimeoutError):
            for _ in s:
                pass
        assert time.monotonic() - t0 < 15
        # Invokes now reach the kernel's UDP stack (a plain socket on the port gets them);
        # with nothing listening the kernel refuses them (ICMP port unreachable).
        def fallback_socket():
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.bind((SRV_V4, d.port))
            u.settimeout(5)
            return u
        u = in_netns(srv, fallback_socket)
        try:
            with pytest.raises(ZerolayerTimeoutError):
                in_netns(cli, lambda: client(d, timeout=1, max_attempts=2).ping())
            dg = u.recv(4096)
            assert dg[:4] == wire.MAGIC and dg[5] == MsgType.PING
        finally:
            u.close()
        # Restart: the retry with the same request id runs to completion.
        d2 = DaemonProc(tmp_path / "b", *XDP_ARGS, netns=srv, host="::", secret=secret)
        try:
            r = in_netns(cli, lambda: client(d2).invoke(messages=long_ask, max_tokens=300,
                                                        request_id=rid))
            assert r.text.startswith(first) and r.finish_reason in ("stop", "length")
            assert r.usage.completion_tokens > 1
        finally:
            assert d2.stop() == 0


def test_large_invokes_arrive_in_many_fragments_through_the_rings(daemon, bed):
    """Multi-fragment requests through the program and the rings: ~2.5 KB is answered; ~60 KB
    (about 50 fragments) is reassembled and tokenized, and refused as CONTEXT_OVERFLOW."""
    _, cli = bed
    before = redirected(daemon)
    words = "Here is a list of words. " + " ".join(f"w{i}" for i in range(20000))
    c = client(daemon)
    r = in_netns(cli, lambda: c.invoke(prompt=words[:2500], max_tokens=2))
    assert r.usage.prompt_tokens > 1000 and r.usage.completion_tokens == 2  # 2 fragments+
    with pytest.raises(ContextOverflowError):
        in_netns(cli, lambda: c.invoke(prompt=words[:60_000], max_tokens=2))
    daemon.wait_for(lambda: redirected(daemon) - before >= 65_000 // 1252, what="fragments")


def test_ingress_auto_falls_back_to_udp_and_xdp_refuses_to_start(tmp_path):
    """auto: XDP cannot be set up (no such device) -> says so and serves on the UDP path.
    xdp: the same is a start failure with the reason (exit 2), never a silent downgrade."""
    (tmp_path / "a").mkdir()
    d = DaemonProc(tmp_path / "a", "--network-ingress", "auto", "--network-interface", "zl-nosuchdev")
    try:
        assert any("XDP unavailable on zl-nosuchdev" in line for line in d.log)
        assert any("ingress udp" in line for line in d.log)
        c = Client(d.addr, d.key_id, d.secret, timeout=30)
        assert c.ping() > 0
        assert d.metric("zerolayer_xdp_attached") == 0
    finally:
        assert d.stop() == 0
    keys = tmp_path / "keys"
    keys.write_text("1 " + "cd" * 32 + "\n")
    keys.chmod(0o600)
    p = subprocess.run([sys.executable, "-m", "zerolayer.daemon.server", "--network-ingress", "xdp",
                        "--network-interface", "zl-nosuchdev", "--security-keys-file", str(keys),
                        "--network-port", "0", "--metrics-port", "0"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert "cannot start: XDP ingress on zl-nosuchdev" in p.stderr and "no network device" in p.stderr


def test_detach_and_attach_xdp_at_run_time(daemon, bed):
    """`zerolayer ctl xdp-detach`: the program leaves the interface and the daemon serves
    the same clients over the kernel's UDP path; `xdp-attach` brings it back, no restart."""
    import json
    import sys
    from pathlib import Path

    from zerolayer.daemon.ops import control
    srv, cli = bed
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "ZEROLAYER_CONTROL_SOCKET": daemon.control,
           "ZEROLAYER_BIN": str(Path(sys.executable).parent / "zerolayer")}
    out = subprocess.run(["bash", str(root / "scripts" / "zl-xdp.sh"), "detach"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout) == {"attached": False}, out.stderr
    assert xdp_prog_on(srv) is None
    assert control.request(daemon.control, "xdp-detach")["error"]["code"] == "UNAVAILABLE"
    res = in_netns(cli, lambda: client(daemon).invoke(messages=FRANCE, max_tokens=8))
    assert FRANCE_ANSWER in res.text                       # over UDP now
    daemon.wait_for(lambda: daemon.metric("zerolayer_xdp_attached") == 0, what="gauge 0")
    r = control.request(daemon.control, "xdp-attach", timeout_s=60)
    assert r["ok"] and r["result"]["attached"], r
    out = subprocess.run(["bash", str(root / "scripts" / "zl-xdp.sh"), "status"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout)["interface"] == SRV_IF
    assert xdp_prog_on(srv) == "xdp"
    before = redirected(daemon)
    res = in_netns(cli, lambda: client(daemon).invoke(messages=FRANCE, max_tokens=8))
    assert FRANCE_ANSWER in res.text
    daemon.wait_for(lambda: redirected(daemon) > before, what="redirected again")


def drops(d: DaemonProc, reason: str) -> float:
    try:
        return d.metric("zerolayer_xdp_packets_total", f'action="drop",reason="{reason}"')
    except KeyError:   # the label appears with its first packet
        return 0.0


def test_forgeries_are_dropped_in_the_kernel_and_the_sdk_is_served(daemon, bed):
    """The daemon publishes its key ids, their XDP tag keys and its clock to the program at
    attach: invokes forged under its key id, invokes under an unknown key id and a key
    holder's stale invokes never reach it; the SDK's own (tagged) requests do."""
    _, cli = bed
    now = time.time_ns() // 1000
    body = wire.encode_invoke_body(wire.SamplingParams(max_tokens=2), wire.PayloadKind.PROMPT,
                                   b"hi")

    def one(key_id: int, secret: bytes, ts: int) -> bytes:
        return wire.encode_invoke(key_id, secret, secrets.token_bytes(16), ts,
                                  secrets.token_bytes(32), body, xdp_tag=True)[0]
    junk = {
        "drop_bad_tag": [one(daemon.key_id, secrets.token_bytes(32), now) for _ in range(300)],
        "drop_unknown_key": [one(daemon.key_id + 1, daemon.secret, now) for _ in range(300)],
        "drop_stale_timestamp": [one(daemon.key_id, daemon.secret, now - 900 * 10**6)
                                 for _ in range(300)],
    }
    before = {r: drops(daemon, r) for r in junk}
    seen = daemon.metric("zerolayer_ingress_datagrams_total")

    def flood():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((CLI_V4, 0))
            for dgs in junk.values():
                for dg in dgs:
                    s.sendto(dg, (SRV_V4, daemon.port))
    in_netns(cli, flood)
    for r, n in before.items():
        daemon.wait_for(lambda r=r, n=n: drops(daemon, r) - n >= 300, what=r)
    assert daemon.metric("zerolayer_ingress_datagrams_total") == seen  # none reached it
    r = in_netns(cli, lambda: client(daemon).invoke(messages=FRANCE, max_tokens=8))
    assert FRANCE_ANSWER in r.text


def test_a_key_added_by_sighup_is_served_through_the_kernel_at_once(daemon, bed):
    """Rotation: a new key id is usable over XDP as soon as the reload is done (the kernel's
    copy was updated before the daemon's swap); the removed one is dropped in the kernel."""
    _, cli = bed
    new_id, new_secret = daemon.key_id + 100, secrets.token_bytes(32)
    original = daemon.keys_file.read_text()

    def reload(text: str) -> None:
        n = daemon.metric("zerolayer_key_reloads_total", 'result="ok"')
        daemon.keys_file.write_text(text)
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(lambda: daemon.metric("zerolayer_key_reloads_total",
                                              'result="ok"') > n, what="reload")
    try:
        reload(original + f"{new_id} {new_secret.hex()}\n")
        c = Client((SRV_V4, daemon.port), new_id, new_secret, timeout=30)
        before = redirected(daemon)
        assert in_netns(cli, c.ping) > 0
        daemon.wait_for(lambda: redirected(daemon) > before, what="the new key's PING redirected")
        reload(f"{new_id} {new_secret.hex()}\n")    # the daemon's own key id removed
        n = drops(daemon, "drop_unknown_key")
        old = client(daemon, timeout=1, max_attempts=1)
        with pytest.raises(ZerolayerTimeoutError):   # dropped in the kernel: no answer
            in_netns(cli, old.ping)
        daemon.wait_for(lambda: drops(daemon, "drop_unknown_key") > n, what="unknown key drop")
        assert in_netns(cli, c.ping) > 0
    finally:
        reload(original)
    assert in_netns(cli, lambda: client(daemon).ping()) > 0
