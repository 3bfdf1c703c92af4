"""The wire protocol's fixed numbers, in one place (docs/PROTOCOL.md §2-§4, §10).

Both sides of the data plane read them from here: protocol/wire.py imports them (the host
parser and encoder), and bpf/loader.py renders them as `#define`s into the XDP program's
source when it compiles it (`#include "zl_wire_consts.h"` gets `c_header()`; there is no
copy on disk to drift). The program then checks exactly the fields the daemon's structural
parser checks; tests/test_xdp_prog.py runs both on the same random and mutated frames.

Offsets are into the UDP payload (the datagram), little-endian, as the C structs of
invoke_structs.h lay them out; protocol/wire.py asserts its struct formats agree.

Change a value here and both sides change; a layout or rule change bumps ZL_VERSION.
"""
from __future__ import annotations

WIRE: dict[str, int] = {
    "ZL_MAGIC": 0x52594C5A,        # "ZLYR" read as a little-endian u32
    "ZL_VERSION": 1,
    "ZL_COMMON_LEN": 32,           # the fixed header every datagram starts with
    "ZL_TAG_LEN": 32,              # HMAC-SHA256 tag at the end of every datagram
    "ZL_MAX_DATAGRAM": 1400,       # UDP payload bytes, tag included
    "ZL_TYPE_INVOKE": 0x01,
    "ZL_TYPE_CANCEL": 0x02,
    "ZL_TYPE_RESEND": 0x03,
    "ZL_TYPE_PING": 0x04,
    "ZL_TYPE_MAX_REQUEST": 0x04,   # requests are 0x01..0x04; responses have bit 7 set
    "ZL_HLEN_INVOKE": 116,         # header_len of an INVOKE fragment
    "ZL_HLEN_CONTROL": 80,         # header_len of CANCEL / RESEND / PING
    "ZL_CONTROL_DGRAM": 112,       # control datagrams have no body: 80 + tag
    "ZL_MIN_CHUNK": 256,           # chunk_len bounds of an INVOKE fragment
    "ZL_MAX_CHUNK": 1252,          # = MAX_DATAGRAM - HLEN_INVOKE - TAG_LEN
    "ZL_PARAMS_LEN": 32,           # smallest INVOKE body: the parameter block
    "ZL_MAX_MESSAGE": 1 << 20,     # largest INVOKE body (1 MiB)
    "ZL_FLAG_XDP_TAG": 0x0002,     # request flags: the nonce ends with the XDP tag
    "ZL_XDP_TAG_OFF": 64,          # the tag's offset; it covers the bytes before it
    "ZL_XDP_TAG_LEN": 8,           # SipHash-2-4, 64-bit
}

_COMMENT = {
    "ZL_MAGIC": '"ZLYR" read as a little-endian u32',
    "ZL_TYPE_MAX_REQUEST": "requests are 0x01..0x04",
    "ZL_CONTROL_DGRAM": "80 + tag: control datagrams have no body",
    "ZL_MAX_CHUNK": "MAX_DATAGRAM - HLEN_INVOKE - TAG_LEN",
    "ZL_FLAG_XDP_TAG": "request flags: the nonce ends with the XDP tag",
}


def c_header() -> str:
    """zl_wire_consts.h, as the XDP program's source includes it."""
    lines = ["/* Generated from protocol/wire_consts.py by bpf/loader.py: do not edit. */",
             "#ifndef __ZL_WIRE_CONSTS_H", "#define __ZL_WIRE_CONSTS_H", ""]
    for name, value in WIRE.items():
        text = f"{value:#x}u" if name in ("ZL_MAGIC", "ZL_FLAG_XDP_TAG") else str(value)
        note = f"  /* {_COMMENT[name]} */" if name in _COMMENT else ""
        lines.append(f"#define {name:<20} {text}{note}")
    lines += ["", "#endif /* __ZL_WIRE_CONSTS_H */", ""]
    return "\n".join(lines)
