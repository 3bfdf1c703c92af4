"""Logprobs on the wire: the INVOKE block that asks for them, and how TOKEN frames carry them.

Only a request that asks pays anything. It sets the INVOKE parameter flag LOGPROBS and a
4-byte block (how many alternatives per token, 0..20); without the flag the body is byte
for byte what it was. The answer rides in the TOKEN frames the text already travels in: the
frame header's reserved u16, zero until now, becomes `lp_len`, the number of bytes at the end
of the body that are logprob entries rather than text. A stream that did not ask has
`lp_len` 0 in every frame, so its frames are exactly today's, and a client that never asks
never sees anything else (docs/PROTOCOL.md §4.2, §5.1).

An entry is one token: its id, its logprob, its bytes. A sampled token's entry says how many
alternatives follow it; the alternatives, best first, come right after it. Entries are
numbered by nothing: their order in the stream (frames in `seq` order, entries in body
order) is the order of the sampled tokens. The daemon keeps a token's entries in one frame
whenever they fit in a fresh one (at the 20-alternative limit that needs tokens of about 50
bytes on average), and only spills them into the next frames otherwise, so `Positions`, the
client's assembler, carries at most one unfinished token from one frame to the next.

The ids are sent with the bytes because the client has no tokenizer: OpenAI's
`logprobs.content[].bytes` is the token's raw bytes, which a client cannot recover from the
text (a token may be half a UTF-8 character, and the stop-string rule may hold text back).
"""
from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import MalformedError
from .sampling_params import MAX_TOP_LOGPROBS

__all__ = ["ALTERNATIVE", "ENTRY", "LOGPROBS_BLOCK", "MAX_TOKEN_BYTES", "MAX_TOP_LOGPROBS",
           "LogprobEntry", "Positions", "TokenLogprob", "TopLogprob", "decode_block",
           "decode_entries", "encode_block", "encode_position", "pack_frames"]

# INVOKE: top_logprobs u8, then 3 reserved bytes (zero; anything else is MALFORMED, so a
# later extension of the block is never misread by this daemon).
LOGPROBS_BLOCK = struct.Struct("<B3s")
# TOKEN entry: token_id u32, logprob f32, top u8, reserved u8, n_bytes u16, then the bytes.
ENTRY = struct.Struct("<IfBBH")
ALTERNATIVE = 0xFF        # `top` of an alternative; a sampled token's `top` is 0..20
# A token's bytes in an entry. No vocabulary we know has a token near this long (the longest
# are runs of spaces, tens of bytes); the cap keeps every entry within one TOKEN frame.
MAX_TOKEN_BYTES = 1024


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One alternative at a position: a token the model could have produced there."""
    token_id: int
    token_bytes: bytes
    logprob: float

    @property
    def token(self) -> str:
        """The token as text; bytes that are part of a character become U+FFFD."""
        return self.token_bytes.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One sampled token: its logprob and the `top_logprobs` most likely tokens at its
    position, best first (ties: lower id first). Logprobs are of the model's distribution
    after penalties, before temperature, top-k and top-p (docs/PROTOCOL.md §5.1)."""
    token_id: int
    token_bytes: bytes
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()

    @property
    def token(self) -> str:
        return self.token_bytes.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """One entry as it travels: `top` is the count of alternatives that follow a sampled
    token, or ALTERNATIVE."""
    token_id: int
    logprob: float
    top: int
    token_bytes: bytes


# --- INVOKE ---------------------------------------------------------------------------------

def encode_block(top_logprobs: int) -> bytes:
    return LOGPROBS_BLOCK.pack(top_logprobs, bytes(3))


def decode_block(body: bytes, off: int) -> int:
    """top_logprobs from the block at `off`; MalformedError if it is cut short, out of range
    or has reserved bytes set."""
    if off + LOGPROBS_BLOCK.size > len(body):
        raise MalformedError("body shorter than the logprobs block")
    top, reserved = LOGPROBS_BLOCK.unpack_from(body, off)
    if reserved != bytes(3):
        raise MalformedError("logprobs block: reserved bytes must be zero")
    if top > MAX_TOP_LOGPROBS:
        raise MalformedError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {top}")
    return int(top)


# --- TOKEN: the daemon's side ---------------------------------------------------------------

