"""Keys file (permissions, format, SIGHUP reload) and the timestamp/nonce replay guard."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolayer.daemon.auth import (
    KeyFileError,
    KeyStore,
    ReplayConfig,
    ReplayGuard,
    format_key_line,
    generate_secret,
    load_keys,
    parse_keys,
)
from zerolayer.protocol.errors import ExpiredNonceError, InvalidTimestampError, OverloadedError

S1 = "11" * 32
S2 = "22" * 32


def _write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_load_keys_format(tmp_path: Path) -> None:
    p = _write(tmp_path / "keys", f"# team A\n\n1 {S1}\n  4294967295   {S2}  # trailing\n")
    assert load_keys(p) == {1: bytes.fromhex(S1), 4294967295: bytes.fromhex(S2)}


def test_keygen_lines_round_trip() -> None:
    a, b = generate_secret(), generate_secret()
    assert len(a) == 32 and a != b
    text = format_key_line(1, a) + format_key_line(2, b)
    assert parse_keys(text) == {1: a, 2: b}
    with pytest.raises(ValueError):
        generate_secret(8)
    with pytest.raises(ValueError):
        format_key_line(0, a)


@pytest.mark.parametrize("text,match", [
    (f"0 {S1}", "1..4294967295"),
    (f"4294967296 {S1}", "1..4294967295"),
    (f"-1 {S1}", "decimal"),
    (f"abc {S1}", "decimal"),
    ("1 zz", "not hex"),
    ("1 " + "ab" * 15, "16..64"),
    ("1 " + "ab" * 65, "16..64"),
    (f"1 {S1}\n1 {S2}", "duplicate"),
    (f"1 {S1} extra", "expected"),
    ("1", "expected"),
])
def test_bad_key_files_are_refused_with_the_line(text: str, match: str) -> None:
    with pytest.raises(KeyFileError, match=match):
        parse_keys(text, "k")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o606, 0o610, 0o601])
def test_key_file_readable_by_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    p = _write(tmp_path / "keys", f"1 {S1}\n", mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_keys(p)
    with pytest.raises(KeyFileError):
        KeyStore(p)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_key_file_private_to_owner_is_accepted(tmp_path: Path, mode: int) -> None:
    p = _write(tmp_path / "keys", f"1 {S1}\n", mode)
    assert KeyStore(p).get(1) == bytes.fromhex(S1)


def test_missing_or_non_regular_key_file(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError):
        load_keys(tmp_path / "nope")
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    with pytest.raises(KeyFileError):
        load_keys(d)


def test_a_keys_file_without_keys_is_refused_at_start(tmp_path: Path) -> None:
    p = _write(tmp_path / "keys", "# nothing yet\n\n")
    with pytest.raises(KeyFileError, match="no keys"):
        KeyStore(p)


def test_reload_swaps_keys_and_a_bad_file_keeps_the_old_ones(tmp_path: Path) -> None:
    p = _write(tmp_path / "keys", f"1 {S1}\n")
    ks = KeyStore(p)
    assert ks.key_ids() == [1]
    # Rotation: add key 2, drop key 1.
    _write(p, f"2 {S2}\n")
    assert ks.reload() is True
    assert ks.get(1) is None and ks.get(2) == bytes.fromhex(S2)
    assert ks.reloads == 1 and ks.last_error is None
    # A syntax error on reload keeps serving with the last good keys.
    _write(p, "2 not-hex\n")
    assert ks.reload() is False
    assert ks.get(2) == bytes.fromhex(S2)
    assert ks.reload_failures == 1 and "not hex" in (ks.last_error or "")
    # So does a permission mistake.
    _write(p, f"3 {S1}\n", 0o644)
    assert ks.reload() is False and ks.key_ids() == [2]
    # And fixing the file makes the next reload succeed.
    os.chmod(p, 0o600)
    assert ks.reload() is True and ks.key_ids() == [3] and ks.last_error is None
    # An empty file is refused too: a daemon without keys would refuse every request.
    _write(p, "# all keys removed\n")
    assert ks.reload() is False and ks.key_ids() == [3]
    assert ks.reload_failures == 3 and "no keys" in (ks.last_error or "")


def test_sighup_reloads_without_restart(tmp_path: Path) -> None:
    p = _write(tmp_path / "keys", f"1 {S1}\n")
    ks = KeyStore(p)
    previous = signal.signal(signal.SIGHUP, lambda *_: ks.reload())
    try:
        _write(p, f"1 {S1}\n9 {S2}\n")
        os.kill(os.getpid(), signal.SIGHUP)
        # CPython runs the handler in the main thread before os.kill's caller continues.
        assert ks.get(9) == bytes.fromhex(S2)
        assert ks.reloads == 1
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_keystore_from_mapping() -> None:
    ks = KeyStore(keys={5: b"k" * 32})
    assert 5 in ks and len(ks) == 1 and ks.reload() is False
    with pytest.raises(ValueError):
        KeyStore()


# --- replay guard --------------------------------------------------------------------------

class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _us(t: float) -> int:
    return int(t * 1_000_000)


def test_timestamp_skew_window() -> None:
    clk = Clock()
    g = ReplayGuard(clock=clk)
    g.check_timestamp(_us(clk.t - 299.9))
    g.check_timestamp(_us(clk.t + 299.9))
    for off in (-300.5, 300.5, -1e6):
        with pytest.raises(InvalidTimestampError):
            g.check_timestamp(_us(clk.t + off))
    with pytest.raises(InvalidTimestampError):
        g.remember(b"n" * 32, _us(clk.t - 301))
    assert len(g) == 0          # a stale request burns no nonce


def test_replayed_nonce_is_refused() -> None:
    clk = Clock()
    g = ReplayGuard(clock=clk)
    g.remember(b"a" * 32, _us(clk.t))
    clk.t += 59
    with pytest.raises(ExpiredNonceError):
        g.remember(b"a" * 32, _us(clk.t - 59))
    g.remember(b"b" * 32, _us(clk.t))   # another nonce is fine
    assert g.stats["replays"] == 1


def test_nonce_remembered_as_long_as_its_timestamp_is_acceptable() -> None:
    # A client clock 250 s ahead: its requests stay acceptable for ~550 s, so the nonce must
    # be remembered that long, not just 60 s.
    clk = Clock()
    g = ReplayGuard(clock=clk)
    ts = _us(clk.t + 250)
    g.remember(b"f" * 32, ts)
    clk.t += 400
    with pytest.raises(ExpiredNonceError):
        g.remember(b"f" * 32, ts)
    clk.t += 200
    with pytest.raises(InvalidTimestampError):
        g.remember(b"f" * 32, ts)


@settings(max_examples=300)
@given(skew=st.floats(-299.0, 299.0), delay=st.floats(0.0, 2000.0),
       purge=st.booleans())
def test_a_signed_request_is_accepted_at_most_once(skew: float, delay: float,
                                                   purge: bool) -> None:
    """Whatever the client's clock offset and whenever the replay comes, it is refused."""
    clk = Clock()
    g = ReplayGuard(clock=clk)
    ts = _us(clk.t + skew)
    g.remember(b"r" * 32, ts)
    clk.t += delay
    if purge:
        g.purge()
    with pytest.raises((ExpiredNonceError, InvalidTimestampError)):
        g.remember(b"r" * 32, ts)


