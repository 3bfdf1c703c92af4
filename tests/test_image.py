"""The container image, built from Debian packages alone and run: scripts/image-check.sh.

The script builds a Debian 12 base with mmdebstrap (the rootfs tarball is cached in
/var/cache/zerolayer-image), builds the Dockerfile on it with podman, checks that the image has
no compiler and no test extra and holds the project's wheel, runs `zerolayerd` in it with a
keys file mounted read-only and its UDP port published on 127.0.0.1, sends an invoke from
this host with the project's CLI through that port, and drains the daemon with SIGTERM.

It needs root and several minutes (docs/OPERATIONS.md, "Container image"), so it runs only
with ZEROLAYER_IMAGE_CHECK=1 (.ci/run sets it).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "image-check.sh"


@pytest.mark.skipif(
    os.environ.get("ZEROLAYER_IMAGE_CHECK") != "1",
    reason="builds and runs the container image (scripts/image-check.sh, root, minutes): "
           "set ZEROLAYER_IMAGE_CHECK=1",
)
def test_image_builds_and_answers_an_invoke_through_its_published_port():
    if os.geteuid() != 0:
        pytest.fail("ZEROLAYER_IMAGE_CHECK=1 needs root (rootful podman, mmdebstrap)")
    env = dict(os.environ, ZEROLAYER_PY=sys.executable)
    r = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=45 * 60)
    assert r.returncode == 0, f"image-check.sh exited {r.returncode}\n{r.stdout}\n{r.stderr[-8000:]}"
    assert re.search(r"^image \S+ size \d+ MB$", r.stdout, re.M), r.stdout
    assert "contents ok" in r.stderr
