"""zerolayer-http settings: command-line flags, optionally a small TOML file underneath.

Precedence: defaults < TOML (--config) < flags. The TOML file is flat, one key per flag
with dashes as underscores:

    daemon = "127.0.0.1:7433"
    keys = "/etc/zerolayer/keys"
    tokens = "/etc/zerolayer/http-tokens"
    listen = "127.0.0.1:8080"
    model_name = "smollm2-135m-instruct"
"""
from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass, fields
from typing import Any

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


@dataclass(frozen=True)
class EdgeConfig:
    daemon: str = "127.0.0.1:7433"          # zerolayerd's UDP address (its [network] host:port)
    keys: str = "/etc/zerolayer/keys"       # the daemon's keys file: secrets per key id
    tokens: str = "/etc/zerolayer/http-tokens"   # bearer token -> key id (mode 0600)
    listen: str = "127.0.0.1:8080"          # HTTP host:port
    model_name: str = DEFAULT_MODEL_NAME    # the one model name served (GET /v1/models)
    # max_tokens when an OpenAI request gives none (the SDK's default; prompt + max_tokens
    # must fit the daemon's [model] max_seq_len, so "until the context is full" is no default)
    default_max_tokens: int = 256
    daemon_timeout_s: float = 45.0          # the SDK's recovery window (PROTOCOL §8.6)
    # INVOKE attempts per request. The SDK retries OVERLOADED/DRAINING/INTERNAL with backoff;
    # behind HTTP it is better to hand a lasting overload back quickly as 429/503 (the HTTP
    # client has its own retry policy and Retry-After) than to hold the connection.
    max_attempts: int = 3
    health_timeout_s: float = 2.0           # /healthz: PING must answer within this
    log_level: str = "info"

    @property
    def listen_host(self) -> str:
        return split_host_port(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return split_host_port(self.listen)[1]


def split_host_port(s: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port)."""
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected host:port, got {s!r}")
    return host.strip("[]"), int(port)


_HELP = {
    "daemon": "zerolayerd address, host:port (udp://host:port and shm:///path also work)",
    "keys": "the daemon's keys file (<key_id> <secret_hex> per line, mode 0600)",
    "tokens": "bearer tokens file (<key_id> <token> per line, mode 0600 or stricter)",
    "listen": "HTTP listen address host:port",
    "model_name": "the model name clients must send and /v1/models lists",
    "default_max_tokens": "max_tokens of an OpenAI request that sets none",
    "daemon_timeout_s": "seconds without an answer from the daemon before 504",
    "max_attempts": "INVOKE attempts per request before OVERLOADED/DRAINING reach the client",
    "health_timeout_s": "/healthz fails if the daemon's PING takes longer",
    "log_level": "uvicorn log level (critical, error, warning, info, debug)",
}

EPILOG = """\
Tokens file (chmod 600; the edge refuses to start if group or others can read it):
    # <key_id> <token>          the key id must be in --keys
    7 zl-3f9c...                 a plain token, or
    7 sha256:<64 hex digits>     the SHA-256 of the token, so the file holds no token
  A new token: python -c 'import secrets; print("zl-" + secrets.token_urlsafe(32))'

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models (OpenAI);
POST /v1/messages (Anthropic; x-api-key or Authorization: Bearer); GET /healthz;
GET /metrics (Prometheus, zerolayer_http_*). See docs/OPERATIONS.md "HTTP edge".

Example:
  zerolayer-http --daemon 127.0.0.1:7433 --keys /etc/zerolayer/keys \\
      --tokens /etc/zerolayer/http-tokens --listen 127.0.0.1:8080 \\
      --model-name smollm2-135m-instruct
"""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="zerolayer-http",
        description="OpenAI/Anthropic-compatible HTTP+SSE edge in front of zerolayerd.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", metavar="TOML", help="a TOML file with the settings below "
                    "(flat keys: daemon, keys, tokens, listen, model_name, ...); flags win")
    defaults = EdgeConfig()
    for f in fields(EdgeConfig):
        # default=None: a flag not given must not override the TOML file
        ap.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                        type=type(getattr(defaults, f.name)),
                        help=f"{_HELP[f.name]} (default: {getattr(defaults, f.name)})")
    return ap


def load(argv: list[str] | None = None) -> EdgeConfig:
    ap = build_parser()
    args = ap.parse_args(argv)
    values: dict[str, Any] = {}
    if args.config:
        with open(args.config, "rb") as fh:
            data = tomllib.load(fh)
        defaults = EdgeConfig()
        known = [f.name for f in fields(EdgeConfig)]
        for k, v in data.items():
            if k not in known:
                ap.error(f"{args.config}: unknown setting {k!r} (known: {', '.join(known)})")
            try:
                values[k] = type(getattr(defaults, k))(v)
            except (TypeError, ValueError):
                ap.error(f"{args.config}: {k} = {v!r} is not a {type(getattr(defaults, k)).__name__}")
    for f in fields(EdgeConfig):
        v = getattr(args, f.name)
        if v is not None:
            values[f.name] = v
    cfg = EdgeConfig(**values)
    try:
        split_host_port(cfg.listen)
    except ValueError as e:
        ap.error(f"--listen: {e}")
    if cfg.default_max_tokens < 1:
        ap.error("--default-max-tokens must be >= 1")
    if cfg.max_attempts < 1:
        ap.error("--max-attempts must be >= 1")
    return cfg