def _entry(token_id: int, logprob: float, top: int, token_bytes: bytes) -> bytes:
    b = token_bytes[:MAX_TOKEN_BYTES]
    return ENTRY.pack(token_id, logprob, top, 0, len(b)) + b


def encode_position(token_id: int, logprob: float, token_bytes: bytes,
                    top: Sequence[tuple[int, float, bytes]]) -> tuple[bytes, ...]:
    """The entries of one sampled token, kept apart so that `pack_frames` can cut between
    them: the token, then its alternatives (id, logprob, bytes), best first."""
    if len(top) > MAX_TOP_LOGPROBS:
        raise ValueError(f"at most {MAX_TOP_LOGPROBS} alternatives, got {len(top)}")
    return (_entry(token_id, logprob, len(top), token_bytes),
            *(_entry(i, lp, ALTERNATIVE, b) for i, lp, b in top))


def pack_frames(pieces: Sequence[bytes], n_tokens: int, positions: Iterable[Sequence[bytes]],
                limit: int) -> list[tuple[bytes, bytes, int]]:
    """The TOKEN frames of one engine event: (text, logprob entries, n_tokens) each, text
    plus entries at most `limit` bytes. `pieces` is the event's text already cut at
    character boundaries (wire.split_utf8); the last one carries n_tokens, as without
    logprobs. The entries follow the last piece; a token's entries move whole to a fresh
    frame (empty text, n_tokens 0) when they do not fit where they would go, and are cut
    between entries only when they fit no frame at all."""
    texts = list(pieces) or [b""]
    counts = [0] * (len(texts) - 1) + [n_tokens]
    entries = [bytearray() for _ in texts]
    room = limit - len(texts[-1])
    for pos in positions:
        size = sum(len(e) for e in pos)
        for e in pos:
            # a fresh frame for the token if it fits one but not this one; for an entry only
            # when the token fits no frame and the entry not this one
            if len(e) > room or (e is pos[0] and room < size <= limit):
                texts.append(b"")
                counts.append(0)
                entries.append(bytearray())
                room = limit
            entries[-1] += e
            room -= len(e)
    return [(t, bytes(lp), n) for t, lp, n in zip(texts, entries, counts)]


# --- TOKEN: the client's side ---------------------------------------------------------------

def decode_entries(data: bytes) -> tuple[LogprobEntry, ...]:
    """A TOKEN frame's entries; MalformedError if they do not exactly fill `data`."""
    out = []
    off, end = 0, len(data)
    while off < end:
        if off + ENTRY.size > end:
            raise MalformedError("TOKEN logprob entry cut short")
        token_id, lp, top, reserved, n = ENTRY.unpack_from(data, off)
        off += ENTRY.size
        if reserved or off + n > end or (top > MAX_TOP_LOGPROBS and top != ALTERNATIVE) \
                or math.isnan(lp):
            raise MalformedError("bad TOKEN logprob entry")
        out.append(LogprobEntry(token_id, lp, top, bytes(data[off:off + n])))
        off += n
    return tuple(out)


class Positions:
    """Entries, fed in stream order, become TokenLogprobs: one per sampled token, complete
    once its announced alternatives have all arrived (possibly in a later frame)."""

    __slots__ = ("done", "_head", "_alts")

    def __init__(self) -> None:
        self.done: list[TokenLogprob] = []
        self._head: LogprobEntry | None = None
        self._alts: list[TopLogprob] = []

    def feed(self, entries: Iterable[LogprobEntry]) -> None:
        for e in entries:
            if e.top == ALTERNATIVE:
                if self._head is None:
                    raise MalformedError("a logprob alternative without its token")
                self._alts.append(TopLogprob(e.token_id, e.token_bytes, e.logprob))
            else:
                if self._head is not None:
                    raise MalformedError("a token's logprob alternatives are missing")
                self._head = e
            h = self._head
            if h is not None and len(self._alts) == h.top:
                self.done.append(TokenLogprob(h.token_id, h.token_bytes, h.logprob,
                                              tuple(self._alts)))
                self._head, self._alts = None, []

    def clear(self) -> None:
        """Forget everything (a new run replaced the one these came from)."""
        self.done.clear()
        self._head, self._alts = None, []
