"""No import cycles in the client, daemon, bpf and gpu packages, lazy imports included.

A cycle is hidden, not removed, by moving an import into a function: the two modules still
cannot be understood, tested or shipped one without the other. So every import statement
counts here, wherever it stands. The check reads the source (ast) and imports nothing.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def import_graph(room: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in its source)."""
    files = {}
    for f in room.rglob("*.py"):
        parts = [p for p in f.relative_to(room).with_suffix("").parts if p != "__init__"]
        files[".".join([package, *parts])] = f
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        base = name if f.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    up = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                    mod = f"{up}.{mod}" if mod else up
                subs = [f"{mod}.{a.name}" for a in node.names]
                # `from . import sub` depends on the submodule, not on the package's
                # __init__ (as `from .sub import x` does); a name that is no module is
                # the package's own
                targets = subs if all(t in files for t in subs) else [mod, *subs]
            else:
                continue
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = [stack.pop()]
            while comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_client_package_has_no_import_cycle() -> None:
    graph = import_graph(ROOT / "client", "zerolayer.client")
    assert graph["zerolayer.client.address"] == set()   # the grammar: for every module
    carriers = ("transport", "udp_transport", "shm_transport", "fleet")
    assert all("zerolayer.client.connect" not in graph[f"zerolayer.client.{c}"]
               for c in carriers)                       # dispatch sits above the carriers
    assert cycles(graph) == []


def test_the_daemon_package_has_no_import_cycle() -> None:
    graph = import_graph(ROOT / "daemon", "zerolayer.daemon")
    server = "zerolayer.daemon.server"
    assert not [m for m, deps in graph.items() if server in deps]   # the top: nobody's import
    for low in ("lifecycle", "in_flight", "carriers", "request", "result_cache"):
        assert server not in graph[f"zerolayer.daemon.{low}"]
    assert cycles(graph) == []


def test_the_bpf_package_has_no_import_cycle() -> None:
    assert cycles(import_graph(ROOT / "bpf", "zerolayer.bpf")) == []


def test_the_gpu_package_has_no_import_cycle() -> None:
    graph = import_graph(ROOT / "gpu", "zerolayer.gpu")
    assert "zerolayer.gpu.cuda.forward" not in graph["zerolayer.gpu.cuda.graph"]  # graph sits below
    assert cycles(graph) == []


def test_the_protocol_imports_no_other_room() -> None:
    graph = import_graph(ROOT / "protocol", "zerolayer.protocol")
    assert cycles(graph) == []
    for f in (ROOT / "protocol").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert not node.module.startswith("zerolayer."), (f, node.module)


def test_the_daemon_gpu_and_bpf_speak_the_protocol_not_the_sdk() -> None:
    """The wire belongs to no side: a room imports zerolayer.protocol. The daemon's client
    programs (daemon/programs/: the CLI and the HTTP edge) are clients themselves and import
    the SDK; nothing else in daemon/, gpu/ or bpf/ does, and nothing outside programs/
    imports them."""
    programs = ROOT / "daemon" / "programs"
    for room in ("daemon", "gpu", "bpf"):
        for f in (ROOT / room).rglob("*.py"):
            if programs in f.parents:
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.startswith("zerolayer.client"), (f, node.module)
                    assert "programs" not in node.module.split("."), (f, node.module)


def test_nothing_in_gpu_or_bpf_imports_the_daemon() -> None:
    for room in ("gpu", "bpf"):
        for f in (ROOT / room).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.startswith(("zerolayer.daemon", "daemon")), f
                    assert not (node.level >= 2 and node.module.startswith("daemon")), f


def test_the_benchmarks_have_no_import_cycle() -> None:
    """bench/ is flat scripts that import each other by bare name (the harness, a sibling's
    helpers); lazy imports count here too."""
    files = {f.stem: f for f in (ROOT / "bench").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                mods = [node.module]
            else:
                continue
            deps |= {m.split(".")[0] for m in mods} & set(files) - {name}
        graph[name] = deps
    assert graph["_harness"] == set()                 # the harness imports no benchmark
    assert "gpu_bench" not in graph["gpu_warm"]       # the compile workers sit below the check
    assert cycles(graph) == []


def test_the_checker_sees_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from .b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "c.py").write_text("import pkg.a\n")
    (tmp_path / "d.py").write_text("from pkg.a import f\n")
    graph = import_graph(tmp_path, "pkg")
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
