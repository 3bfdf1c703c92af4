"""daemon/xdp_tag_check.py, the compiled XDP tag check, against the reference
(protocol/xdp_tag.py) and the SipHash paper's vectors: the daemon and the SDK must agree on
every tag, right or wrong."""
from __future__ import annotations

import random

import numpy as np
import pytest

from test_siphash import KEY, VECTORS
from zerolayer.daemon.xdp_tag_check import XdpTagCheck, siphash24_words
from zerolayer.protocol import wire, xdp_tag


@pytest.fixture(scope="module")
def check() -> XdpTagCheck:
    return XdpTagCheck()


@pytest.mark.parametrize("n", [0, 7, 8, 15, 63])
def test_the_compiled_siphash_meets_the_paper(n: int) -> None:
    msg = bytes(range(n))
    full = n - n % 8
    words = np.frombuffer(msg[:full], "<u8") if full else np.zeros(0, np.uint64)
    last = np.uint64(((n & 0xFF) << 56) | int.from_bytes(msg[full:], "little"))
    k0, k1 = (np.uint64(int.from_bytes(KEY[i:i + 8], "little")) for i in (0, 8))
    assert int(siphash24_words(k0, k1, words, len(words), last)) == VECTORS[n]


def test_the_compiled_check_agrees_with_the_reference(check: XdpTagCheck) -> None:
    rng = random.Random(6)
    seen = {True: 0, False: 0}
    for _ in range(400):
        mac = wire.Mac(rng.randbytes(rng.choice([16, 32, 64])))
        if rng.random() < 0.5:
            d = wire.encode_control(wire.MsgType.PING, rng.randrange(1, 1 << 32), mac,
                                    rng.randbytes(16), rng.getrandbits(64), rng.randbytes(32),
                                    xdp_tag=True)
        else:
            d = wire.encode_invoke(rng.randrange(1, 1 << 32), mac, rng.randbytes(16),
                                   rng.getrandbits(64), rng.randbytes(32),
                                   rng.randbytes(rng.randrange(32, 3000)),
                                   xdp_tag=True)[rng.randrange(1)]
        if rng.random() < 0.5:
            b = bytearray(d)
            b[rng.randrange(72)] ^= 1 << rng.randrange(8)
            d = bytes(b)
        key = mac.xdp_key if rng.random() < 0.9 else rng.randbytes(16)
        want = xdp_tag.valid(key, d)
        assert check(key, d) is want
        seen[want] += 1
    assert min(seen.values()) > 100, seen
    assert check(bytes(16), bytes(71)) is False       # too short for a tag
