"""The house rules of docs/ARCHITECTURE.md, checked: no import circles between the package's
modules, and no function-local imports between them (the CLI's command modules excepted, and
the lazy ``recovery_logs.api`` re-export in ``recovery_logs/__init__.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "recovery_logs"
LAZY_OK = {"recovery_logs/__init__.py"}   # `import recovery_logs` stays cheap for the CLI


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(PKG.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _top_level_imports(path: Path, mods: dict[str, Path]) -> set[str]:
    deps = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:   # TYPE_CHECKING blocks are not top level
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("recovery_logs"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                deps.add(sub if sub in mods else node.module)
        elif isinstance(node, ast.Import):
            deps.update(a.name for a in node.names if a.name.startswith("recovery_logs"))
    return {d for d in deps if d in mods}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    mods = _modules()
    graph = {m: _top_level_imports(p, mods) for m, p in mods.items()}
    assert _cycles(graph) == []
    # the check sees real edges (a rewrite that parsed nothing would pass vacuously)
    assert "recovery_logs.pipeline.engine" in graph["recovery_logs.pipeline.replay"]


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_function_local_imports_between_project_modules():
    bad = []
    for p in sorted(PKG.rglob("*.py")):
        rel = str(p.relative_to(PKG.parent))
        if rel.startswith("recovery_logs/commands/") or rel in LAZY_OK:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    mod = (inner.module if isinstance(inner, ast.ImportFrom) else
                           inner.names[0].name if isinstance(inner, ast.Import) else None)
                    if mod and mod.startswith("recovery_logs"):
                        bad.append(f"{rel}:{inner.lineno} {mod}")
    assert bad == []
