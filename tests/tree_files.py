"""The tree's Python files, for the checks over the whole tree (tests/test_lint.py,
tests/test_mypy.py): what git tracks, less the files ruff.toml lists under extend-exclude
(work in flight elsewhere, linted and type-checked again once it lands)."""
from __future__ import annotations

import fnmatch
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tracked_python_files() -> list[str]:
    """The .py files git tracks (untracked work in a shared checkout is left out until it is
    added); every .py file outside hidden and build folders where this is not a checkout."""
    try:
        r = subprocess.run(["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT,
                           capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        r = None
    if r is None or r.returncode != 0:
        return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                      if not any(part.startswith(".") or part in ("build", "dist")
                                 for part in p.relative_to(ROOT).parts))
    return sorted(p for p in r.stdout.decode().split("\0") if p and (ROOT / p).is_file())


def in_flight(path: str) -> bool:
    """Whether ruff.toml's extend-exclude names `path` (relative to the top of the tree)."""
    with open(ROOT / "ruff.toml", "rb") as f:
        patterns = tomllib.load(f).get("extend-exclude", [])
    return any(fnmatch.fnmatch(path, pat) for pat in patterns)
