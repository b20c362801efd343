"""No import cycles inside gmountpy: every import, also one inside a function or under TYPE_CHECKING, flows
one way (a module importing its own parent package is not a cycle: the package imports it back to export it)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import gmountpy

ROOT = Path(gmountpy.__file__).parent


def module_name(path: Path) -> str:
    parts = ["gmountpy", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph[str]:
    files = {module_name(path): path for path in ROOT.rglob("*.py")}
    graph: nx.DiGraph[str] = nx.DiGraph()
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph.add_edge(name, target)
    return graph


def test_the_graph_sees_imports_inside_functions() -> None:
    edges = set(import_graph().edges)
    assert ("gmountpy.api.cluster", "gmountpy.launch") in edges  # `from .. import launch` inside Cluster.up


#: Cycles known and not yet broken. Remove an entry when its cycle is gone; never add one for new code.
KNOWN: set[frozenset[str]] = set()


def test_no_module_imports_itself_through_others() -> None:
    found = sorted(nx.simple_cycles(import_graph()), key=len)
    cycles = [c for c in found if frozenset(c) not in KNOWN]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:10])
    gone = KNOWN - {frozenset(c) for c in found}
    assert not gone, f"known cycles that no longer exist (remove them from KNOWN): {gone}"
