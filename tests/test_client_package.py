"""zerolayer.client as its own small distribution: `zerolayer-client` is built
from this tree, holds only the SDK and the protocol, needs nothing beyond the standard
library, ships py.typed and passes mypy --strict."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "numba", "llvmlite", "tokenizers", "gguf", "zmq", "pyroute2",
         "prometheus_client", "cupy", "bcc", "zerolayer.daemon", "zerolayer.gpu",
         "zerolayer.bpf")


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy of what the client distribution is made of, so no build/ left in
    # the tree by another build can leak into it.
    src = tmp_path_factory.mktemp("src")
    for name in ("setup.py", "setup.cfg", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("client", "protocol"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(src)],
                   env={**os.environ, "ZEROLAYER_DIST": "client"}, check=True,
                   capture_output=True)
    (wheel,) = out.glob("zerolayer_client-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(client_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(client_wheel) as z:   # a wheel is installed by unpacking it
        z.extractall(target)
    return target


def test_the_client_wheel_holds_only_the_sdk_and_requires_nothing(client_wheel: Path) -> None:
    with zipfile.ZipFile(client_wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    code = [n for n in names if ".dist-info/" not in n]
    assert code and all(n.startswith(("zerolayer/client/", "zerolayer/protocol/"))
                        for n in code), code
    assert {"zerolayer/client/py.typed", "zerolayer/protocol/py.typed"} <= set(code)
    assert {"zerolayer/client/async_client.py", "zerolayer/client/sync_client.py",
            "zerolayer/protocol/wire.py"} <= set(code)
    assert "Name: zerolayer-client" in meta
    assert "Requires-Dist" not in meta            # not even numpy
    assert not any(n.endswith("entry_points.txt") for n in names)


def test_it_imports_and_signs_with_the_standard_library_alone(installed: Path) -> None:
    # -S -I: no site-packages at all (so no numpy), only the unpacked wheel on the path.
    probe = f"""
import sys
sys.path.insert(0, {str(installed)!r})
from zerolayer.client import AsyncClient, ChatMessage, Client
from zerolayer.protocol import wire
from zerolayer.protocol.sampling_params import SamplingParams
body = wire.encode_invoke_body(SamplingParams(max_tokens=4), wire.PayloadKind.TOKEN_IDS,
                               wire.encode_token_ids([1, 2, 3]))
frags = wire.encode_invoke(1, b"k" * 32, bytes(16), 1, bytes(32), body)
req = wire.parse_request(frags[0])
wire.verify_tag(frags[0], b"k" * 32)   # raises if the tag is wrong
assert req.request_id == bytes(16)
assert list(wire.decode_invoke_body(body).token_ids) == [1, 2, 3]
Client(("127.0.0.1", 9), 1, b"k" * 32); AsyncClient("127.0.0.1:9", 1, b"k" * 32)
heavy = [m for m in sys.modules if m.split(".")[0] in {HEAVY[:8]!r}
         or m.startswith(("zerolayer.daemon", "zerolayer.gpu", "zerolayer.bpf"))]
assert not heavy, heavy
print("ok", sorted(m for m in sys.modules if m.startswith("zerolayer"))[:3])
"""
    r = subprocess.run([sys.executable, "-S", "-I", "-c", probe], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_the_client_package_passes_mypy_strict(installed: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--cache-dir", os.devnull, "-p", "zerolayer.client", "-p",
                        "zerolayer.protocol"],
                       cwd=installed, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
