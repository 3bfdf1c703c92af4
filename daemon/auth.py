"""Request authentication state: the keys file, and the timestamp/nonce replay guard.

The HMAC itself is computed in wire.py; this module owns what the HMAC needs around it:
which secret belongs to a key id (KeyStore, reloadable on SIGHUP without a restart) and
whether a correctly signed request is fresh (ReplayGuard).

Keys file format (docs/PROTOCOL.md §5): UTF-8 text, one key per line,

    # comment
    <key_id> <secret_hex>

key_id is a decimal u32 in 1..4294967295 (0 means "no key" on the wire); secret_hex is 16 to
64 bytes written as hex (`zerolayer keygen` writes 32). Blank lines and `#` comments are
ignored. The file must not be readable or writable by group or others (mode & 0o077 == 0):
a secret that other local users can read is not a secret, so the daemon refuses to start
rather than run with it.
"""
from __future__ import annotations

import heapq
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from zerolayer.protocol.errors import ExpiredNonceError, InvalidTimestampError, OverloadedError
from zerolayer.protocol.wire import Mac

MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 64
MAX_KEYS_FILE_BYTES = 1 << 20


class KeyFileError(Exception):
    """The keys file cannot be used (permissions, syntax, duplicates)."""


def parse_keys(text: str, source: str = "<keys>") -> dict[int, bytes]:
    keys: dict[int, bytes] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        where = f"{source}:{lineno}"
        if len(parts) != 2:
            raise KeyFileError(f"{where}: expected '<key_id> <secret_hex>'")
        kid_s, hex_s = parts
        if not kid_s.isdigit():
            raise KeyFileError(f"{where}: key id must be a decimal integer")
        kid = int(kid_s)
        if not 1 <= kid <= 0xFFFFFFFF:
            raise KeyFileError(f"{where}: key id must be in 1..4294967295")
        try:
            secret = bytes.fromhex(hex_s)
        except ValueError:
            raise KeyFileError(f"{where}: secret is not hex") from None
        if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
            raise KeyFileError(
                f"{where}: secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes")
        if kid in keys:
            raise KeyFileError(f"{where}: duplicate key id {kid}")
        keys[kid] = secret
    return keys


