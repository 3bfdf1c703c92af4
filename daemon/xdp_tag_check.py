"""The daemon's check of a request's XDP tag (docs/PROTOCOL.md §6.6), compiled.

protocol/xdp_tag.py is the reference, in pure Python for the SDK (stdlib only); at ~22
SipRounds of Python integer arithmetic it costs tens of microseconds per datagram, more
than the daemon's whole per-datagram budget. This is the same function compiled by numba
(a dependency of the daemon already): about a microsecond with the call. tests/
test_xdp_tag_check.py holds it to the reference and to the SipHash paper's vectors.
"""
from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

import zerolayer.gpu  # noqa: F401 - sets numba's cache directory and device before any njit
from zerolayer.protocol import xdp_tag

_WORDS = xdp_tag.COVERED // 8          # 8 words are covered, the 9th is the tag
_LEN_BLOCK = np.uint64(xdp_tag.COVERED << 56)


@numba.njit(cache=True, nogil=True, inline="always")
def _rotl(x: np.uint64, b: int) -> np.uint64:
    return (x << np.uint64(b)) | (x >> np.uint64(64 - b))


@numba.njit(cache=True, nogil=True)
def siphash24_words(k0: np.uint64, k1: np.uint64, m: npt.NDArray[np.uint64], n_words: int,
                    last: np.uint64) -> np.uint64:
    """SipHash-2-4 of n_words little-endian u64 words m[0:n_words] followed by the final
    block `last` (the tail bytes and the length byte), keys as u64."""
    v0 = k0 ^ np.uint64(0x736F6D6570736575)
    v1 = k1 ^ np.uint64(0x646F72616E646F6D)
    v2 = k0 ^ np.uint64(0x6C7967656E657261)
    v3 = k1 ^ np.uint64(0x7465646279746573)
    for i in range(n_words + 1):
        w = m[i] if i < n_words else last
        v3 ^= w
        for _ in range(2):
            v0 += v1; v1 = _rotl(v1, 13); v1 ^= v0; v0 = _rotl(v0, 32)  # noqa: E702
            v2 += v3; v3 = _rotl(v3, 16); v3 ^= v2  # noqa: E702
            v0 += v3; v3 = _rotl(v3, 21); v3 ^= v0  # noqa: E702
            v2 += v1; v1 = _rotl(v1, 17); v1 ^= v2; v2 = _rotl(v2, 32)  # noqa: E702
        v0 ^= w
    v2 ^= np.uint64(0xFF)
    for _ in range(4):
        v0 += v1; v1 = _rotl(v1, 13); v1 ^= v0; v0 = _rotl(v0, 32)  # noqa: E702
        v2 += v3; v3 = _rotl(v3, 16); v3 ^= v2  # noqa: E702
        v0 += v3; v3 = _rotl(v3, 21); v3 ^= v0  # noqa: E702
        v2 += v1; v1 = _rotl(v1, 17); v1 ^= v2; v2 = _rotl(v2, 32)  # noqa: E702
    return v0 ^ v1 ^ v2 ^ v3


@numba.njit(cache=True, nogil=True)
def _word(d: bytes, i: int) -> np.uint64:
    w = np.uint64(0)
    for j in range(8):
        w |= np.uint64(d[8 * i + j]) << np.uint64(8 * j)
    return w


@numba.njit(cache=True, nogil=True)
def _valid(k0: np.uint64, k1: np.uint64, d: bytes) -> bool:
    """d: the datagram (bytes, at least 72 long). One u64 compare at the end: constant time."""
    m = np.empty(_WORDS, np.uint64)
    for i in range(_WORDS):
        m[i] = _word(d, i)
    m[1] &= ~np.uint64(0xFFFF)           # datagram_len is not covered
    return siphash24_words(k0, k1, m, _WORDS, _LEN_BLOCK) == _word(d, _WORDS)


class XdpTagCheck:
    """valid(key, datagram) as protocol/xdp_tag.valid, compiled; keys' u64 halves cached."""

    def __init__(self) -> None:
        self._keys: dict[bytes, tuple[np.uint64, np.uint64]] = {}
        self(bytes(16), bytes(xdp_tag.OFFSET + xdp_tag.LEN))   # compile (or load) now

    def __call__(self, key: bytes, datagram: bytes) -> bool:
        if len(datagram) < xdp_tag.OFFSET + xdp_tag.LEN:
            return False
        k = self._keys.get(key)
        if k is None:
            if len(self._keys) > 65536:     # keys of reloads long gone
                self._keys.clear()
            k = self._keys[key] = (np.uint64(int.from_bytes(key[:8], "little")),
                                   np.uint64(int.from_bytes(key[8:], "little")))
        return bool(_valid(k[0], k[1], datagram))
