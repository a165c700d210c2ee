"""Each store class reads whole in one module: no class in ``ptb_fence/stores/`` derives from a
class defined in another module of ``ptb_fence``.

A class that grows gets collaborators it *has* (a connection pool, a liveness holder, the
statements object), each with its own state, not mixins it *is* spread over other files.
Protocols, exceptions and the ``typing`` machinery are not mixins and are allowed as bases.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Iterator, List

import ptb_fence.stores


def _store_modules() -> Iterator[str]:
    yield ptb_fence.stores.__name__
    for info in pkgutil.walk_packages(ptb_fence.stores.__path__, ptb_fence.stores.__name__ + "."):
        yield info.name


def _is_allowed_base(base: type) -> bool:
    return (
        base is object
        or not base.__module__.startswith("ptb_fence")
        or issubclass(base, BaseException)
        or bool(getattr(base, "_is_protocol", False))
    )


def _foreign_bases() -> List[str]:
    """Each class of the stores with a base from another module of ``ptb_fence``."""
    problems: List[str] = []
    for name in _store_modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name:
                continue
            qualified = f"{name}.{cls.__qualname__}"
            foreign = [
                f"{base.__module__}.{base.__qualname__}"
                for base in cls.__mro__[1:]
                if base.__module__ != name and not _is_allowed_base(base)
            ]
            if foreign:
                problems.append(f"{qualified} derives from {', '.join(foreign)}")
    return problems


def test_no_store_class_derives_from_a_class_of_another_module() -> None:
    problems = _foreign_bases()
    assert not problems, (
        "a store class is spread over modules; fold the mixin into the class or make it a "
        "collaborator the class holds:\n" + "\n".join(problems)
    )


def test_the_check_sees_every_store_module() -> None:
    modules = set(_store_modules())
    assert {
        "ptb_fence.stores.memory._store",
        "ptb_fence.stores.sqlite._store",
        "ptb_fence.stores.postgres._store",
    } <= modules
