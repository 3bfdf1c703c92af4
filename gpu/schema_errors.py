"""The one error a response_format schema can end in: the daemon's MALFORMED."""
from __future__ import annotations


class SchemaError(ValueError):
    """A schema the daemon refuses. str() is the client's one-line reason, "response_format:
    ..."; `detail` is what only the daemon's log gets (the grammar engine's own message,
    which can carry its internal state)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__("response_format: " + " ".join(reason.split()))
        self.detail = detail
