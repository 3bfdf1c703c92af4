"""Two distributions from one tree, both under the `zerolayer` import namespace.

- `zerolayer` (the default): the three rooms (bpf/, daemon/, gpu/), the wire protocol
  protocol/ -> `zerolayer.protocol` (which every room imports) and the SDK client/ ->
  `zerolayer.client`. package_dir maps each directory into
  `zerolayer.*` so nothing generic (`gpu`, `daemon`) lands in site-packages; `zerolayer`
  itself is an implicit namespace package.
- `zerolayer-client` (ZEROLAYER_DIST=client): only `zerolayer.client` and
  `zerolayer.protocol`, the SDK and the wire protocol, standard library only, typed
  (py.typed). For applications that call a daemon and must not pull in numba, the CUDA
  wheels or the tokenizer:
      ZEROLAYER_DIST=client pip install .        # or: pip wheel, then install the wheel
  Install one or the other in an environment: `zerolayer` already contains the client.
"""
import os

from setuptools import setup

CLIENT = {"zerolayer.client": "client", "zerolayer.protocol": "protocol"}
ROOMS = {"bpf": "bpf", "daemon": "daemon", "gpu": "gpu"}
SUBPACKAGES = ["gpu.ops", "gpu.cuda", "daemon.carriers", "daemon.ops", "daemon.programs",
               "daemon.programs.http_edge"]
CLIENT_DATA = {"zerolayer.client": ["py.typed"], "zerolayer.protocol": ["py.typed"]}

DAEMON_REQUIRES = [
    "numpy>=1.26,<2.5",
    "numba>=0.60",
    "gguf>=0.10",
    "tokenizers>=0.20",
    "jinja2>=3.1",
    "pyzmq>=25",
    "prometheus-client>=0.20",
    "pyroute2>=0.7",
    # constrained decoding (structured output): one wheel, no dependencies; measured against
    # xgrammar, which pulls torch + CUDA + transformers (docs/BENCHMARKS.md)
    "llguidance>=1.9,<2",
]
# The HTTP+SSE edge (zerolayer-http) is a separate process: the data plane stays HTTP-free.
# uvloop and httptools: uvicorn picks them up by itself; measured here they take ~2 ms off
# the edge's time to first token (bench/bench_http.py)
HTTP = ["starlette>=0.37", "uvicorn>=0.30", "sse-starlette>=2.1", "uvloop>=0.19",
        "httptools>=0.6"]
EXTRAS = {
    "http": HTTP,
    # the edge is tested with the real OpenAI and Anthropic SDKs; the tree with ruff and mypy,
    # pinned: tests/mypy_baseline.txt holds this mypy's messages, ruff.toml this ruff's rules
    "test": ["pytest>=8", "hypothesis>=6", "mypy==2.4.1", "ruff==0.17.5", "openai>=1.40",
             "anthropic>=0.30", "httpx>=0.27", "jsonschema>=4", "kubernetes-validate>=1.30", *HTTP],
    "bench": ["matplotlib>=3.8"],
    "gpu": ["numba-cuda[cu12]>=0.30", "cupy-cuda12x>=14"],
}
SCRIPTS = [
    "zerolayer = zerolayer.daemon.programs.cli:main",
    "zerolayerd = zerolayer.daemon.server:main",
    "zerolayer-http = zerolayer.daemon.programs.http_edge.app:main",
]

if os.environ.get("ZEROLAYER_DIST") == "client":
    setup(
        name="zerolayer-client",
        description="zerolayer's client SDK (sync and asyncio) and wire protocol, stdlib only",
        packages=sorted(CLIENT),
        package_dir=CLIENT,
        package_data=CLIENT_DATA,
    )
else:
    package_dir = dict(CLIENT)
    package_dir.update({f"zerolayer.{name}": path for name, path in ROOMS.items()})
    package_dir.update({f"zerolayer.{sub}": sub.replace(".", "/") for sub in SUBPACKAGES})
    setup(
        packages=sorted(package_dir),
        package_dir=package_dir,
        package_data={"zerolayer.bpf": ["*.c", "*.h"], **CLIENT_DATA},
        install_requires=DAEMON_REQUIRES,
        extras_require=EXTRAS,
        entry_points={"console_scripts": SCRIPTS},
    )
