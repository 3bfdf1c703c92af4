"""The XDP program's authentication checks (bpf/invoke_auth.h) against the daemon's ingress
(daemon/ingress.py): key id, XDP tag, timestamp window, and key rotation.

The real program, compiled by BCC, runs every datagram through BPF_PROG_TEST_RUN with the
real clock, and the daemon's real Ingress (KeyStore, ReplayGuard, HMAC) judges the same
datagram. The rule the kernel must keep (docs/PROTOCOL.md §10): it drops only what the daemon
refuses, with the same error class (loader.REASON_ERROR), and passes everything the daemon
accepts. Timestamps are drawn well inside or well outside the window (the program's margin,
kernel_keys.CLOCK_MARGIN_S, is tested on its own), so no verdict depends on how fast the
machine is.
"""
from __future__ import annotations

import os
import random
import secrets
import struct
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from fixtures.packets import udp4, udp6
from zerolayer.daemon.auth import KeyStore, ReplayConfig, ReplayGuard
from zerolayer.daemon.ingress import Ingress, Rejected
from zerolayer.daemon.reassembly import Reassembler
from zerolayer.protocol import wire
from zerolayer.protocol.errors import ErrorCode
from zerolayer.protocol.wire import MsgType, PayloadKind, SamplingParams

if os.geteuid() != 0:  # pragma: no cover - CI runs as root
    pytest.skip("loading BPF programs needs root", allow_module_level=True)

from zerolayer.bpf import loader  # noqa: E402
from zerolayer.bpf.kernel_keys import CLOCK_MARGIN_S, KernelKeys  # noqa: E402
from zerolayer.bpf.loader import XDP_DROP, XDP_PASS, InvokeSteer  # noqa: E402

PORT = 7433
SKEW_S = 300.0
SECRETS = {1: secrets.token_bytes(32), 2: secrets.token_bytes(24), 70000: secrets.token_bytes(64)}
BODY = wire.encode_invoke_body(SamplingParams(max_tokens=4), PayloadKind.PROMPT, b"hello")
BIG_BODY = wire.encode_invoke_body(SamplingParams(), PayloadKind.PROMPT, b"y" * 2600)


@pytest.fixture(scope="module")
def prog():
    p = InvokeSteer.compile(ports=[PORT])
    yield p
    p.close()


def _clear(p: InvokeSteer) -> None:
    for kid in p.tag_keys():
        p.delete_tag_key(kid)
    p.set_auth(0, 0, 0)
    p.set_rate(0)
    p.reset_stats()


@pytest.fixture()
def xdp(prog):
    _clear(prog)
    yield prog
    _clear(prog)


def kernel(p: InvokeSteer, dg: bytes, v6: bool = False) -> str:
    """The reason the program counted for one datagram ("redirect"/"pass_no_xsk" = passed)."""
    before = p.stats()
    r = p.test_run(udp6(dg, PORT) if v6 else udp4(dg, PORT))
    moved = [k for k, v in p.stats().items() if v != before[k]]
    assert len(moved) == 1, moved   # every outcome is counted, once
    assert (r.action == XDP_DROP) == moved[0].startswith("drop_"), (r.action, moved)
    assert r.action in (XDP_DROP, XDP_PASS)
    return moved[0]


def daemon(keys: KeyStore, dg: bytes, *, require_tag: bool = False,
           admitted: Mapping[tuple[int, bytes], wire.Mac] | None = None) -> ErrorCode | None:
    """The daemon's verdict: None = accepted (a request, or a fragment buffered).
    `admitted`: the requests running, (key id, request id) -> the key they came under."""
    ing = Ingress(keys, ReplayGuard(ReplayConfig(skew_s=SKEW_S)), Reassembler(),
                  require_xdp_tag=require_tag, admitted_mac=(admitted or {}).get)
    r = ing.feed(dg)
    assert not (isinstance(r, Rejected) and r.code is ErrorCode.INTERNAL), r
    return r.code if isinstance(r, Rejected) else None


def agree(reason: str, verdict: ErrorCode | None) -> bool:
    """The kernel's reason and the daemon's verdict keep the rule."""
    if reason.startswith("drop_"):
        return verdict is loader.REASON_ERROR[reason]
    return True   # passed: the daemon decides (accepts, or refuses what the kernel can't see)


def now_us() -> int:
    return time.time_ns() // 1000


