"""The one address grammar (client/address.py), as the SDK and the command line read it."""
from __future__ import annotations

import pytest

from zerolayer.client.address import FleetSpec, node_name, parse_address, parse_fleet_spec, parse_host_port
from zerolayer.daemon.programs import cli


@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:7000", ("udp", ("127.0.0.1", 7000))),
    ("udp://Example.COM:7001", ("udp", ("example.com", 7001))),
    ("[::1]:7002", ("udp", ("::1", 7002))),
    ("[fe80::1%Eth0]:7003", ("udp", ("fe80::1%Eth0", 7003))),
    ("shm:///run/zl/shm.sock?busy_poll_us=5", ("shm", "/run/zl/shm.sock")),
    ("fleet://zl.svc:7433", ("fleet", "fleet://zl.svc:7433")),
])
def test_the_sdk_reads_each_kind(text: str, expected: tuple[str, object]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["localhost", ":7000", "h:0", "h:65536", "h:x", "::1:7000",
                                  "[::1", "[::1]x", "[]:1", "tcp://h:1", "shm://"])
def test_the_sdk_needs_a_whole_address(text: str) -> None:
    with pytest.raises(ValueError):
        parse_address(text)


def test_the_command_line_reads_the_same_grammar_with_its_defaults() -> None:
    for text in ["10.0.0.1:7000", "[::1]:7002", "Host:1"]:
        assert cli.parse_address(text) == parse_host_port(text)
    assert cli.parse_address("[::1]") == parse_host_port("[::1]", default_port=cli.DEFAULT_PORT)
    with pytest.raises(cli.UsageError, match="port must be"):
        cli.parse_address("h:0")


def test_node_names_read_back_as_the_address() -> None:
    for addr in [("10.0.0.1", 7433), ("::1", 7433), ("zl-0.zl.svc", 1)]:
        assert parse_host_port(node_name(addr)) == addr


def test_a_fleet_is_a_list_or_a_dns_name() -> None:
    assert parse_fleet_spec(["10.0.0.1:1", ("10.0.0.2", 2)]) == FleetSpec(
        nodes=(("10.0.0.1", 1), ("10.0.0.2", 2)))
    assert parse_fleet_spec("fleet://zl.svc:7433") == FleetSpec(dns=("zl.svc", 7433))
    assert parse_fleet_spec("10.0.0.1:1") is None and parse_fleet_spec(("h", 1)) is None
    with pytest.raises(ValueError, match="DNS name and a port"):
        parse_fleet_spec("fleet://zl.svc")
    with pytest.raises(ValueError, match="UDP addresses"):
        parse_fleet_spec(["shm:///x.sock"])