def read_private_file(path: str | os.PathLike[str], max_bytes: int, what: str,
                      error: type[Exception]) -> bytes:
    """A file holding secrets (`what`: "secrets", "tokens"), refused unless it is a regular
    file no group or other may access, and at most max_bytes. The mode is checked on the
    opened descriptor (fstat), so a file swapped between the check and the read cannot slip
    through. Raises `error` with the path and the fix."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: not a regular file")
        if st.st_mode & 0o077:
            raise error(
                f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets group/others access the "
                f"{what}; run: chmod 600 {path}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{path}: larger than {max_bytes} bytes")
    return data


def load_keys(path: str | os.PathLike[str]) -> dict[int, bytes]:
    """Read and check a keys file (read_private_file's rules)."""
    data = read_private_file(path, MAX_KEYS_FILE_BYTES, "secrets", KeyFileError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: not UTF-8") from None
    return parse_keys(text, str(path))


def generate_secret(nbytes: int = 32) -> bytes:
    """A new random secret for `zerolayer keygen`."""
    if not MIN_SECRET_BYTES <= nbytes <= MAX_SECRET_BYTES:
        raise ValueError(f"secret size must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes")
    return secrets.token_bytes(nbytes)


def format_key_line(key_id: int, secret: bytes) -> str:
    """One keys-file line; parse_keys() reads it back."""
    if not 1 <= key_id <= 0xFFFFFFFF:
        raise ValueError("key id must be in 1..4294967295")
    return f"{key_id} {secret.hex()}\n"


class KeySwitch(Protocol):
    """Another holder of the key set that must follow a reload with no gap: the XDP program's
    copy (bpf/kernel_keys.py). Both take key id -> XDP tag key (wire.Mac.xdp_key)."""

    def prepare(self, new: Mapping[int, bytes]) -> None:
        """Before the swap: accept the old and the new keys."""

    def commit(self, new: Mapping[int, bytes]) -> None:
        """After the swap: the new keys only."""


class KeyStore:
    """key id → secret, swapped atomically on reload().

    Readers call get() from the receive loop; reload() (from a SIGHUP handler or a control
    command) builds a complete new dict and replaces the reference in one assignment, so a
    reader sees either the old or the new key set, never a mix. A bad file on reload keeps
    the old keys: rotating a key must never take the service down.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None,
                 keys: Mapping[int, bytes] | None = None) -> None:
        if (path is None) == (keys is None):
            raise ValueError("give exactly one of path or keys")
        self.path = path
        # Raises KeyFileError at start: an unusable keys file is fatal only at start.
        # One dict holds both the secret and its precomputed MAC state, so a reload swaps
        # them together in a single assignment.
        self._keys = _with_macs(_nonempty(load_keys(path), path) if path is not None
                                else dict(keys or {}))
        self.reloads = 0
        self.reload_failures = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()  # serialises concurrent reloads, not readers

    def get(self, key_id: int) -> bytes | None:
        k = self._keys.get(key_id)
        return k[0] if k is not None else None

    def mac(self, key_id: int) -> Mac | None:
        """The HMAC-SHA256 signer/verifier for a key id (what the hot path uses)."""
        k = self._keys.get(key_id)
        return k[1] if k is not None else None

    def __contains__(self, key_id: int) -> bool:
        return key_id in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def key_ids(self) -> list[int]:
        return sorted(self._keys)

    def xdp_keys(self) -> dict[int, bytes]:
        """key id -> its XDP tag key, what the XDP program's zl_keys holds."""
        return {kid: mac.xdp_key for kid, (_, mac) in self._keys.items()}

    def reload(self, switch: KeySwitch | None = None) -> bool:
        """Re-read the keys file. True: swapped in. False: the old keys stay, and
        last_error says why (the daemon logs it and counts it). `switch` is told before and
        after the swap, so the XDP program never refuses a key this store accepts."""
        if self.path is None:
            return False
        with self._lock:
            try:
                new = _with_macs(_nonempty(load_keys(self.path), self.path))
            except KeyFileError as e:
                self.reload_failures += 1
                self.last_error = str(e)
                return False
            tag_keys = {kid: mac.xdp_key for kid, (_, mac) in new.items()}
            if switch is not None:
                try:
                    switch.prepare(tag_keys)
                except OSError as e:   # the kernel refused an update: keep the old keys
                    self.reload_failures += 1
                    self.last_error = f"XDP key map: {e}"
                    return False
            self._keys = new
            self.reloads += 1
            self.last_error = None
            if switch is not None:
                try:
                    switch.commit(tag_keys)
                except OSError as e:   # the kernel keeps extra keys: lenient, not wrong
                    self.last_error = f"XDP key map (after the swap): {e}"
            return True


def _nonempty(keys: dict[int, bytes], path: str | os.PathLike[str]) -> dict[int, bytes]:
    """A daemon with no keys serves nobody: refused at start, and a reload to an empty file
    keeps the old keys."""
    if not keys:
        raise KeyFileError(f"{path}: no keys in it (the daemon would refuse every request)")
    return keys


def _with_macs(keys: Mapping[int, bytes]) -> dict[int, tuple[bytes, Mac]]:
    return {kid: (secret, Mac(secret)) for kid, secret in keys.items()}


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    skew_s: float = 300.0       # |server clock - request timestamp| allowed
    window_s: float = 60.0      # minimum time a nonce is remembered
    # ~160 bytes per entry in CPython, so the default costs about 80 MB when full; at the
    # usual 300 s retention it absorbs ~1600 signed requests per second.
    capacity: int = 500_000
    # At most this many live nonces per key (0 = capacity // 2): one key holder can't fill the
    # cache and get every other key refused.
    per_key: int = 0


class ReplayGuard:
    """Timestamp window and nonce replay cache.

    A nonce is remembered from first sight until its request's timestamp leaves the accepted
    skew window, and at least `window_s`: retention = max(window_s, ts + skew_s - now). Any
    reuse while remembered gives EXPIRED_NONCE; once forgotten, the same datagram fails the
    timestamp check (INVALID_TIMESTAMP). So a signed datagram is accepted at most once, ever.
    (A plain 60 s nonce cache with ±300 s skew would accept a replay 61..300 s later.)

    When the cache is full of nonces that are still inside their window, new requests are
    refused with OVERLOADED: forgetting a live nonce would reopen replay, refusing only costs
    a retry. Only verified (HMAC-checked) requests reach this cache, so only key holders can
    fill it, and each key only up to `per_key` live nonces (half the cache by default): past
    that, that key's requests get OVERLOADED and the other keys keep their room.
    """

    def __init__(self, config: ReplayConfig = ReplayConfig(),
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        self._expiry: dict[bytes, int] = {}            # nonce -> expiry second
        self._buckets: dict[int, list[bytes]] = {}     # expiry second -> nonces
        self._heap: list[int] = []                     # expiry seconds with a bucket
        self._bucket_keys: dict[int, dict[int, int]] = {}  # expiry second -> key -> nonces
        self._per_key: dict[int, int] = {}             # key -> live nonces
        self.per_key = config.per_key or max(1, config.capacity // 2)
        self.stats = {"remembered": 0, "replays": 0, "stale_timestamps": 0, "full": 0,
                      "key_full": 0, "purged": 0}

    def __len__(self) -> int:
        return len(self._expiry)

    def check_timestamp(self, timestamp_us: int, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        if abs(timestamp_us / 1e6 - now) > self.config.skew_s:
            self.stats["stale_timestamps"] += 1
            raise InvalidTimestampError(
                f"timestamp is {timestamp_us / 1e6 - now:+.1f} s from server time "
                f"(allowed ±{self.config.skew_s:.0f} s)")

    def seen(self, nonce: bytes, now: float | None = None) -> bool:
        now = self._clock() if now is None else now
        exp = self._expiry.get(nonce)
        return exp is not None and exp > now

    def live(self, key_id: int) -> int:
        """Nonces `key_id` has in the cache now."""
        return self._per_key.get(key_id, 0)

    def remember(self, nonce: bytes, timestamp_us: int, now: float | None = None,
                 key_id: int = 0) -> None:
        """Check the timestamp, then record the nonce for `key_id`. Raises
        InvalidTimestampError, ExpiredNonceError or OverloadedError; on success the nonce is
        burnt."""
        now = self._clock() if now is None else now
        # check_timestamp() and seen(), written in: every verified datagram comes here.
        if abs(timestamp_us / 1e6 - now) > self.config.skew_s:
            self.check_timestamp(timestamp_us, now)   # raises, with its message
        exp = self._expiry.get(nonce)
        if exp is not None and exp > now:
            self.stats["replays"] += 1
            raise ExpiredNonceError("nonce already used inside its replay window")
        if (len(self._expiry) >= self.config.capacity
                or self._per_key.get(key_id, 0) >= self.per_key):
            self.purge(now)
            if len(self._expiry) >= self.config.capacity:
                self.stats["full"] += 1
                raise OverloadedError("nonce cache full")
            if self.live(key_id) >= self.per_key:
                self.stats["key_full"] += 1
                raise OverloadedError(f"this key's share of the nonce cache is full "
                                      f"({self.per_key} requests in the replay window)")
        retention = max(self.config.window_s, timestamp_us / 1e6 + self.config.skew_s - now)
        # Round up to whole seconds: one bucket per second keeps the heap tiny.
        exp = int(now + retention) + 1
        self._expiry[nonce] = exp
        bucket = self._buckets.get(exp)
        if bucket is None:
            self._buckets[exp] = bucket = []
            self._bucket_keys[exp] = {}
            heapq.heappush(self._heap, exp)
        bucket.append(nonce)
        bk = self._bucket_keys[exp]
        bk[key_id] = bk.get(key_id, 0) + 1
        self._per_key[key_id] = self._per_key.get(key_id, 0) + 1
        self.stats["remembered"] += 1
        if self._heap[0] <= now:
            self.purge(now)

    def purge(self, now: float | None = None) -> int:
        """Forget nonces whose retention ended. Amortised O(1) per nonce."""
        now = self._clock() if now is None else now
        n = 0
        while self._heap and self._heap[0] <= now:
            exp = heapq.heappop(self._heap)
            for nonce in self._buckets.pop(exp, ()):
                if self._expiry.get(nonce) == exp:
                    del self._expiry[nonce]
                    n += 1
            # every nonce of a bucket leaves with it (a nonce is in exactly one bucket)
            for key_id, k in self._bucket_keys.pop(exp, {}).items():
                left = self._per_key[key_id] - k
                if left:
                    self._per_key[key_id] = left
                else:
                    del self._per_key[key_id]
        self.stats["purged"] += n
        return n
