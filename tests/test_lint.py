"""The tree's lint, run by the test command.

- ruff with the repository's ruff.toml (pycodestyle, pyflakes, import order, bugbear,
  pyupgrade) over every tracked Python file. Fix with `ruff check --fix <file>`.
- No comment or docstring cites a tracker's issue number ("issue" and a number): a reader of the code
  cannot open it. Say what the code does and why, or name a file in the tree.
- The documents (docs/*.md, bench/README.md) cite no "issue N", "promise N" or "scope N" either:
  numbered items of a tracker or a brief that their reader cannot open. DOC_REFS_ALLOWED lists
  the rare phrase that legitimately needs one, by file.

Both skip the files ruff.toml lists under extend-exclude (work in flight elsewhere).
"""
from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Container

from tree_files import ROOT, in_flight, tracked_python_files

ISSUE_REF = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)
DOC_REF = re.compile(r"\b(?:issues?|promises?|scopes?)\s*#?\d+", re.IGNORECASE)
DOCS = ("docs/*.md", "bench/README.md")
# path -> phrases DOC_REF may match there, each with the reason it is needed (none today)
DOC_REFS_ALLOWED: dict[str, set[str]] = {}


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


def doc_references(text: str, allowed: Container[str] = ()) -> list[tuple[int, str]]:
    """(line, phrase) of each reference a reader cannot open, less the allowed phrases."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1)
            for m in DOC_REF.finditer(line) if m.group(0) not in allowed]


def doc_files() -> list[str]:
    return sorted({str(p.relative_to(ROOT)) for pat in DOCS for p in ROOT.glob(pat)})


def test_doc_references_are_found() -> None:
    text = "As issue 28 says,\nthe brief's Promise 3 and scope 4;\nIssues #5, a promise kept, scope\n"
    assert doc_references(text) == [(1, "issue 28"), (2, "Promise 3"), (2, "scope 4"), (3, "Issues #5")]
    assert doc_references(text, {"scope 4"}) == [(1, "issue 28"), (2, "Promise 3"), (3, "Issues #5")]


def test_no_document_cites_what_a_reader_cannot_open() -> None:
    files = doc_files()
    assert "docs/BENCHMARKS.md" in files and "bench/README.md" in files
    bad = [f"{path}:{line}: {phrase}" for path in files
           for line, phrase in doc_references((ROOT / path).read_text(),
                                              DOC_REFS_ALLOWED.get(path, set()))]
    assert not bad, ("documents cite issues, promises or scopes a reader cannot open; say the "
                     "thing itself (or add the phrase to DOC_REFS_ALLOWED with why):\n"
                     + "\n".join(bad))


def test_allowed_doc_references_still_occur() -> None:
    """An allow-list entry whose phrase is gone from its file is stale: remove it."""
    stale = [f"{path}: {phrase}" for path, phrases in DOC_REFS_ALLOWED.items()
             for phrase in phrases if phrase not in (ROOT / path).read_text()]
    assert not stale, "stale DOC_REFS_ALLOWED entries:\n" + "\n".join(stale)
