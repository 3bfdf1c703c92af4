"""OpenSSL's SipHash (protocol/siphash_openssl.py) is the reference's function: the paper's
vectors, random keys and lengths, bytes-like inputs, and one context per thread."""
from __future__ import annotations

import random
import threading

import pytest

from test_siphash import KEY, VECTORS
from zerolayer.protocol import siphash, siphash_openssl
from zerolayer.protocol.siphash import siphash24_python

fast = siphash_openssl.load(siphash24_python)
needs_openssl = pytest.mark.skipif(fast is None, reason="no OpenSSL 3 libcrypto in this process")


@needs_openssl
def test_paper_vectors() -> None:
    assert fast is not None
    assert [fast(KEY, bytes(range(n))) for n in range(64)] == VECTORS


@needs_openssl
def test_random_keys_and_lengths_match_the_reference() -> None:
    assert fast is not None
    rng = random.Random(7)
    for _ in range(300):
        key = rng.randbytes(16)
        data = rng.randbytes(rng.randrange(0, 200))
        assert fast(key, data) == siphash24_python(key, data)
    assert fast(bytearray(KEY), memoryview(bytes(range(15)))) == VECTORS[15]
    with pytest.raises(ValueError):
        fast(bytes(15), b"")


@needs_openssl
def test_threads_do_not_share_a_context() -> None:
    """ctypes drops the GIL inside each call: threads hashing at once must each get their
    own answers."""
    assert fast is not None
    wrong: list[int] = []

    def hammer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(400):
            key, data = rng.randbytes(16), rng.randbytes(64)
            if fast(key, data) != siphash24_python(key, data):
                wrong.append(seed)

    threads = [threading.Thread(target=hammer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_without_libcrypto_the_reference_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(siphash_openssl, "_libcrypto", lambda: None)
    assert siphash_openssl.load(siphash24_python) is None
    monkeypatch.setattr(siphash, "_fast", None)
    monkeypatch.setattr(siphash_openssl, "load", lambda reference: None)
    assert siphash.siphash24(KEY, bytes(range(9))) == VECTORS[9]
    assert siphash._fast is siphash24_python


def test_a_wrong_answer_disqualifies_it() -> None:
    """The self-check at load: an implementation that disagrees with the reference on the
    paper's vectors is never used."""
    assert siphash_openssl.load(lambda key, data: 0) is None


@needs_openssl
def test_a_threads_context_is_freed_when_the_thread_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(fast, siphash_openssl._OpenSslSipHash)
    lib = fast._lib
    real_free = lib.EVP_MAC_CTX_free
    freed: list[int] = []

    def counting_free(ctx: int) -> None:
        freed.append(ctx)
        real_free(ctx)

    monkeypatch.setattr(lib, "EVP_MAC_CTX_free", counting_free)
    threads = [threading.Thread(target=fast, args=(KEY, b"x")) for _ in range(20)]
    for t in threads:
        t.start()
        t.join()
    assert len(freed) == 20 and len(set(freed)) <= 20
