"""What both APIs share before they differ: the JSON body, the caller's key, typed fields.

Validation is strict on purpose: a parameter the edge cannot honour is refused with a 400
naming it (the way OpenAI refuses an unrecognised argument), never silently ignored, so a
client never believes it got, say, n=3 or logprobs when it did not.
"""
from __future__ import annotations

import json
import math

from starlette.requests import Request

from zerolayer.daemon.json_value import JSONObject, JSONValue

from .errors import ApiError, bad_request, unauthorized
from .tokens import TokenTable

MAX_BODY_BYTES = 2 << 20   # the daemon takes 1 MiB of request body; JSON adds quoting


async def read_json(request: Request) -> JSONObject:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise ApiError(413, f"request body larger than {MAX_BODY_BYTES} bytes",
                       openai_code="request_too_large", anthropic_type="request_too_large")
    raw = b""
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body larger than {MAX_BODY_BYTES} bytes",
                           openai_code="request_too_large", anthropic_type="request_too_large")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise bad_request("the request body is not valid JSON") from None
    except RecursionError:     # the parser recurses once per level: a limit, not a bug
        raise bad_request("the request body nests too deeply") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def key_id_for(request: Request, tokens: TokenTable, *, x_api_key: bool) -> int:
    """The daemon key id of the caller's token: `Authorization: Bearer <token>`, or (the
    Anthropic API's way) `x-api-key: <token>`. 401 otherwise."""
    token: str | None = None
    auth = request.headers.get("authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer":
            token = value.strip()
    if token is None and x_api_key:
        token = request.headers.get("x-api-key")
    kid = tokens.lookup(token)
    if kid is None:
        raise unauthorized("Authorization: Bearer" + (" or x-api-key" if x_api_key else ""))
    return kid


class Fields:
    """Typed access to a request body; remembers which keys were looked at, so that
    `refuse_unknown` can reject every key the edge does not understand."""

    def __init__(self, body: JSONObject) -> None:
        self.body = body
        self.seen: set[str] = set()

    def raw(self, name: str) -> JSONValue:
        self.seen.add(name)
        return self.body.get(name)

    def has(self, name: str) -> bool:
        self.seen.add(name)
        return self.body.get(name) is not None

    def string(self, name: str, *, required: bool = False) -> str | None:
        v = self.raw(name)
        if v is None:
            if required:
                raise bad_request(f"'{name}' is required", name)
            return None
        if not isinstance(v, str):
            raise bad_request(f"'{name}' must be a string", name)
        return v

    def boolean(self, name: str, default: bool = False) -> bool:
        v = self.raw(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise bad_request(f"'{name}' must be a boolean", name)
        return v

    def integer(self, name: str, lo: int, hi: int, *, default: int | None = None,
                required: bool = False) -> int | None:
        v = self.raw(name)
        if v is None:
            if required:
                raise bad_request(f"'{name}' is required", name)
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad_request(f"'{name}' must be an integer", name)
        if not lo <= v <= hi:
            raise bad_request(f"'{name}' must be in {lo}..{hi}, got {v}", name)
        return v

    def number(self, name: str, lo: float, hi: float, default: float, *,
               lo_open: bool = False) -> float:
        v = self.raw(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise bad_request(f"'{name}' must be a number", name)
        if not ((lo < v) if lo_open else (lo <= v)) or v > hi:
            interval = f"{'(' if lo_open else '['}{lo}, {hi}]"
            raise bad_request(f"'{name}' must be in {interval}, got {v}", name)
        return float(v)

    def neutral(self, name: str, *neutral_values: JSONValue) -> None:
        """Accept a parameter only at a value that changes nothing (e.g. n=1,
        presence_penalty=0): clients that always send it still work."""
        v = self.raw(name)
        if v is not None and v not in neutral_values:
            raise bad_request(f"'{name}' = {v!r} is not supported by this server "
                              f"(supported: {', '.join(repr(x) for x in neutral_values)})",
                              name, "unsupported_parameter")

    def refuse(self, *names: str) -> None:
        """Parameters the edge cannot honour at any value but null."""
        for name in names:
            if self.has(name):
                raise bad_request(f"'{name}' is not supported by this server", name,
                                  "unsupported_parameter")

    def ignore(self, *names: str) -> None:
        """Parameters with no effect on the answer (metadata, user ids)."""
        self.seen.update(names)

    def refuse_unknown(self) -> None:
        for name in self.body:
            if name not in self.seen:
                raise bad_request(f"Unrecognized request argument supplied: {name}", name,
                                  "unknown_parameter")

    def stop_list(self, name: str, max_n: int) -> tuple[str, ...]:
        v = self.raw(name)
        if v is None:
            return ()
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise bad_request(f"'{name}' must be a string or a list of strings", name)
        if len(items) > max_n:
            raise bad_request(f"'{name}': at most {max_n} stop sequences", name)
        for s in items:
            if not 1 <= len(s.encode("utf-8")) <= 128:
                raise bad_request(f"'{name}': each stop sequence must be 1..128 UTF-8 bytes",
                                  name)
        return tuple(items)
