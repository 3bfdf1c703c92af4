"""zerolayerd's log: the `logging` module, one line per event on stderr, `zerolayerd: ` first.

Under systemd (JOURNAL_STREAM set: stderr is the journal) each line starts with its syslog
priority, `<3>` for errors, `<4>` warnings, `<6>` info, `<7>` debug (sd-daemon(3)), so
`journalctl -p warning -u zerolayerd` shows what needs attention. The level can be changed at
run time: `zerolayer ctl log-level level=debug`.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Protocol, TextIO

LOGGER = logging.getLogger("zerolayerd")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}


class Log(Protocol):
    """A log function: the daemon's (server.log: a message and its logging level), or
    print in tests and tools."""

    def __call__(self, msg: str, level: int = ..., /) -> None: ...


class _Format(logging.Formatter):
    def __init__(self, journal: bool):
        super().__init__("zerolayerd: %(message)s")
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        return f"<{_PRIORITY.get(record.levelno, 6)}>{line}" if self.journal else line


def setup(environ: dict[str, str] | None = None, stream: TextIO | None = None) -> logging.Logger:
    env = os.environ if environ is None else environ
    h = logging.StreamHandler(stream or sys.stderr)
    h.setFormatter(_Format(journal=bool(env.get("JOURNAL_STREAM"))))
    LOGGER.handlers[:] = [h]
    LOGGER.propagate = False
    LOGGER.setLevel(logging.INFO)
    return LOGGER


def set_level(name: str) -> str:
    if name not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}")
    LOGGER.setLevel(LEVELS[name])
    return name


def level() -> str:
    return logging.getLevelName(LOGGER.level).lower()