def test_full_cache_refuses_with_overloaded_rather_than_forgetting() -> None:
    clk = Clock()
    g = ReplayGuard(ReplayConfig(capacity=3, per_key=3), clock=clk)
    for i in range(3):
        g.remember(bytes([i]) * 32, _us(clk.t))
    with pytest.raises(OverloadedError):
        g.remember(b"x" * 32, _us(clk.t))
    # The remembered nonces are all still refused (nothing was forgotten to make room).
    for i in range(3):
        with pytest.raises(ExpiredNonceError):
            g.remember(bytes([i]) * 32, _us(clk.t))
    # Once their retention ends, room comes back.
    clk.t += 301
    g.remember(b"x" * 32, _us(clk.t))
    assert len(g) == 1 and g.stats["full"] == 1


def test_one_key_cannot_take_the_whole_cache() -> None:
    """Key 1 fills its share (half the cache by default) and gets OVERLOADED; key 2 still
    gets in; when key 1's nonces age out, its share comes back."""
    clk = Clock()
    g = ReplayGuard(ReplayConfig(capacity=10), clock=clk)
    assert g.per_key == 5
    for i in range(5):
        g.remember(bytes([1, i]) * 16, _us(clk.t), key_id=1)
    with pytest.raises(OverloadedError, match="this key's share"):
        g.remember(b"\x01\xff" * 16, _us(clk.t), key_id=1)
    for i in range(5):
        g.remember(bytes([2, i]) * 16, _us(clk.t), key_id=2)
    assert (g.live(1), g.live(2), len(g), g.stats["key_full"]) == (5, 5, 10, 1)
    clk.t += 301
    g.remember(b"\x01\xff" * 16, _us(clk.t), key_id=1)
    assert (g.live(1), g.live(2), len(g)) == (1, 0, 1)


def test_purge_bounds_memory_under_steady_traffic() -> None:
    clk = Clock()
    g = ReplayGuard(clock=clk)
    for i in range(5000):
        clk.t += 0.2            # 5 requests/s for 1000 s
        g.remember(i.to_bytes(32, "little"), _us(clk.t))
    # Retention is ~300 s at synchronised clocks: ~1500 live nonces, not 5000.
    assert 1400 <= len(g) <= 1510
