"""The tree's lint, run by the test command.

- ruff with the repository's ruff.toml (pycodestyle, pyflakes, import order, bugbear,
  pyupgrade) over every tracked Python file. Fix with `ruff check --fix <file>`.
- No comment or docstring cites a tracker's issue number ("issue" and a number): a reader of the code
  cannot open it. Say what the code does and why, or name a file in the tree.

Both skip the files ruff.toml lists under extend-exclude (work in flight elsewhere).
"""
from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize

from tree_files import ROOT, in_flight, tracked_python_files

ISSUE_REF = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def test_ruff_passes() -> None:
    files = tracked_python_files()
    assert files
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--force-exclude",
                        "--output-format", "concise", *files],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (f"ruff check failed (fix with `ruff check --fix <file>`):\n"
                               f"{r.stdout}{r.stderr}")


def issue_citations(source: str) -> list[tuple[int, str]]:
    """(line, text) of each comment or docstring line that cites an issue number."""
    found: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and ISSUE_REF.search(tok.string):
            found.append((tok.start[0], tok.string.strip()))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                for i, line in enumerate(body[0].value.value.splitlines()):
                    if ISSUE_REF.search(line):
                        found.append((body[0].lineno + i, line.strip()))
    return sorted(found)


def test_issue_citations_are_found() -> None:
    src = '"""Fixed in issue 13."""\nx = 1  # see Issue #5\ns = "issue 7 in a string is data"\n'
    assert [n for n, _ in issue_citations(src)] == [1, 2]


def test_no_comment_cites_an_issue_number() -> None:
    bad = [f"{path}:{line}: {text}"
           for path in tracked_python_files() if not in_flight(path)
           for line, text in issue_citations((ROOT / path).read_text())]
    assert not bad, ("comments and docstrings cite issue numbers a reader cannot open; say "
                     "what and why instead:\n" + "\n".join(bad))
