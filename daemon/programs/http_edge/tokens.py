"""Bearer tokens -> daemon key ids.

Tokens file: UTF-8, one token per line, `<key_id> <token>` (the same column order as the
daemon's keys file), `#` comments and blank lines ignored. `<token>` is either the token
itself or `sha256:<64 hex digits>`, its SHA-256, so that the file need not hold a usable
token at all. Like the daemon's keys file it must not be readable or writable by group or
others (mode & 0o077 == 0): the edge refuses to start otherwise.

Only SHA-256 digests are kept in memory. A lookup hashes the presented token and compares it
with every stored digest using hmac.compare_digest, visiting all entries whatever matches,
so the time a lookup takes says nothing about which tokens exist or how much of one matched.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable

from zerolayer.daemon.auth import read_private_file

MAX_TOKENS_FILE_BYTES = 1 << 20
MIN_TOKEN_CHARS = 16      # a token shorter than this is guessable; refuse to serve it


class TokenFileError(Exception):
    """The tokens file cannot be used (permissions, syntax, unknown key id)."""


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class TokenTable:
    def __init__(self, entries: Iterable[tuple[bytes, int]]) -> None:
        self._entries = list(entries)
        if not self._entries:
            raise TokenFileError("no tokens: every request would be refused")

    def __len__(self) -> int:
        return len(self._entries)

    def key_ids(self) -> set[int]:
        return {kid for _, kid in self._entries}

    def lookup(self, token: str | None) -> int | None:
        """The key id of a token, or None. Constant time in the token's content."""
        if not token:
            return None
        d = digest(token)
        found: int | None = None
        for stored, kid in self._entries:
            # no early exit: every entry is compared whether or not one matched already
            if hmac.compare_digest(stored, d) and found is None:
                found = kid
        return found


def parse_tokens(text: str, source: str = "<tokens>") -> TokenTable:
    entries: list[tuple[bytes, int]] = []
    seen: set[bytes] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit():
            raise TokenFileError(f"{where}: expected '<key_id> <token>'")
        kid = int(parts[0])
        if not 1 <= kid <= 0xFFFFFFFF:
            raise TokenFileError(f"{where}: key id must be in 1..4294967295")
        tok = parts[1]
        if tok.startswith("sha256:"):
            try:
                d = bytes.fromhex(tok[7:])
            except ValueError:
                raise TokenFileError(f"{where}: sha256: needs 64 hex digits") from None
            if len(d) != 32:
                raise TokenFileError(f"{where}: sha256: needs 64 hex digits")
        else:
            if len(tok) < MIN_TOKEN_CHARS:
                raise TokenFileError(f"{where}: token shorter than {MIN_TOKEN_CHARS} characters")
            d = digest(tok)
        if d in seen:
            raise TokenFileError(f"{where}: duplicate token")
        seen.add(d)
        entries.append((d, kid))
    return TokenTable(entries)


def load_tokens(path: str | os.PathLike[str]) -> TokenTable:
    """Read and check a tokens file: the keys file's rules (daemon/auth.read_private_file)."""
    data = read_private_file(path, MAX_TOKENS_FILE_BYTES, "tokens", TokenFileError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenFileError(f"{path}: not UTF-8") from None
    return parse_tokens(text, str(path))
