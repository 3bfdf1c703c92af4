"""The XDP tag in user space (protocol/xdp_tag.py, docs/PROTOCOL.md §6.6): where it sits, what
it covers, that every fragment of an INVOKE carries the same one, that the SDK sets it, and how
the daemon's ingress treats a right, wrong or missing tag. The kernel side runs the same cases
in tests/test_xdp_auth.py."""
from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from typing import Any

import pytest

from zerolayer.client.retry_policy import RetryPolicy
from zerolayer.daemon.auth import KeyStore, ReplayConfig, ReplayGuard
from zerolayer.daemon.ingress import ControlRequest, Ingress, InvokeRequest, Rejected
from zerolayer.daemon.reassembly import Reassembler
from zerolayer.protocol import wire, xdp_tag
from zerolayer.protocol.errors import ErrorCode, InvalidSignatureError, MalformedError
from zerolayer.protocol.siphash import siphash24
from zerolayer.protocol.wire import MsgType, PayloadKind, SamplingParams

KEY_ID = 5
SECRET = secrets.token_bytes(32)
NOW = 1_700_000_000.0
BODY = wire.encode_invoke_body(SamplingParams(), PayloadKind.PROMPT, b"x" * 3000)


def _ingress(**kw: Any) -> Ingress:
    return Ingress(KeyStore(keys={KEY_ID: SECRET}), ReplayGuard(ReplayConfig(), clock=lambda: NOW),
                   Reassembler(), wall_clock=lambda: NOW, monotonic=lambda: 1.0, **kw)


def _frags(tagged: bool = True, secret: bytes = SECRET) -> list[bytes]:
    return wire.encode_invoke(KEY_ID, secret, secrets.token_bytes(16), int(NOW * 1e6),
                              secrets.token_bytes(32), BODY, xdp_tag=tagged)


def test_key_derivation_is_the_documented_one() -> None:
    want = hmac.new(SECRET, b"zerolayer xdp tag v1", hashlib.sha256).digest()[:16]
    assert xdp_tag.derive_key(SECRET) == want == wire.Mac(SECRET).xdp_key


def test_tag_is_siphash_of_the_first_64_bytes_with_datagram_len_zeroed() -> None:
    frags = _frags()
    assert len(frags) == 3
    key = xdp_tag.derive_key(SECRET)
    for f in frags:
        assert struct.unpack_from("<H", f, 10)[0] == wire.XDP_TAG
        m = bytearray(f[:64])
        m[8:10] = b"\0\0"
        assert f[64:72] == siphash24(key, bytes(m)).to_bytes(8, "little")
        # same nonce (tag included) in every fragment: reassembly keys on it
        assert f[40:72] == frags[0][40:72]
    assert len({len(f) for f in frags}) == 2   # datagram_len differs, the tag does not


def test_control_messages_are_tagged_too() -> None:
    for mt in (MsgType.PING, MsgType.CANCEL, MsgType.RESEND):
        d = wire.encode_control(mt, KEY_ID, SECRET, bytes(16), 1, bytes(32), xdp_tag=True)
        wire.verify_xdp_tag(d, SECRET)
        assert wire.parse_request(d).flags == wire.XDP_TAG


def test_the_sdk_tags_by_default() -> None:
    p = RetryPolicy(key_id=KEY_ID, mac=wire.Mac(SECRET))
    d = p.control(MsgType.PING, bytes(16))
    assert wire.parse_request(d).flags == wire.XDP_TAG
    wire.verify_xdp_tag(d, SECRET)
    untagged = RetryPolicy(key_id=KEY_ID, mac=wire.Mac(SECRET), xdp_tag=False)
    assert wire.parse_request(untagged.control(MsgType.PING, bytes(16))).flags == 0


def test_unknown_flag_bits_are_malformed() -> None:
    d = bytearray(_frags()[0])
    for bit in (0x0001, 0x0004, 0x8000):
        struct.pack_into("<H", d, 10, wire.XDP_TAG | bit)
        with pytest.raises(MalformedError):
            wire.parse_request(bytes(d))


def test_ingress_accepts_tagged_and_untagged() -> None:
    ing = _ingress()
    for tagged in (True, False):
        frags = _frags(tagged)
        results = [ing.feed(f) for f in frags]
        assert isinstance(results[-1], InvokeRequest), results
    ping = wire.encode_control(MsgType.PING, KEY_ID, SECRET, bytes(16), int(NOW * 1e6),
                               secrets.token_bytes(32), xdp_tag=True)
    assert isinstance(ing.feed(ping), ControlRequest)


@pytest.mark.parametrize("offset", [0 + 12, 16, 32, 40, 63, 64, 71])
def test_a_wrong_tag_is_invalid_signature_even_with_a_right_hmac(offset: int) -> None:
    """A bit changed in a covered byte or in the tag, and the HMAC recomputed over the result:
    only the XDP tag is wrong, and ingress refuses it as the kernel would."""
    d = bytearray(_frags()[0][:-32])
    d[offset] ^= 0x01
    if offset == 12:   # key id: keep it known, change the request id instead
        d[12] ^= 0x01
        d[20] ^= 0x01
    forged = bytes(d) + wire.sign(SECRET, d)
    with pytest.raises(InvalidSignatureError):
        wire.verify_xdp_tag(forged, SECRET)
    r = _ingress().feed(forged)
    assert isinstance(r, Rejected) and r.code is ErrorCode.INVALID_SIGNATURE, r
    assert "XDP tag" in r.message and not r.authenticated


def test_datagram_len_and_the_rest_of_the_header_are_not_covered() -> None:
    """Fields that differ between fragments (datagram_len, frag_index, the body) are outside
    the tag: its job is to tell key holders from strangers, not to replace the HMAC."""
    f = _frags()[0]
    key = xdp_tag.derive_key(SECRET)
    assert xdp_tag.valid(key, f[:8] + b"\xff\xff" + f[10:])
    assert xdp_tag.valid(key, f[:72] + bytes(44))


def test_required_tag() -> None:
    ing = _ingress(require_xdp_tag=True)
    r = ing.feed(_frags(tagged=False)[0])
    assert isinstance(r, Rejected) and r.code is ErrorCode.INVALID_SIGNATURE
    assert "requires the XDP tag" in r.message
    assert not isinstance(ing.feed(_frags()[0]), Rejected)


def test_ping_under_a_removed_key_is_unknown_key_even_if_a_request_was_admitted() -> None:
    """§6.1: CANCEL and RESEND of an admitted request keep its key after a rotation; a PING
    does not (it is about no request), so the kernel may drop it as UNKNOWN_KEY."""
    rid = secrets.token_bytes(16)
    old = wire.Mac(secrets.token_bytes(32))
    ing = _ingress(admitted_mac=lambda key: old if key == (9, rid) else None)
    for mt, ok in ((MsgType.PING, False), (MsgType.CANCEL, True), (MsgType.RESEND, True)):
        d = wire.encode_control(mt, 9, old, rid, int(NOW * 1e6), secrets.token_bytes(32),
                                xdp_tag=True)
        r = ing.feed(d)
        if ok:
            assert isinstance(r, ControlRequest), (mt, r)
        else:
            assert isinstance(r, Rejected) and r.code is ErrorCode.UNKNOWN_KEY, r
