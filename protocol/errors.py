"""The closed list of protocol error codes, what each means, and the exception for each.

One module serves both sides of the wire: the daemon raises these exceptions while parsing
and verifying (and turns them into ERROR frames), the client SDK raises them when an ERROR
frame arrives. Keeping the table in code (ERROR_INFO) next to docs/PROTOCOL.md means the
meaning, the client action and the retry/caching policy cannot drift apart silently: the
tests check that every code has an entry and an exception class.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ErrorCode(IntEnum):
    """Wire values (u16) of the ERROR frame's `code` field. Closed: v1 defines no others."""

    INVALID_SIGNATURE = 1
    INVALID_TIMESTAMP = 2
    EXPIRED_NONCE = 3
    UNKNOWN_KEY = 4
    MALFORMED = 5
    PAYLOAD_TOO_LARGE = 6
    CONTEXT_OVERFLOW = 7
    OVERLOADED = 8
    DRAINING = 9
    CANCELLED = 10
    INTERNAL = 11


@dataclass(frozen=True)
class ErrorInfo:
    meaning: str
    client_action: str
    # The SDK retries these by itself (same request id, fresh nonce, exponential backoff),
    # as long as no text of the request has been handed to the caller yet.
    retryable: bool
    # The daemon keeps these in the result cache under (key id, request id): a duplicate
    # gets the same answer. Errors that depend on the server's momentary state are not
    # cached, so that a retry with the same request id can run.
    cacheable: bool


ERROR_INFO: dict[ErrorCode, ErrorInfo] = {
    ErrorCode.INVALID_SIGNATURE: ErrorInfo(
        "The HMAC-SHA256 tag does not match the datagram under the secret of its key id.",
        "Check the secret configured for this key id; do not retry unchanged.",
        retryable=False, cacheable=False),
    ErrorCode.INVALID_TIMESTAMP: ErrorInfo(
        "The request timestamp is more than the allowed skew (300 s) from the server clock.",
        "Fix the client clock (NTP); do not retry until it is fixed.",
        retryable=False, cacheable=False),
    ErrorCode.EXPIRED_NONCE: ErrorInfo(
        "The nonce was already used while still inside its replay window.",
        "If the request was already accepted, ignore (a duplicated datagram); otherwise retry "
        "with a fresh random nonce and the same request id.",
        retryable=True, cacheable=False),
    ErrorCode.UNKNOWN_KEY: ErrorInfo(
        "The key id is not in the server's keys file (never, or no longer after a rotation).",
        "Use a current key id; do not retry unchanged.",
        retryable=False, cacheable=False),
    ErrorCode.MALFORMED: ErrorInfo(
        "The datagram or the reassembled request violates the wire format (lengths, fields, "
        "encodings, sampling parameters).",
        "A client bug: fix the request; do not retry unchanged.",
        retryable=False, cacheable=True),
    ErrorCode.PAYLOAD_TOO_LARGE: ErrorInfo(
        "The request body exceeds 1 MiB (MAX_MESSAGE_BYTES).",
        "Send a smaller payload; do not retry unchanged.",
        retryable=False, cacheable=True),
    ErrorCode.CONTEXT_OVERFLOW: ErrorInfo(
        "Prompt tokens plus max_tokens exceed the model's context length.",
        "Shorten the prompt or lower max_tokens; do not retry unchanged.",
        retryable=False, cacheable=True),
    ErrorCode.OVERLOADED: ErrorInfo(
        "A bounded resource is full (nonce cache, reassembly budget, result cache, queue).",
        "Retry later with exponential backoff (same request id, fresh nonce).",
        retryable=True, cacheable=False),
    ErrorCode.DRAINING: ErrorInfo(
        "The server is shutting down and accepts no new requests; running ones finish.",
        "Retry with backoff, ideally against another instance.",
        retryable=True, cacheable=False),
    ErrorCode.CANCELLED: ErrorInfo(
        "The server cancelled the request: its lease ran out (the client went quiet) or the "
        "drain timeout ended it. A CANCEL sent by the client ends with DONE/cancelled instead.",
        "Send keepalives while waiting; re-send the request if the result is still wanted "
        "(it runs again).",
        retryable=False, cacheable=False),
    ErrorCode.INTERNAL: ErrorInfo(
        "An unexpected server-side failure while handling the request.",
        "Retry with backoff a bounded number of times; report it if it persists.",
        retryable=True, cacheable=False),
}


class ZerolayerError(Exception):
    """Base of every error the SDK and the protocol layer raise.

    `code` is the wire error code, or None for conditions that exist only on the client
    (a timeout, a stream restarted under the caller).
    """

    code: ErrorCode | None = None

    def __init__(self, message: str = "", *, request_id: bytes | None = None,
                 key_id: int | None = None) -> None:
        super().__init__(message or (ERROR_INFO[self.code].meaning if self.code else ""))
        self.message = str(self.args[0]) if self.args else ""
        # Which request the error is about, when the failing datagram got far enough to say;
        # the daemon needs both to address (and, for a known key, sign) its ERROR reply.
        self.request_id = request_id
        self.key_id = key_id


class InvalidSignatureError(ZerolayerError):
    code = ErrorCode.INVALID_SIGNATURE


class InvalidTimestampError(ZerolayerError):
    code = ErrorCode.INVALID_TIMESTAMP


class ExpiredNonceError(ZerolayerError):
    code = ErrorCode.EXPIRED_NONCE


class UnknownKeyError(ZerolayerError):
    code = ErrorCode.UNKNOWN_KEY


class MalformedError(ZerolayerError):
    code = ErrorCode.MALFORMED


class PayloadTooLargeError(ZerolayerError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class ContextOverflowError(ZerolayerError):
    code = ErrorCode.CONTEXT_OVERFLOW


class OverloadedError(ZerolayerError):
    code = ErrorCode.OVERLOADED


class DrainingError(ZerolayerError):
    code = ErrorCode.DRAINING


class RequestCancelledError(ZerolayerError):
    # Not named CancelledError, so it cannot be confused with asyncio.CancelledError.
    code = ErrorCode.CANCELLED


class InternalServerError(ZerolayerError):
    code = ErrorCode.INTERNAL


class ZerolayerTimeoutError(ZerolayerError, TimeoutError):
    """No usable answer within the call's timeout, after the SDK's own retries."""


class StreamRestartedError(ZerolayerError):
    """The server began a new generation run for a request whose text was already partly
    handed to the caller (e.g. the daemon restarted and lost the run). The two runs cannot be
    stitched together; retry with a new request id."""


EXCEPTION_FOR_CODE: dict[ErrorCode, type[ZerolayerError]] = {
    cls.code: cls
    for cls in (InvalidSignatureError, InvalidTimestampError, ExpiredNonceError,
                UnknownKeyError, MalformedError, PayloadTooLargeError, ContextOverflowError,
                OverloadedError, DrainingError, RequestCancelledError, InternalServerError)
    if cls.code is not None
}


def error_for(code: int, message: str = "", *,
              request_id: bytes | None = None) -> ZerolayerError:
    """The exception instance for a wire code; unknown codes become MalformedError, since a
    v1 peer sending a code outside the closed list is itself violating the format."""
    try:
        cls = EXCEPTION_FOR_CODE[ErrorCode(code)]
    except ValueError:
        return MalformedError(f"unknown error code {code}: {message}", request_id=request_id)
    return cls(message, request_id=request_id)
