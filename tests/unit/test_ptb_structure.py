"""The layout of ``ptb_fence.ptb``: its modules import one way, none uses
another module's private names, and the Application mix-in binds to the
processor through public methods.

Imports are read with :mod:`ast`, counting those inside functions and under
``TYPE_CHECKING`` too (a type-only import still ties two modules together).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import ptb_fence.ptb

PACKAGE = "ptb_fence.ptb"
ROOT = Path(ptb_fence.ptb.__file__).resolve().parent

# Private names of the runtime package that ptb/ uses: none (the attempt context variable is
# set through runtime._attempt's enter_attempt/exit_attempt).
RUNTIME_PRIVATE_ALLOWED: Set[Tuple[str, str, str]] = set()
# Attempt's private fields used from ptb/: none (it has public transition methods).
ATTEMPT_PRIVATE_ALLOWED: Set[Tuple[str, str]] = set()


def _modules() -> Dict[str, ast.Module]:
    return {
        path.stem: ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for path in sorted(ROOT.glob("*.py"))
    }


def _target(node: ast.ImportFrom, alias: ast.alias) -> str:
    module = node.module or ""
    if node.level:  # relative: ptb/ uses none, but count them correctly if one appears
        module = PACKAGE + ("." + module if module else "")
    if module == PACKAGE and alias.name.startswith("_"):
        module = f"{PACKAGE}.{alias.name}"
    return module


def _graph() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for name, tree in _modules().items():
        edges: Set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    target = _target(node, alias)
                    if target.startswith(PACKAGE + "."):
                        edges.add(target[len(PACKAGE) + 1 :])
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(PACKAGE + "."):
                        edges.add(alias.name[len(PACKAGE) + 1 :])
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    found: List[List[str]] = []
    colour: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> None:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt) == 1:
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt in graph and not colour.get(nxt):
                visit(nxt)
        stack.pop()
        colour[node] = 2

    for node in sorted(graph):
        if not colour.get(node):
            visit(node)
    return found


def test_ptb_modules_import_one_way() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles in ptb_fence/ptb: " + "; ".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_no_ptb_module_uses_another_modules_private_names() -> None:
    misuse: List[Tuple[str, str, str]] = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    target = _target(node, alias)
                    own_module = target == f"{PACKAGE}.{alias.name}"
                    if private and target.startswith("ptb_fence") and not own_module:
                        if (name, target, alias.name) not in RUNTIME_PRIVATE_ALLOWED:
                            misuse.append((name, f"from {target} import ", alias.name))
            elif isinstance(node, ast.Attribute):
                attr = node.attr
                if not attr.startswith("_") or attr.startswith("__"):
                    continue
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if (name, attr) in ATTEMPT_PRIVATE_ALLOWED:
                    continue
                misuse.append((name, ast.unparse(owner) + ".", attr))
    assert not misuse, "private names used across modules of ptb_fence/ptb: " + ", ".join(
        f"{module}: {owner}{attr}" for module, owner, attr in misuse
    )


def test_the_application_mixin_binds_through_public_methods() -> None:
    """``build()`` binds the processor with its public ``attach``; a second Application is
    refused by name. The mix-in knows the processor only as an ``ApplicationBinding``."""
    from telegram.ext import Application

    from ptb_fence import MemoryUpdateStore
    from ptb_fence.ptb import BaseFenceProcessor, FencedUpdateProcessor
    from ptb_fence.ptb._interfaces import ApplicationBinding

    assert issubclass(BaseFenceProcessor, ApplicationBinding)
    for method in ("attach", "application_stopping", "application_started"):
        assert getattr(BaseFenceProcessor, method).__doc__, method
    processor = FencedUpdateProcessor(MemoryUpdateStore())
    app = processor.install(Application.builder().token("123:abc")).build()
    assert processor.application is app
    processor.attach(app)  # the same Application again: accepted
    other = Application.builder().token("123:abc").update_queue(processor.queue).build()
    try:
        processor.attach(other)
    except RuntimeError as exc:
        assert "already belongs to another Application" in str(exc)
    else:
        raise AssertionError("attach() accepted a second Application")
    assert processor.application is app
