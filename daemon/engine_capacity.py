"""How many requests one engine holds, running and waiting together, and the OVERLOADED text
that says it is full. The I/O thread refuses on this bound before handing a request over
(admission.py), and the engine checks it again for its other callers (engine.py): one
definition, so that the two can never disagree about the bound or describe it differently.
"""
from __future__ import annotations


def capacity(max_running: int, max_waiting: int) -> int:
    return max_running + max_waiting


def full_text(held: int, max_running: int, max_waiting: int) -> str:
    return (f"wait queue full: {held} requests held (max_running {max_running} + "
            f"max_waiting {max_waiting})")
