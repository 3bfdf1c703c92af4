"""The XDP tag: a 64-bit SipHash-2-4 tag that the kernel can check before user space sees a
datagram (docs/PROTOCOL.md §6.6).

The HMAC-SHA256 tag at the end of every request stays the authority; this one only lets the
XDP program drop forgeries in the driver. It is keyed per key id with a 128-bit key derived
from the key's secret, so only a key holder can make it, and it is cheap enough to verify per
packet in BPF (a few hundred ALU instructions, no helpers).

Layout, with flag XDP_TAG set in the common header:
- the tag is the u64 little-endian at offset 64: the last 8 bytes of the 32-byte nonce (the
  nonce is then 24 random bytes and the tag; still 32 bytes, the same in every fragment);
- it is SipHash-2-4(k, datagram[0:64]) with `datagram_len` (offset 8, 2 bytes) read as zero:
  the common header, the timestamp and the nonce's 24 random bytes. Only fields every
  fragment of an INVOKE shares are covered, so all fragments carry the same tag and nonce;
- k = HMAC-SHA256(secret, "zerolayer xdp tag v1")[:16], SipHash's k0 = k[0:8], k1 = k[8:16]
  as little-endian u64.
"""
from __future__ import annotations

import hmac

from .siphash import siphash24
from .wire_consts import WIRE

DERIVE_LABEL = b"zerolayer xdp tag v1"
KEY_LEN = 16
FLAG = WIRE["ZL_FLAG_XDP_TAG"]           # request flags bit: the nonce ends with the tag
COVERED = WIRE["ZL_XDP_TAG_OFF"]         # bytes [0, 64) are covered ...
OFFSET = WIRE["ZL_XDP_TAG_OFF"]          # ... and the tag follows them
LEN = WIRE["ZL_XDP_TAG_LEN"]             # 8
_DGRAM_LEN_AT = 8                        # datagram_len: differs between fragments


def derive_key(secret: bytes) -> bytes:
    """The 128-bit SipHash key of a key id, from its keys-file secret."""
    return hmac.digest(secret, DERIVE_LABEL, "sha256")[:KEY_LEN]


def covered(prefix: bytes | bytearray | memoryview) -> bytes:
    """The bytes the tag is computed over: prefix[0:64] with datagram_len zeroed."""
    if len(prefix) < COVERED:
        raise ValueError(f"need the first {COVERED} bytes of the datagram")
    b = bytearray(prefix[:COVERED])
    b[_DGRAM_LEN_AT:_DGRAM_LEN_AT + 2] = b"\0\0"
    return bytes(b)


def compute(key: bytes, prefix: bytes | bytearray | memoryview) -> bytes:
    """The 8 tag bytes (as they go on the wire) for a datagram's first 64 bytes."""
    return siphash24(key, covered(prefix)).to_bytes(LEN, "little")


def valid(key: bytes, datagram: bytes | bytearray | memoryview) -> bool:
    """Whether the tag at offset 64 is right under `key` (constant-time compare: a wrong
    tag must not tell how many of its bytes were right)."""
    if len(datagram) < OFFSET + LEN:
        return False
    return hmac.compare_digest(compute(key, datagram), bytes(datagram[OFFSET:OFFSET + LEN]))
