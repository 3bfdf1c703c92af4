"""The Starlette app, the edge's own endpoints, and `zerolayer-http`'s main().

Start-up order: settings, tokens file, keys file (each refused with exit status 2 if
unusable, like zerolayerd refuses its keys file), then uvicorn. The daemon need not be up:
requests wait for it within the SDK's recovery window, and /healthz says whether it answers.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import disable_created_metrics
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zerolayer.client import ZerolayerError
from zerolayer.daemon.auth import KeyFileError

from . import anthropic_api, config, openai_api
from .backend import Backend
from .errors import ApiError
from .metrics import EdgeMetrics
from .state import EdgeState, edge
from .streaming import DRAIN_S
from .tokens import TokenFileError, load_tokens

log = logging.getLogger("zerolayer.http")


async def healthz(request: Request) -> Response:
    """200 when the edge is up and the daemon answers an authenticated PING in time;
    503 otherwise (with the reason), so a load balancer stops sending here."""
    st = edge(request)
    try:
        rtt = await st.backend.ping()
    except (TimeoutError, ZerolayerError, OSError) as e:
        why = "no PONG within the health timeout" if isinstance(e, TimeoutError) else repr(e)
        return JSONResponse({"status": "unavailable", "daemon": why}, status_code=503)
    return JSONResponse({"status": "ok", "daemon_rtt_ms": round(rtt * 1e3, 3)})


async def metrics(request: Request) -> Response:
    body, ctype = edge(request).metrics.render()
    return Response(body, media_type=ctype)


async def http_error(request: Request, exc: Exception) -> Response:
    """Unknown paths and wrong methods in the calling API's error shape."""
    assert isinstance(exc, HTTPException)
    e = ApiError(exc.status_code, str(exc.detail), openai_type="invalid_request_error",
                 anthropic_type="not_found_error" if exc.status_code == 404
                 else "invalid_request_error")
    dialect = (anthropic_api.MESSAGES if request.url.path.startswith("/v1/messages")
               else openai_api.CHAT)
    return JSONResponse(dialect.error_body(e), status_code=exc.status_code)


def build_app(state: EdgeState) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        log.info("zerolayer-http serving model %r for daemon %s (%d token(s))",
                 state.cfg.model_name, state.cfg.daemon, len(state.tokens))
        try:
            yield
        finally:
            await state.backend.aclose()

    routes = [
        Route("/v1/chat/completions", openai_api.chat_completions, methods=["POST"]),
        Route("/v1/completions", openai_api.completions, methods=["POST"]),
        Route("/v1/models", openai_api.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", openai_api.list_models, methods=["GET"]),
        Route("/v1/messages", anthropic_api.messages, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error})
    app.state.edge = state
    return app


def make_state(cfg: config.EdgeConfig) -> EdgeState:
    tokens = load_tokens(cfg.tokens)
    return EdgeState(cfg, tokens, Backend(cfg, tokens), EdgeMetrics())


def main(argv: list[str] | None = None) -> int:
    cfg = config.load(argv)
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.monotonic()
    # One series per metric on the page, without prometheus_client's *_created companions
    # (process-wide, which is fine: the edge is its own process).
    disable_created_metrics()
    try:
        state = make_state(cfg)
    except (TokenFileError, KeyFileError) as e:
        print(f"zerolayer-http: {e}", file=sys.stderr)
        return 2           # a configuration restarting cannot fix (the unit says so)
    import uvicorn  # after the checks: a refused start stays instant

    server = uvicorn.Server(uvicorn.Config(
        build_app(state), host=cfg.listen_host, port=cfg.listen_port,
        log_level=cfg.log_level, access_log=cfg.log_level == "debug",
        # SIGTERM: no new connections; streams in flight get streaming.DRAIN_S to finish
        # (then they are cancelled, CANCEL included), uvicorn waits a little longer
        timeout_graceful_shutdown=DRAIN_S + 5, server_header=False))
    log.info("zerolayer-http configured in %.0f ms; listening on http://%s",
             (time.monotonic() - t0) * 1e3, cfg.listen)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    raise SystemExit(main())
