"""Three private network namespaces for the flood benchmark, removed on exit (also on error).

    NAME-srv  veth zl-s 10.201.0.1/24      the server under test (zerolayerd or llama-server)
    NAME-cli  bridge br0 10.201.0.2/24     legitimate clients; br0 joins zl-c (peer of zl-s)
              ports zl-c, fl-c             and fl-c (peer of fl-f)
    NAME-fld  veth fl-f 10.201.0.3/24      the flood's sender (trafgen, wrk), and the
                                           server's default route (it drops, never forwards)

The sender gets its own namespace and veth pair, so its packets reach the server's interface
(and the XDP program on it) exactly as the legitimate clients' do, through the bridge, and
its socket buffers and qdisc are not the clients'. Nothing is created in the caller's
namespace; deleting the three namespaces removes every device, the bridge and any XDP program.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from dataclasses import dataclass

SRV_IF, FLD_IF = "zl-s", "fl-f"
SRV_V4, CLI_V4, FLD_V4 = "10.201.0.1", "10.201.0.2", "10.201.0.3"


@dataclass(frozen=True)
class Testbed:
    name: str
    srv: str
    cli: str
    fld: str
    srv_mac: bytes
    fld_mac: bytes

    def namespaces(self) -> tuple[str, str, str]:
        return self.srv, self.cli, self.fld


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def link_mac(ns: str, ifname: str) -> bytes:
    (info,) = json.loads(_ip("-n", ns, "-j", "link", "show", ifname))
    return bytes.fromhex(info["address"].replace(":", ""))


def link_stats(ns: str, ifname: str) -> dict:
    """The interface's kernel counters (rx/tx packets, bytes, dropped)."""
    (info,) = json.loads(_ip("-n", ns, "-j", "-s", "link", "show", ifname))
    return info["stats64"]


def down(name: str) -> None:
    for suffix in ("srv", "cli", "fld"):
        subprocess.run(["ip", "netns", "del", f"{name}-{suffix}"], check=False,
                       capture_output=True)


def up(name: str) -> Testbed:
    srv, cli, fld = f"{name}-srv", f"{name}-cli", f"{name}-fld"
    try:
        for ns in (srv, cli, fld):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        # one queue each way, as scripts/xdp-testbed.sh: the daemon binds an AF_XDP socket
        # per RX queue, and a veth made without the numbers gets one per possible CPU
        one = ("numtxqueues", "1", "numrxqueues", "1")
        _ip("-n", srv, "link", "add", SRV_IF, *one, "type", "veth", "peer", "name", "zl-c",
            "netns", cli, *one)
        _ip("-n", fld, "link", "add", FLD_IF, "type", "veth", "peer", "name", "fl-c",
            "netns", cli)
        _ip("-n", cli, "link", "add", "br0", "type", "bridge")
        for port in ("zl-c", "fl-c"):
            _ip("-n", cli, "link", "set", port, "master", "br0")
            _ip("-n", cli, "link", "set", port, "up")
        _ip("-n", srv, "addr", "add", f"{SRV_V4}/24", "dev", SRV_IF)
        _ip("-n", cli, "addr", "add", f"{CLI_V4}/24", "dev", "br0")
        _ip("-n", fld, "addr", "add", f"{FLD_V4}/24", "dev", FLD_IF)
        for ns, dev in ((srv, SRV_IF), (cli, "br0"), (fld, FLD_IF)):
            _ip("-n", ns, "link", "set", dev, "up")
        # the server's default route points at the sender's namespace, as a real host's at
        # its upstream: replies to spoofed sources leave and are dropped there (that namespace
        # does not forward), as a router drops them on the way to nobody
        _ip("-n", srv, "route", "add", "default", "via", FLD_V4)
        # spoofed sources must reach the socket on the UDP path as they would on a host
        # without strict reverse-path filtering (the XDP program sees them before any of this)
        subprocess.run(["ip", "netns", "exec", srv, "sysctl", "-qw",
                        "net.ipv4.conf.all.rp_filter=0", f"net.ipv4.conf.{SRV_IF}.rp_filter=0"],
                       check=True)
        return Testbed(name, srv, cli, fld, link_mac(srv, SRV_IF), link_mac(fld, FLD_IF))
    except BaseException:
        down(name)
        raise


def existing(name: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in listed.splitlines() if ln.startswith(f"{name}-")]


@contextlib.contextmanager
def flood_testbed(prefix: str = "zlf"):
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    bed = up(name)
    try:
        yield bed
    finally:
        down(name)
