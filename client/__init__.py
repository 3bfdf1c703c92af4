"""zerolayer.client: the SDK, standard library only, over the wire protocol (zerolayer.protocol).

    from zerolayer.client import Client, AsyncClient, ChatMessage
    c = Client(("127.0.0.1", 7700), key_id=1, secret="…hex…")
    print(c.invoke(messages=[ChatMessage("user", "Hi")], max_tokens=32).text)

Installable alone as the `zerolayer-client` distribution (ZEROLAYER_DIST=client, see
setup.py), with the protocol package: no numpy, numba or tokenizer. Typed (py.typed; mypy
--strict clean). The daemon, the XDP loader and the runtime import the same protocol
package, so the client and the server cannot disagree about the wire.
"""
from zerolayer.protocol.errors import (
    ErrorCode,
    PayloadTooLargeError,
    StreamRestartedError,
    ZerolayerError,
    ZerolayerTimeoutError,
)
from zerolayer.protocol.logprobs import TokenLogprob, TopLogprob
from zerolayer.protocol.wire import ChatMessage, RunState, Timings, Usage

from .address import Address
from .async_client import AsyncClient, AsyncStream
from .request_machine import InvokeResult
from .retry_policy import AuditHook
from .sync_client import Client, Stream

__all__ = ["Address", "AsyncClient", "AsyncStream", "AuditHook", "ChatMessage", "Client",
           "ErrorCode", "InvokeResult", "PayloadTooLargeError", "RunState", "Stream",
           "StreamRestartedError", "Timings", "TokenLogprob", "TopLogprob", "Usage",
           "ZerolayerError",
           "ZerolayerTimeoutError"]