def invoke(kid: int, secret: bytes, *, ts: int | None = None, tagged: bool = True,
           body: bytes = BODY) -> list[bytes]:
    return wire.encode_invoke(kid, secret, secrets.token_bytes(16),
                              now_us() if ts is None else ts, secrets.token_bytes(32), body,
                              xdp_tag=tagged)


def control(mt: MsgType, kid: int, secret: bytes, *, ts: int | None = None,
            tagged: bool = True) -> bytes:
    return wire.encode_control(mt, kid, secret, secrets.token_bytes(16),
                               now_us() if ts is None else ts, secrets.token_bytes(32),
                               arg=5 if mt is MsgType.RESEND else 0, xdp_tag=tagged)


def resign(dg: bytes | bytearray, secret: bytes) -> bytes:
    """Recompute the HMAC over a changed datagram: only the XDP tag is then wrong."""
    return bytes(dg[:-32]) + wire.sign(secret, bytes(dg[:-32]))


def publish(p: InvokeSteer, secrets_by_id: Mapping[int, bytes], **kw) -> KernelKeys:
    kk = KernelKeys(p, skew_s=SKEW_S, **kw)
    kk.publish({kid: wire.Mac(s).xdp_key for kid, s in secrets_by_id.items()})
    return kk


# --- the generated cases ------------------------------------------------------------------------

def _cases(rng: random.Random) -> list[tuple[str, bytes, str, ErrorCode | None]]:
    """(class, datagram, the kernel's reason, the daemon's verdict) that the protocol asks
    for; None for the kernel's reason means "passed" (redirect or pass_no_xsk)."""
    out: list[tuple[str, bytes, str, ErrorCode | None]] = []
    kids = list(SECRETS)
    for _ in range(40):
        kid = rng.choice(kids)
        s = SECRETS[kid]
        off = rng.randint(-250, 250) * 1_000_000
        stale = rng.choice([-1, 1]) * rng.randint(int(SKEW_S + CLOCK_MARGIN_S) + 5, 10**6) * 10**6
        mt = rng.choice([MsgType.PING, MsgType.CANCEL, MsgType.RESEND])
        unknown = rng.choice([3, 4, 99, 0xFFFFFFFF])
        out += [
            ("valid_tagged_invoke", invoke(kid, s, ts=now_us() + off)[0], "pass", None),
            ("valid_untagged_invoke", invoke(kid, s, tagged=False)[0], "pass", None),
            ("valid_tagged_control", control(mt, kid, s, ts=now_us() + off), "pass", None),
            ("valid_untagged_control", control(mt, kid, s, tagged=False), "pass", None),
            ("unknown_key_invoke", invoke(unknown, s)[0], "drop_unknown_key",
             ErrorCode.UNKNOWN_KEY),
            ("unknown_key_ping", control(MsgType.PING, unknown, s), "drop_unknown_key",
             ErrorCode.UNKNOWN_KEY),
            # a key id not held, retired ones included: no running request is under it
            ("unknown_key_cancel", control(MsgType.CANCEL, unknown, s), "drop_unknown_key",
             ErrorCode.UNKNOWN_KEY),
            ("stale_tagged", invoke(kid, s, ts=now_us() + stale)[0], "drop_stale_timestamp",
             ErrorCode.INVALID_TIMESTAMP),
            # untagged: the timestamp is unauthenticated in the kernel, the daemon decides
            ("stale_untagged", control(mt, kid, s, ts=now_us() + stale, tagged=False),
             "pass", ErrorCode.INVALID_TIMESTAMP),
        ]
        # wrong tag: a covered byte or a tag byte flipped, with the HMAC right (a key holder's
        # bug) or wrong (a forger's datagram)
        d = bytearray(rng.choice([invoke(kid, s)[0], control(mt, kid, s)]))
        # request id, timestamp's low bytes, nonce, tag: nothing the structure checks
        d[rng.choice([16, 20, 31, 32, 33, 40, 50, 63]) if rng.random() < 0.5
          else rng.randrange(64, 72)] ^= 1 << rng.randrange(8)
        out.append(("wrong_tag_right_hmac", resign(d, s), "drop_bad_tag",
                    ErrorCode.INVALID_SIGNATURE))
        out.append(("wrong_tag_wrong_hmac", bytes(d), "drop_bad_tag",
                    ErrorCode.INVALID_SIGNATURE))
        # a forger's datagram under a real key id: random tag, random HMAC
        forged = bytearray(invoke(kid, secrets.token_bytes(32))[0])
        out.append(("forged_invoke", bytes(forged), "drop_bad_tag",
                    ErrorCode.INVALID_SIGNATURE))
        # the right tag with a wrong HMAC (a changed body): only the daemon can tell
        body_changed = bytearray(invoke(kid, s)[0])
        body_changed[130] ^= 1
        out.append(("right_tag_wrong_hmac", bytes(body_changed), "pass",
                    ErrorCode.INVALID_SIGNATURE))
        out.append(("malformed", bytes(d[:4]) + b"\x07" + bytes(d[5:]), "drop_bad_version",
                    ErrorCode.MALFORMED))
    # every fragment of a tagged multi-fragment INVOKE passes with the same tag
    for f in invoke(1, SECRETS[1], body=BIG_BODY):
        out.append(("fragment", f, "pass", None))
    return out


