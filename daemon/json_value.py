"""JSON as the daemon reads and writes it (the control socket, the HTTP edge's bodies):
json.loads gives these values, json.dumps takes them (any Mapping or Sequence)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

JSONValue: TypeAlias = ("None | bool | int | float | str | Sequence[JSONValue] "
                        "| Mapping[str, JSONValue]")
JSONObject: TypeAlias = Mapping[str, JSONValue]
