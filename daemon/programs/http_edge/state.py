"""What every handler needs, built once at start and kept on `app.state.edge`."""
from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from .backend import Backend
from .config import EdgeConfig
from .metrics import EdgeMetrics
from .tokens import TokenTable


@dataclass
class EdgeState:
    cfg: EdgeConfig
    tokens: TokenTable
    backend: Backend
    metrics: EdgeMetrics


def edge(request: Request) -> EdgeState:
    st: EdgeState = request.app.state.edge
    return st