def test_generated_cases_agree_with_the_daemon(xdp) -> None:
    """Differential, by class: every datagram gets the kernel reason and daemon verdict its
    class calls for, so the two sides agree on drop/pass and on the reason."""
    keys = KeyStore(keys=SECRETS)
    publish(xdp, SECRETS)
    seen: dict[str, int] = {}
    for i, (cls, dg, want_kernel, want_daemon) in enumerate(_cases(random.Random(39))):
        got_kernel = kernel(xdp, dg, v6=bool(i % 2))
        got_daemon = daemon(keys, dg)
        if want_kernel == "pass":
            assert got_kernel in ("redirect", "pass_no_xsk"), (cls, got_kernel, dg.hex())
        else:
            assert got_kernel == want_kernel, (cls, got_kernel, dg.hex())
        assert got_daemon is want_daemon, (cls, got_daemon, dg.hex())
        assert agree(got_kernel, got_daemon), (cls, got_kernel, got_daemon)
        seen[cls] = seen.get(cls, 0) + 1
    assert len(seen) == 15 and min(seen.values()) >= 3, seen
    stats = xdp.stats()
    for reason in ("drop_unknown_key", "drop_bad_tag", "drop_stale_timestamp"):
        assert stats[reason] >= 40, (reason, stats)


def _mutants(rng: random.Random, n: int) -> list[bytes]:
    """Valid datagrams with 1-3 bytes of their first 72 overwritten (header, timestamp,
    nonce, tag), HMAC left as it was or recomputed: every check here and in the daemon."""
    out = []
    for _ in range(n):
        kid = rng.choice(list(SECRETS))
        s = SECRETS[kid]
        d = bytearray(rng.choice([
            invoke(kid, s)[0], invoke(kid, s, tagged=False)[0],
            control(rng.choice(list(wire.CONTROL_TYPES)), kid, s),
            control(MsgType.PING, kid, s, tagged=False)]))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(72)
            if i in (36, 37, 38, 39):        # timestamp's high bytes: far off
                d[i] = rng.randrange(256)
            elif 32 <= i < 36:               # its low bytes: up to ~70 min off, or not at all
                d[i] ^= rng.choice([0, 1 << rng.randrange(8)])
            else:
                d[i] = rng.choice([0, 1, 2, 3, 4, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        out.append(resign(d, s) if rng.random() < 0.5 else bytes(d))
    return out


def test_mutants_keep_the_rule(xdp) -> None:
    """Differential on random mutants: a drop's reason is always the daemon's refusal, and
    everything the daemon accepts passes."""
    keys = KeyStore(keys=SECRETS)
    publish(xdp, SECRETS)
    counts: dict[str, int] = {}
    for i, dg in enumerate(_mutants(random.Random(93), 1500)):
        reason = kernel(xdp, dg, v6=bool(i % 2))
        verdict = daemon(keys, dg)
        if abs(abs(int.from_bytes(dg[32:40], "little") - now_us()) / 1e6 - SKEW_S) < 5:
            continue   # within seconds of the edge: the margin's own test covers it
        assert agree(reason, verdict), (reason, verdict, dg.hex())
        if verdict is None:
            assert not reason.startswith("drop_")
        counts[reason] = counts.get(reason, 0) + 1
    # (no drop_stale_timestamp here: the tag covers the timestamp, so a mutated one fails
    # the tag first; the generated cases cover it)
    for reason in ("pass_no_xsk", "drop_bad_tag", "drop_unknown_key", "drop_bad_magic",
                   "drop_bad_flags"):
        assert counts.get(reason, 0) >= 5, counts


def test_the_timestamp_margin_is_lenient_only(xdp) -> None:
    """Inside the kernel's margin (the daemon's ±300 s plus CLOCK_MARGIN_S) the kernel
    passes what the daemon refuses; beyond it both refuse; inside ±300 s both accept."""
    keys = KeyStore(keys=SECRETS)
    publish(xdp, SECRETS)
    s = SECRETS[1]
    for sign in (-1, 1):
        edge = (SKEW_S + CLOCK_MARGIN_S / 2) * 1e6
        d = invoke(1, s, ts=now_us() + sign * int(edge))[0]
        assert kernel(xdp, d) == "pass_no_xsk"
        assert daemon(keys, d) is ErrorCode.INVALID_TIMESTAMP
        d = invoke(1, s, ts=now_us() + sign * int((SKEW_S + CLOCK_MARGIN_S + 5) * 1e6))[0]
        assert kernel(xdp, d) == "drop_stale_timestamp"
        d = invoke(1, s, ts=now_us() + sign * int((SKEW_S - 5) * 1e6))[0]
        assert kernel(xdp, d) == "pass_no_xsk" and daemon(keys, d) is None


def test_the_published_clock_offset_is_what_the_window_uses(xdp) -> None:
    """A wall clock stepped by 10 minutes after the offset was published makes the kernel
    judge against the old time; the next refresh puts it right."""
    kk = publish(xdp, SECRETS)
    flags, skew, offset = xdp.auth()
    assert flags == loader.AUTH_KEYS and skew == int((SKEW_S + CLOCK_MARGIN_S) * 1e6)
    assert abs(offset - (time.time_ns() - time.monotonic_ns())) < 1e9
    xdp.set_auth(flags, skew, offset - 600 * 10**9)      # as if the clock stepped 10 min
    d = invoke(1, SECRETS[1])[0]
    assert kernel(xdp, d) == "drop_stale_timestamp"
    assert kk.refresh_clock(now=time.monotonic() + 2)
    assert kernel(xdp, d) == "pass_no_xsk"


def test_checks_are_off_until_the_daemon_publishes(xdp) -> None:
    """A fresh program (zl_auth_cfg all zero) is lenient: unknown keys, stale timestamps and
    tags it has no key for all pass to the daemon, which refuses them itself."""
    xdp.set_tag_key(1, wire.Mac(SECRETS[1]).xdp_key)
    for d in (invoke(5, SECRETS[1])[0], invoke(1, SECRETS[1], ts=1)[0]):
        assert kernel(xdp, d) == "pass_no_xsk"


def test_required_tag(xdp) -> None:
    keys = KeyStore(keys=SECRETS)
    publish(xdp, SECRETS, require_tag=True)
    assert xdp.auth()[0] == loader.AUTH_KEYS | loader.AUTH_REQUIRE_TAG
    for d in (invoke(1, SECRETS[1], tagged=False)[0],
              control(MsgType.PING, 2, SECRETS[2], tagged=False)):
        assert kernel(xdp, d) == "drop_untagged"
        assert daemon(keys, d, require_tag=True) is ErrorCode.INVALID_SIGNATURE
    d = invoke(1, SECRETS[1])[0]
    assert kernel(xdp, d) == "pass_no_xsk" and daemon(keys, d, require_tag=True) is None


# --- key rotation ---------------------------------------------------------------------------

def _write_keys(path: Path, secrets_by_id: Mapping[int, bytes]) -> None:
    path.write_text("".join(f"{kid} {s.hex()}\n" for kid, s in secrets_by_id.items()))
    path.chmod(0o600)


class ProbedSwitch:
    """KernelKeys with a probe at every step of a rotation: before the kernel moves, after
    its prepare, after the daemon's swap (the start of commit) and after commit. At each the
    probe sends every datagram through the kernel and the daemon as they are at that moment,
    and records both verdicts."""

    def __init__(self, kk: KernelKeys, keys: KeyStore, datagrams: dict[str, bytes]) -> None:
        self.kk, self.keys, self.datagrams = kk, keys, datagrams
        self.steps: list[tuple[str, dict[str, tuple[str, ErrorCode | None]]]] = []
        self.checks_keys: dict[str, bool] = {}

    def probe(self, step: str) -> None:
        self.checks_keys[step] = self.kk.checks_keys
        self.steps.append((step, {name: (kernel(self.kk.prog, d), daemon(self.keys, d))
                                  for name, d in self.datagrams.items()}))

    def prepare(self, new: Mapping[int, bytes]) -> None:
        self.probe("before")
        self.kk.prepare(new)
        self.probe("prepared")

    def commit(self, new: Mapping[int, bytes]) -> None:
        self.probe("swapped")
        self.kk.commit(new)
        self.probe("committed")


def _rotation_datagrams(old: Mapping[int, bytes], new: Mapping[int, bytes]) -> dict[str, bytes]:
    out = {}
    for label, table in (("old", old), ("new", new)):
        for kid, s in table.items():
            out[f"{label}{kid}_invoke"] = invoke(kid, s)[0]
            out[f"{label}{kid}_ping"] = control(MsgType.PING, kid, s)
    return out


@pytest.mark.parametrize("max_keys", [4096, 2], ids=["room", "map_full"])
def test_rotation_never_drops_what_the_daemon_accepts(tmp_path, max_keys, request) -> None:
    """Key 1 keeps its id with a new secret, key 2 is removed, key 3 is added. At every step
    of the reload, a datagram the daemon accepts passes the kernel; after it, the kernel
    refuses exactly the old ones again. With room for only 2 keys the kernel cannot hold the
    union, so the unknown-key check is off between the steps and back on after."""
    prog = request.getfixturevalue("prog") if max_keys == 4096 else InvokeSteer.compile(
        ports=[PORT], defines={"ZL_MAX_KEYS": max_keys})
    try:
        _clear(prog)
        old = {1: secrets.token_bytes(32), 2: secrets.token_bytes(32)}
        new = {1: secrets.token_bytes(32), 3: secrets.token_bytes(32)}
        path = tmp_path / "keys"
        _write_keys(path, old)
        keys = KeyStore(path)
        kk = KernelKeys(prog, skew_s=SKEW_S)
        kk.publish(keys.xdp_keys())
        switch = ProbedSwitch(kk, keys, _rotation_datagrams(old, new))
        _write_keys(path, new)
        assert keys.reload(switch)
        switch.probe("after")
        steps = dict(switch.steps)
        assert list(steps) == ["before", "prepared", "swapped", "committed", "after"]
        for step, verdicts in switch.steps:
            for name, (reason, verdict) in verdicts.items():
                assert agree(reason, verdict), (step, name, reason, verdict)
                if verdict is None:
                    assert not reason.startswith("drop_"), (step, name, reason)
        # the daemon moved from the old set to the new one at the swap ...
        assert steps["prepared"]["old2_invoke"][1] is None
        assert steps["swapped"]["old2_invoke"][1] is ErrorCode.UNKNOWN_KEY
        assert steps["prepared"]["new3_invoke"][1] is ErrorCode.UNKNOWN_KEY
        assert steps["swapped"]["new3_invoke"][1] is None
        # ... the kernel let both through in between, and is strict again after
        assert steps["prepared"]["new3_invoke"][0] == "pass_no_xsk"
        assert steps["prepared"]["new1_invoke"][0] == "pass_no_xsk"
        assert steps["swapped"]["old1_invoke"][0] == "pass_no_xsk"
        after = steps["after"]
        assert after["old2_invoke"][0] == after["old2_ping"][0] == "drop_unknown_key"
        assert after["old1_invoke"][0] == after["old1_ping"][0] == "drop_bad_tag"
        assert after["new1_invoke"][0] == after["new3_ping"][0] == "pass_no_xsk"
        assert kk.checks_keys and set(prog.tag_keys()) == {1, 3}
        assert all(prev is None for _, prev in prog.tag_keys().values())
        assert steps["before"]["new3_invoke"][0] == "drop_unknown_key"
        # the union of 3 ids fits 4096 entries, not 2: then the key check was off between
        assert switch.checks_keys == {"before": True, "prepared": max_keys > 2,
                                      "swapped": max_keys > 2, "committed": True,
                                      "after": True}
    finally:
        if max_keys != 4096:
            prog.close()


def test_a_refused_reload_leaves_the_kernel_as_it_was(xdp, tmp_path) -> None:
    path = tmp_path / "keys"
    _write_keys(path, {1: SECRETS[1]})
    keys = KeyStore(path)
    kk = KernelKeys(xdp, skew_s=SKEW_S)
    kk.publish(keys.xdp_keys())
    held = xdp.tag_keys()
    path.write_text("not a keys file\n")
    assert not keys.reload(kk)
    assert xdp.tag_keys() == held and kk.checks_keys
    assert kernel(xdp, invoke(1, SECRETS[1])[0]) == "pass_no_xsk"


def test_tag_keys_round_trip_through_the_map(xdp) -> None:
    a, b = secrets.token_bytes(16), secrets.token_bytes(16)
    xdp.set_tag_key(9, a)
    xdp.set_tag_key(10, b, prev=a)
    assert xdp.tag_keys() == {9: (a, None), 10: (b, a)}
    with pytest.raises(ValueError):
        xdp.set_tag_key(0, a)
    with pytest.raises(ValueError):
        xdp.set_tag_key(1, a[:8])
    assert struct.calcsize("=QQQQII") == xdp.table("zl_keys").value_size


def test_auth_compiles_out_with_zl_auth_0() -> None:
    """-DZL_AUTH=0 leaves the structural checks only: a forgery under a held key passes."""
    p = InvokeSteer.compile(ports=[PORT], defines={"ZL_AUTH": 0})
    try:
        publish(p, SECRETS)
        forged = invoke(1, secrets.token_bytes(32))[0]
        assert kernel(p, forged) == "pass_no_xsk"
        assert kernel(p, b"XXXX" + forged[4:]) == "drop_bad_magic"
    finally:
        p.close()


def test_a_removed_key_stays_retired_while_its_requests_run(xdp, tmp_path) -> None:
    """§6.1: a request admitted under a key the reload removes keeps its CANCEL and RESEND.
    The kernel keeps the id, retired: those pass, its INVOKEs and PINGs are UNKNOWN_KEY, and
    once the request ends the id goes within a refresh, so a stranger's CANCEL/RESEND under
    it never reaches the daemon."""
    old, kept = secrets.token_bytes(32), secrets.token_bytes(32)
    path = tmp_path / "keys"
    _write_keys(path, {1: kept, 2: old})
    keys = KeyStore(path)
    rid = secrets.token_bytes(16)
    running: dict[int, list[bytes]] = {}
    admitted: dict[tuple[int, bytes], wire.Mac] = {}
    kk = KernelKeys(xdp, skew_s=SKEW_S, running=lambda: running)
    kk.publish(keys.xdp_keys())
    running[2] = [wire.Mac(old).xdp_key]          # admitted under key 2, still running
    admitted[(2, rid)] = wire.Mac(old)

    def its(mt: MsgType) -> bytes:
        return wire.encode_control(mt, 2, old, rid, now_us(), secrets.token_bytes(32),
                                   arg=3 if mt is MsgType.RESEND else 0, xdp_tag=True)
    datagrams = {"cancel": its(MsgType.CANCEL), "resend": its(MsgType.RESEND),
                 "ping": control(MsgType.PING, 2, old), "invoke": invoke(2, old)[0],
                 "forged_cancel": wire.encode_control(MsgType.CANCEL, 2, secrets.token_bytes(32),
                                                      rid, now_us(), bytes(32), xdp_tag=True)}
    verdicts = {}
    _write_keys(path, {1: kept})
    switch = ProbedSwitch(kk, keys, datagrams)
    switch.probe = lambda step: verdicts.__setitem__(step, {   # type: ignore[method-assign]
        n: (kernel(xdp, d), daemon(keys, d, admitted=admitted)) for n, d in datagrams.items()})
    assert keys.reload(switch)
    switch.probe("after")
    for step, by_name in verdicts.items():
        for name, (reason, verdict) in by_name.items():
            assert agree(reason, verdict), (step, name, reason, verdict)
            if verdict is None:
                assert not reason.startswith("drop_"), (step, name)
    after = verdicts["after"]
    assert after["cancel"] == after["resend"] == ("pass_no_xsk", None)
    assert after["ping"] == after["invoke"] == ("drop_unknown_key", ErrorCode.UNKNOWN_KEY)
    assert after["forged_cancel"][0] == "drop_bad_tag"
    assert xdp.retired_key_ids() == {2} and kk.checks_keys
    # the request ends: the daemon forgets its key, and the kernel the retired id
    running.clear()
    admitted.clear()
    assert kk.refresh_clock(now=time.monotonic() + 2)
    assert xdp.retired_key_ids() == set() and set(xdp.tag_keys()) == {1}
    d = its(MsgType.CANCEL)
    assert (kernel(xdp, d), daemon(keys, d)) == ("drop_unknown_key", ErrorCode.UNKNOWN_KEY)
