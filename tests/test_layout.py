"""The package's import graph (every ``import`` in every module, function-local ones
included): no import cycle, and imports run one way through the layers
``scripts -> bench/eval/training -> registry/testing -> methods -> core -> models``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jaxspec", "models", "scripts")

# (prefix, rank): a module may import modules of its own rank or lower; longest prefix wins
LAYERS = (
    ("models", 0),
    ("jaxspec.core", 1),
    ("jaxspec.causal", 2),
    ("jaxspec.dllm", 2),
    ("jaxspec.asarm", 2),
    ("jaxspec.methods", 3),
    ("jaxspec.testing", 3),
    ("jaxspec", 3),
    ("jaxspec.bench", 4),
    ("jaxspec.eval", 4),
    ("jaxspec.training", 4),
    ("scripts", 5),
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (resolved to existing modules)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and t.split(".")[0] in PACKAGES:
                    deps.add(t)
        graph[name] = deps
    return graph


def _rank(module: str) -> int:
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_sees_the_packages():
    g = import_graph()
    assert "jaxspec.core.verify" in g and "models.registry" in g and "scripts.generate" in g
    assert "jaxspec.core.verify" in g["jaxspec.causal.decode"]


def test_no_import_cycles():
    assert _cycles(import_graph()) == []


def test_imports_run_one_way():
    bad = [
        f"{m} (layer {_rank(m)}) imports {d} (layer {_rank(d)})"
        for m, deps in import_graph().items()
        for d in sorted(deps)
        if _rank(d) > _rank(m)
    ]
    assert bad == [], "\n".join(bad)


def test_cycle_detector_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
