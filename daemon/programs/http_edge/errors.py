"""The one table from daemon errors to HTTP, and the two APIs' error bodies.

Every wire code of protocol/errors.py (a closed list) has a row here; tests check that no code
is missing. How a row was chosen:
- the caller's request is at fault (MALFORMED, CONTEXT_OVERFLOW, PAYLOAD_TOO_LARGE): 4xx, so
  HTTP clients do not retry it;
- the daemon is momentarily unable (OVERLOADED, DRAINING, CANCELLED by its lease or drain
  timeout): 429/503 with Retry-After, which the OpenAI and Anthropic SDKs honour;
- the edge itself is misconfigured (its key or clock is wrong, so the daemon refuses the edge
  rather than the caller): 502 with a message that names the configuration to check. The
  HTTP client can do nothing about it, and must not be told its own token is bad;
- the daemon failed (INTERNAL): 500; no answer in time (the SDK's timeout): 504.
"""
from __future__ import annotations

from dataclasses import dataclass

from zerolayer.daemon.json_value import JSONObject
from zerolayer.protocol.errors import ErrorCode, StreamRestartedError, ZerolayerError, ZerolayerTimeoutError


@dataclass(frozen=True)
class HttpMapping:
    status: int
    openai_type: str          # error.type of OpenAI's error body
    openai_code: str | None   # error.code of OpenAI's error body
    anthropic_type: str       # error.type of Anthropic's error body
    retry_after_s: int | None = None
    # Replaces the daemon's message: for misconfiguration the caller gets what to fix, not
    # the daemon's words about a key the caller never saw.
    message: str | None = None


_MISCONFIGURED = ("zerolayer-http is misconfigured: the daemon refused the edge's own "
                  "request ({}); check the edge's --keys file and clock against the daemon")

DAEMON_ERRORS: dict[ErrorCode, HttpMapping] = {
    ErrorCode.INVALID_SIGNATURE: HttpMapping(
        502, "server_error", "upstream_misconfigured", "api_error",
        message=_MISCONFIGURED.format("INVALID_SIGNATURE: the secret does not match")),
    ErrorCode.INVALID_TIMESTAMP: HttpMapping(
        502, "server_error", "upstream_misconfigured", "api_error",
        message=_MISCONFIGURED.format("INVALID_TIMESTAMP: the clocks differ by > 300 s")),
    # The SDK retries EXPIRED_NONCE itself; one that still surfaces means a broken nonce
    # source or a replaying middlebox, both on the edge's side.
    ErrorCode.EXPIRED_NONCE: HttpMapping(
        502, "server_error", "upstream_misconfigured", "api_error",
        message=_MISCONFIGURED.format("EXPIRED_NONCE")),
    ErrorCode.UNKNOWN_KEY: HttpMapping(
        502, "server_error", "upstream_misconfigured", "api_error",
        message=_MISCONFIGURED.format("UNKNOWN_KEY: the token's key id is not in the "
                                      "daemon's keys file")),
    ErrorCode.MALFORMED: HttpMapping(400, "invalid_request_error", "invalid_request",
                                     "invalid_request_error"),
    ErrorCode.PAYLOAD_TOO_LARGE: HttpMapping(413, "invalid_request_error", "request_too_large",
                                             "request_too_large"),
    ErrorCode.CONTEXT_OVERFLOW: HttpMapping(400, "invalid_request_error",
                                            "context_length_exceeded", "invalid_request_error"),
    ErrorCode.OVERLOADED: HttpMapping(429, "rate_limit_error", "overloaded", "rate_limit_error",
                                      retry_after_s=1),
    ErrorCode.DRAINING: HttpMapping(503, "server_error", "draining", "overloaded_error",
                                    retry_after_s=2),
    # The daemon cut the request (its lease ran out, or the drain timeout): the same request
    # sent again runs again.
    ErrorCode.CANCELLED: HttpMapping(503, "server_error", "cancelled_by_server",
                                     "overloaded_error", retry_after_s=1),
    ErrorCode.INTERNAL: HttpMapping(500, "server_error", "internal_error", "api_error"),
}

TIMEOUT = HttpMapping(504, "server_error", "upstream_timeout", "timeout_error",
                      message="zerolayerd did not answer in time")
RESTARTED = HttpMapping(502, "server_error", "upstream_restarted", "api_error",
                        message="zerolayerd restarted during the request; send it again")
UNKNOWN = HttpMapping(500, "server_error", "internal_error", "api_error")


def mapping_for(exc: ZerolayerError) -> HttpMapping:
    if exc.code is not None:
        return DAEMON_ERRORS[exc.code]
    if isinstance(exc, ZerolayerTimeoutError):
        return TIMEOUT
    if isinstance(exc, StreamRestartedError):
        return RESTARTED
    return UNKNOWN


def message_for(exc: ZerolayerError, m: HttpMapping) -> str:
    if m.message is not None:
        return m.message
    name = exc.code.name if exc.code is not None else type(exc).__name__
    return f"{name}: {exc.message}" if exc.message else name


class ApiError(Exception):
    """A refusal by the edge itself (validation, authentication), already in HTTP terms."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 openai_type: str = "invalid_request_error", openai_code: str | None = None,
                 anthropic_type: str = "invalid_request_error",
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.openai_type = openai_type
        self.openai_code = openai_code
        self.anthropic_type = anthropic_type
        self.retry_after_s = retry_after_s

    @classmethod
    def from_daemon(cls, exc: ZerolayerError) -> ApiError:
        m = mapping_for(exc)
        return cls(m.status, message_for(exc, m), openai_type=m.openai_type,
                   openai_code=m.openai_code, anthropic_type=m.anthropic_type,
                   retry_after_s=m.retry_after_s)

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else {}

    def openai_body(self) -> JSONObject:
        return {"error": {"message": self.message, "type": self.openai_type,
                          "param": self.param, "code": self.openai_code}}

    def anthropic_body(self) -> JSONObject:
        return {"type": "error", "error": {"type": self.anthropic_type, "message": self.message}}


def unauthorized(where: str) -> ApiError:
    return ApiError(401, f"invalid or missing API key ({where})", openai_type="invalid_request_error",
                    openai_code="invalid_api_key", anthropic_type="authentication_error")


def bad_request(message: str, param: str | None = None,
                code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, openai_code=code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(404, message, param=param, openai_code=code,
                    anthropic_type="not_found_error")
