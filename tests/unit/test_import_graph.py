"""The import graph of ptb_fence/ has no cycles.

Built with ``ast`` from the source: module-level and function-level imports both count;
imports under ``if TYPE_CHECKING:`` do not (they never run). Importing ``a.b.c`` counts as an
edge to ``a.b.c`` only (not to the packages ``a`` and ``a.b`` Python runs first), and an import
of one of the importing module's own ancestor packages is no edge (Python has always started
importing the ancestors before the module itself runs, e.g. ``chaos._runner`` reading
``ptb_fence.chaos.__doc__``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set

PACKAGE = Path(__file__).resolve().parents[2] / "ptb_fence"

# No package may be listed here (the PTB adapter's former import cycle is gone).
KNOWN_CYCLE_PACKAGES: Set[str] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, typing_too: bool = False) -> Iterator[ast.AST]:
    """Every Import/ImportFrom node that runs (skipping ``if TYPE_CHECKING:`` bodies unless
    ``typing_too``)."""
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if not typing_too and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(typing_too: bool = False) -> Dict[str, Set[str]]:
    modules = _modules()
    graph: Dict[str, Set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(encoding="utf-8")), typing_too):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                assert isinstance(node, ast.ImportFrom)
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    if not is_package:
                        anchor = anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target in modules and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    found: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package(component: List[str]) -> str:
    packages = {m.rsplit(".", 1)[0] for m in component}
    return packages.pop() if len(packages) == 1 else "several packages: " + ", ".join(
        sorted(packages)
    )


def test_the_graph_sees_imports() -> None:
    graph = import_graph()
    assert "ptb_fence.runtime._attempt" in graph["ptb_fence.runtime._runtime"]
    assert len(graph) > 30


def test_no_import_cycles() -> None:
    by_package: Dict[str, List[List[str]]] = {}
    for component in cycles(import_graph()):
        by_package.setdefault(_package(component), []).append(component)
    unexpected = {p: c for p, c in by_package.items() if p not in KNOWN_CYCLE_PACKAGES}
    assert not unexpected, f"import cycles: {unexpected}"


def test_runtime_has_no_cycle_even_counting_type_only_imports() -> None:
    """The runtime's layers (options → attempt → lease keeper → core) import one way, even
    for type annotations: Attempt and the lease keeper depend on narrow interfaces."""
    graph = import_graph(typing_too=True)
    runtime = {
        name: {t for t in targets if t.startswith("ptb_fence.runtime.")}
        for name, targets in graph.items()
        if name.startswith("ptb_fence.runtime.")
    }
    assert cycles(runtime) == []
