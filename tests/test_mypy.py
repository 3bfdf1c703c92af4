"""mypy over daemon/, gpu/ and bpf/, as the installed `zerolayer` namespace sees them, with the
settings in setup.cfg's [mypy] sections. The errors the tree had when the check began are
listed in tests/mypy_baseline.txt (one a line: file, message, code; no line numbers, so an
edit elsewhere in a file does not move them). The list only shrinks:

- an error not in the list fails the test: fix it (an `Any`, or an `object` at a seam, is not
  a fix);
- an error of the list that no longer occurs fails the test too, so the list keeps up:
  `python tests/test_mypy.py --write-baseline` rewrites it, and the diff shows what went.

Errors in files ruff.toml lists as in flight, or that git does not track yet, are left out
until those files land. client/ passes mypy --strict on its own (tests/test_client_package.py).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from tree_files import ROOT, in_flight, tracked_python_files

BASELINE = ROOT / "tests" / "mypy_baseline.txt"
ROOMS = ("daemon", "gpu", "bpf")
ERROR = re.compile(r"^zerolayer/(?P<path>[^:]+\.py):\d+: error: (?P<msg>.*)$")


def normalise(line: str) -> str | None:
    """`zerolayer/daemon/x.py:12: error: msg  [code]` -> `daemon/x.py: msg  [code]`."""
    m = ERROR.match(line.rstrip())
    if m is None:
        return None
    msg = re.sub(r"\bline \d+\b", "line N", m["msg"])   # "defined on line 40" moves too
    return f"{m['path']}: {msg}"


def current_errors() -> Counter[str]:
    """The errors mypy reports now, each as normalise() writes it, with its count."""
    with tempfile.TemporaryDirectory() as tmp:
        ns = Path(tmp) / "zerolayer"
        ns.mkdir()
        for room in ("client", "protocol", *ROOMS):
            (ns / room).symlink_to(ROOT / room, target_is_directory=True)
        packages = [arg for room in ROOMS for arg in ("-p", f"zerolayer.{room}")]
        r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "setup.cfg"),
                            "--no-incremental", "--cache-dir", os.devnull, "--no-pretty",
                            "--no-error-summary", "--show-error-codes", "--no-color-output",
                            *packages], cwd=tmp, capture_output=True, text=True, timeout=900)
    assert r.returncode in (0, 1), f"mypy did not run:\n{r.stdout}{r.stderr}"
    tracked = set(tracked_python_files())
    errors: Counter[str] = Counter()
    for line in r.stdout.splitlines():
        err = normalise(line)
        if err is None:
            continue
        path = err.partition(":")[0]
        if path in tracked and not in_flight(path):
            errors[err] += 1
    return errors


def read_baseline() -> Counter[str]:
    return Counter(line for line in BASELINE.read_text().splitlines()
                   if line and not line.startswith("#"))


def write_baseline(errors: Counter[str]) -> None:
    header = ("# mypy errors the tree already had (tests/test_mypy.py); this list only shrinks.\n"
              "# Rewrite with: python tests/test_mypy.py --write-baseline\n")
    BASELINE.write_text(header + "".join(f"{e}\n" for e in sorted(errors.elements())))


def test_normalise() -> None:
    line = ('zerolayer/daemon/x.py:12: error: Name "f" already defined on line 4  '
            '[no-redef]')
    assert normalise(line) == 'daemon/x.py: Name "f" already defined on line N  [no-redef]'
    assert normalise("zerolayer/daemon/x.py:3: note: See https://...") is None


def test_mypy_finds_no_error_beyond_the_baseline() -> None:
    now, base = current_errors(), read_baseline()
    new, gone = now - base, base - now
    assert not new, ("mypy errors not in tests/mypy_baseline.txt (fix them; the baseline "
                     "only shrinks):\n" + "\n".join(sorted(new.elements())))
    assert not gone, ("these baseline errors no longer occur: shrink the baseline with "
                      "`python tests/test_mypy.py --write-baseline`:\n"
                      + "\n".join(sorted(gone.elements())))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-baseline"]:
        sys.exit("usage: python tests/test_mypy.py --write-baseline")
    write_baseline(current_errors())
    print(f"{BASELINE}: {sum(read_baseline().values())} errors")
