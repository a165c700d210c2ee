"""Every library class is whole in its module: none derives from a mixin that lives in
another module and serves that one class alone.

A class that grows gets collaborators it *has* (``Runtime.recovery``, ``Runtime.jobs``), not
single-use base classes spread over files. Read with :mod:`ast`; a base class counts as a
mixin unless it is an interface (a ``Protocol``, or an ABC whose methods are all abstract), an
exception, or a public class (exported from a package's ``__all__``: made for users to derive
from).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import ptb_fence

ROOT = Path(ptb_fence.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _parse() -> Dict[str, ast.Module]:
    return {
        _module_name(path): ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for path in sorted(ROOT.rglob("*.py"))
    }


def _imported_names(tree: ast.Module) -> Dict[str, Tuple[str, str]]:
    """Local name -> (module, name) for ``from ptb_fence... import name`` anywhere."""
    names: Dict[str, Tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ptb_fence"):
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module or "", alias.name)
    return names


def _is_interface(cls: ast.ClassDef) -> bool:
    base_names = {ast.unparse(base) for base in cls.bases}
    if any(name.split(".")[-1] in ("Protocol", "Exception") or name.endswith("Error")
           for name in base_names):
        return True
    methods = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    abstract = [
        m for m in methods
        if any(ast.unparse(d).split(".")[-1] == "abstractmethod" for d in m.decorator_list)
    ]
    return bool(methods) and len(abstract) == len(methods)


def _public_names(modules: Dict[str, ast.Module]) -> Set[str]:
    public: Set[str] = set()
    for name, tree in modules.items():
        if not name.split(".")[-1].startswith("_"):
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
                ):
                    public.update(ast.literal_eval(node.value))
    return public


def _library_classes() -> Tuple[Dict[Tuple[str, str], ast.ClassDef], List[Tuple[str, str, str, str]]]:
    """All classes by (module, name), and each (module, class, base module, base name) edge
    whose base is a library class."""
    modules = _parse()
    classes: Dict[Tuple[str, str], ast.ClassDef] = {}
    for module, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[(module, node.name)] = node
    edges: List[Tuple[str, str, str, str]] = []
    for module, tree in modules.items():
        imported = _imported_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                if not isinstance(base, ast.Name):
                    continue
                if (module, base.id) in classes:
                    edges.append((module, node.name, module, base.id))
                elif base.id in imported:
                    source, original = imported[base.id]
                    # a package re-export: find the module that defines it
                    owner = next(
                        (m for (m, n) in classes if n == original and m.startswith(source)),
                        None,
                    )
                    if owner is not None:
                        edges.append((module, node.name, owner, original))
    return classes, edges


def test_no_class_derives_from_a_single_use_mixin_of_another_module() -> None:
    classes, edges = _library_classes()
    public = _public_names(_parse())
    uses: Dict[Tuple[str, str], int] = {}
    for _, _, base_module, base in edges:
        uses[(base_module, base)] = uses.get((base_module, base), 0) + 1
    offending = [
        f"{module}.{name} derives from {base_module}.{base}"
        for module, name, base_module, base in edges
        if base_module != module
        and uses[(base_module, base)] == 1
        and not _is_interface(classes[(base_module, base)])
        and base not in public
    ]
    assert not offending, (
        "single-use mixins in other modules (make them collaborators the class has, or keep "
        "the class whole in one module): " + "; ".join(offending)
    )


def test_the_check_finds_a_single_use_mixin() -> None:
    """The check above can fail: a mixin in one module used by one class in another is
    found (the shape the runtime had before it got collaborators)."""
    mixin = ast.parse("class RecordingOps:\n    def record(self) -> None: ...\n").body[0]
    interface = ast.parse(
        "class Port(Protocol):\n    def record(self) -> None: ...\n"
    ).body[0]
    abstract = ast.parse(
        "class Binding(abc.ABC):\n    @abc.abstractmethod\n    def attach(self) -> None: ...\n"
    ).body[0]
    assert isinstance(mixin, ast.ClassDef) and not _is_interface(mixin)
    assert isinstance(interface, ast.ClassDef) and _is_interface(interface)
    assert isinstance(abstract, ast.ClassDef) and _is_interface(abstract)
    _, edges = _library_classes()
    # the real tree has cross-module edges (the check looks at something)
    assert any(module != base_module for module, _, base_module, _ in edges)
