"""Stop strings over a stream of text chunks.

Text that could still turn into a stop string is held back, so the caller never streams
text it would later have to retract; when a stop string completes, everything from its
start on is dropped and generation ends.
"""
from __future__ import annotations


class StopChecker:
    def __init__(self, stops: tuple[str, ...] | list[str] = ()):
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, once stopped

    def push(self, text: str) -> str:
        """Feed new text; return what can be released now."""
        if self.stopped or not self.stops:
            return "" if self.stopped else text
        buf = self._held + text
        # the earliest match; at one position, the first stop string in the request's order
        hit, self.matched = min(((i, k, s) for k, s in enumerate(self.stops)
                                 if (i := buf.find(s)) >= 0), default=(-1, 0, None))[::2]
        if hit >= 0:
            self.stopped = True
            self._held = ""
            return buf[:hit]
        keep = 0  # longest suffix of buf that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:n]):
                    keep = n
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        out, self._held = ("" if self.stopped else self._held), ""
        return out
