"""zerolayer-http: an OpenAI- and Anthropic-compatible HTTP/SSE edge in front of zerolayerd.

A separate process, so the daemon keeps its one signed-UDP data plane and no HTTP parser,
JSON or TLS terminator ever runs in the process that holds the model. The edge translates
each HTTP request into one signed invoke through the async SDK (zerolayer.client), and
nothing else of the project: it never imports the daemon's engine, numba or the tokenizer,
so it starts in well under a second and can be restarted on its own.

Modules, one job each:
  config.py         command line and TOML settings
  tokens.py         the bearer-token file: token -> key id, constant-time lookup
  backend.py        one AsyncClient per key id; the daemon health probe
  errors.py         the one table: daemon error code -> HTTP status and API error shapes
  common.py         JSON body, the caller's token -> key id, strict typed request fields
  state.py          what every handler needs (settings, tokens, backend, metrics)
  metrics.py        the edge's Prometheus metrics (zerolayer_http_*)
  generation.py     one daemon stream as the handlers use it (first chunk, cancel on leave)
  streaming.py      the SSE response that always ends its daemon stream
  dialect.py        what an API's dialect supplies: parse, error shape, body, chunk shape
  serve.py          the one handler of a generation, over any dialect
  openai_api.py     the OpenAI dialect: POST /v1/chat/completions, /v1/completions;
                    GET /v1/models
  anthropic_api.py  the Anthropic dialect: POST /v1/messages
  tools.py          tool calls in the generic format: the tools in the system turn, the
                    answer's JSON schema, earlier calls and results written back
  tool_output.py    the answer of a request with tools read back, whole or as stream deltas
  openai_tools.py   OpenAI's tools, tool_choice, tool messages and tool_calls
  anthropic_tools.py  Anthropic's tools, tool_choice, tool_use / tool_result blocks
  app.py            the Starlette app, /healthz, /metrics, and main()
"""
