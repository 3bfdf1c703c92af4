"""SipHash-2-4 with a 64-bit output (Aumasson and Bernstein, 2012).

The user-space reference for the per-key tag the XDP program checks (protocol/xdp_tag.py,
bpf/siphash.h): both must give the same 64 bits for the same key and bytes. `siphash24_python`
is the reference, checked against the paper's test vectors (tests/test_siphash.py);
`siphash24` is OpenSSL's (protocol/siphash_openssl.py) where the process has OpenSSL 3, ~10x
faster, and the reference otherwise. A client computes one tag per datagram.
"""
from __future__ import annotations

from collections.abc import Callable

_MASK = (1 << 64) - 1
KEY_LEN = 16

_fast: Callable[[bytes, bytes | bytearray | memoryview], int] | None = None


def siphash24(key: bytes, data: bytes | bytearray | memoryview) -> int:
    """SipHash-2-4 of `data` under the 16-byte `key`, as an unsigned 64-bit integer (its wire
    form is the little-endian u64), by the fastest implementation this process has."""
    global _fast
    if _fast is None:
        # Loaded on first use, so that importing the SDK does not load ctypes.
        from .siphash_openssl import load
        _fast = load(siphash24_python) or siphash24_python
    return _fast(key, data)


def siphash24_python(key: bytes, data: bytes | bytearray | memoryview) -> int:
    """The reference, in pure Python: SipHash-2-4 of `data` under the 16-byte `key`."""
    if len(key) != KEY_LEN:
        raise ValueError(f"SipHash key must be {KEY_LEN} bytes, got {len(key)}")
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    m = bytes(data)
    n = len(m)
    end = n - n % 8
    words = [int.from_bytes(m[off:off + 8], "little") for off in range(0, end, 8)]
    # The last block: the 0..7 remaining bytes, and the length's low byte on top.
    words.append(((n & 0xFF) << 56) | int.from_bytes(m[end:], "little"))
    return _compress(k0, k1, words)


def _compress(k0: int, k1: int, words: list[int]) -> int:
    """The rounds, written out: every SDK datagram pays for them, and a Python call or loop
    per round costs about as much as the round's arithmetic."""
    mask = _MASK
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    for w in words:
        v3 ^= w
        # SipRound, twice (c = 2)
        v0 = (v0 + v1) & mask
        v1 = ((v1 << 13) | (v1 >> 51)) & mask ^ v0
        v0 = ((v0 << 32) | (v0 >> 32)) & mask
        v2 = (v2 + v3) & mask
        v3 = ((v3 << 16) | (v3 >> 48)) & mask ^ v2
        v0 = (v0 + v3) & mask
        v3 = ((v3 << 21) | (v3 >> 43)) & mask ^ v0
        v2 = (v2 + v1) & mask
        v1 = ((v1 << 17) | (v1 >> 47)) & mask ^ v2
        v2 = ((v2 << 32) | (v2 >> 32)) & mask
        v0 = (v0 + v1) & mask
        v1 = ((v1 << 13) | (v1 >> 51)) & mask ^ v0
        v0 = ((v0 << 32) | (v0 >> 32)) & mask
        v2 = (v2 + v3) & mask
        v3 = ((v3 << 16) | (v3 >> 48)) & mask ^ v2
        v0 = (v0 + v3) & mask
        v3 = ((v3 << 21) | (v3 >> 43)) & mask ^ v0
        v2 = (v2 + v1) & mask
        v1 = ((v1 << 17) | (v1 >> 47)) & mask ^ v2
        v2 = ((v2 << 32) | (v2 >> 32)) & mask
        v0 ^= w
    v2 ^= 0xFF
    for _ in range(4):   # d = 4
        v0 = (v0 + v1) & mask
        v1 = ((v1 << 13) | (v1 >> 51)) & mask ^ v0
        v0 = ((v0 << 32) | (v0 >> 32)) & mask
        v2 = (v2 + v3) & mask
        v3 = ((v3 << 16) | (v3 >> 48)) & mask ^ v2
        v0 = (v0 + v3) & mask
        v3 = ((v3 << 21) | (v3 >> 43)) & mask ^ v0
        v2 = (v2 + v1) & mask
        v1 = ((v1 << 17) | (v1 >> 47)) & mask ^ v2
        v2 = ((v2 << 32) | (v2 >> 32)) & mask
    return v0 ^ v1 ^ v2 ^ v3
