"""The one handler of a generation, whatever the API's dialect (dialect.py).

Order of events, the same for every dialect: authenticate the caller (401), read the body
(413, 400), parse it (400, 404), send the invoke and wait for the first chunk
(generation.Generation.open: a daemon refusal is still an HTTP status), then answer: the
whole body, or an SSE stream that begins with that first chunk. Every path counts the
request once by API and status; a stream's duration is counted when it ends
(streaming.GenerationSSE), everything else's here.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from zerolayer.client import ZerolayerError

from .common import key_id_for, read_json
from .dialect import ChunkShape, Dialect, Req
from .errors import ApiError
from .generation import ClientGone, Generation, daemon_error, until_disconnect
from .state import EdgeState, edge
from .streaming import GenerationSSE


async def serve(request: Request, dialect: Dialect[Req]) -> Response:
    st = edge(request)
    t0 = time.monotonic()
    status = 500
    streaming = False
    try:
        kid = key_id_for(request, st.tokens, x_api_key=dialect.x_api_key)
        body = await read_json(request)
        req = dialect.parse(body, st)
        gen = await Generation.open(request, st.backend.client(kid), req.params, dialect.api,
                                    st.metrics, t0)
        created = int(time.time())
        if req.stream:
            status, streaming = 200, True
            shape = dialect.chunks(req, gen.stream.request_id, st.cfg.model_name, created)
            return GenerationSSE(events(gen, shape, st), gen, st.metrics, dialect.api)
        try:
            text = await until_disconnect(request, gen.text)
        except ZerolayerError as e:
            raise daemon_error(e, st.metrics) from None
        finally:
            await gen.finish()
        r = gen.result
        assert r is not None
        status = 200
        return JSONResponse(dialect.body(req, r, text, st.cfg.model_name, created))
    except ApiError as e:
        status = e.status
        return error_response(dialect, e)
    except ClientGone:
        status = 499            # nginx's "client closed request": nobody reads this
        return Response(status_code=499)
    finally:
        st.metrics.requests.labels(dialect.api, str(status)).inc()
        if not streaming:
            st.metrics.duration.labels(dialect.api).observe(time.monotonic() - t0)


def error_response(dialect: Dialect[Req], e: ApiError) -> JSONResponse:
    return JSONResponse(dialect.error_body(e), status_code=e.status, headers=e.headers())


async def events(gen: Generation, shape: ChunkShape, st: EdgeState) -> AsyncIterator[bytes]:
    """The stream's body. The status line went out with the first chunk, so a daemon error
    from here on is reported in-band, in the dialect's shape, and ends the stream."""
    for e in shape.start():
        yield e
    try:
        async for text in gen.chunks():
            event = shape.chunk(text, gen.take_logprobs())
            if event:           # a tool call's answer can need more text for its next delta
                yield event
    except ZerolayerError as err:
        st.metrics.stream_errors.labels(gen.api).inc()
        yield shape.error(daemon_error(err, st.metrics))
        return
    rest = gen.take_logprobs()  # tokens whose text never came (held back, then cut by a stop)
    if rest:
        yield shape.chunk("", rest)
    for e in shape.end(gen.result):
        yield e
