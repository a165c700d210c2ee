"""The public API: names exist, are documented, match the SPEC, and ship typed."""

from __future__ import annotations

import configparser
import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set, Tuple

import pytest

import ptb_fence

ROOT = Path(__file__).resolve().parents[2]

PUBLIC_MODULES = (
    "ptb_fence",
    "ptb_fence.ptb",
    "ptb_fence.runtime",
    "ptb_fence.stores",
    "ptb_fence.testing",
    "ptb_fence.conformance",
    "ptb_fence.cli",
)

# The specified names importable from ``ptb_fence`` itself (store contract, stores, attempt
# context, blocking front end)
SPEC_TOP_LEVEL = (
    "AttemptIdentity",
    "StoredUpdate",
    "Exhaustion",
    "Completed",
    "Failed",
    "Abandoned",
    "UpdateStore",
    "FencedUpdateStore",
    "DurableUpdateStore",
    "is_fenced",
    "is_durable",
    "MemoryUpdateStore",
    "SQLiteUpdateStore",
    "PostgresUpdateStore",
    "postgres_update_store_schema",
    "Attempt",
    "OwnershipLost",
    "current_attempt",
    "UpdateIntake",
    "webhook_app",
)

# The store contract's value types, their fields in order, and a keyword construction
VALUE_TYPES: Dict[str, Tuple[Tuple[str, ...], Dict[str, Any]]] = {
    "AttemptIdentity": (
        ("update_id", "attempt", "claim_id"),
        {"update_id": 7, "attempt": 2, "claim_id": "c0ffee"},
    ),
    "StoredUpdate": (("update_id", "body"), {"update_id": 7, "body": '{"update_id": 7}'}),
    "Exhaustion": (
        ("update_id", "attempt", "claim_id", "body", "exhausted_at", "error"),
        {
            "update_id": 7,
            "attempt": 5,
            "claim_id": "c0ffee",
            "body": '{"update_id": 7}',
            "exhausted_at": 1_700_000_000_000,
            "error": "boom",
        },
    ),
    "Completed": (("at",), {"at": 1_700_000_000_000}),
    "Failed": (
        ("at", "retry_at", "error"),
        {"at": 1_700_000_000_000, "retry_at": 1_700_000_005_000, "error": "boom"},
    ),
    "Abandoned": (("at", "error"), {"at": 1_700_000_000_000, "error": "gave up"}),
}

# The store contract's three capability levels
BASE_METHODS = {"add", "claim", "renew", "settle", "due", "prune"}
FENCED_METHODS = BASE_METHODS | {"claim_owned", "renew_owned", "owns", "settle_owned"}
DURABLE_METHODS = FENCED_METHODS | {"exhaust", "due_exhaustions", "acknowledge_exhaustion"}


def _public_objects() -> Iterator[Tuple[str, Any]]:
    """Every (qualified name, object) the public modules export."""
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            yield f"{module_name}.{name}", getattr(module, name)


def _own_members(cls: type) -> Iterator[Tuple[str, Any]]:
    """Public methods and properties that ``cls`` or a ptb_fence base defines itself."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith("ptb_fence"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property) or inspect.isfunction(value):
                yield f"{klass.__module__}.{klass.__qualname__}.{name}", value


def _has_docstring(obj: Any) -> bool:
    doc = obj.__doc__
    if not isinstance(doc, str) or not doc.strip():
        return False
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        # a dataclass without a docstring gets its signature, e.g. "StoredUpdate(update_id: ...)"
        return not re.fullmatch(rf"{re.escape(obj.__name__)}\(.*\)", doc.strip(), re.DOTALL)
    return True


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_name_in_all_exists(module_name: str) -> None:
    module = importlib.import_module(module_name)
    names = module.__all__
    assert names, f"{module_name}.__all__ is empty"
    assert len(set(names)) == len(names), f"duplicates in {module_name}.__all__"
    missing = [name for name in names if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ names missing attributes: {missing}"
    assert _has_docstring(module), f"{module_name} has no module docstring"


def test_the_conformance_and_cli_entry_points_are_public() -> None:
    from ptb_fence import cli, conformance

    assert {"check_update_store", "RULES", "ConformanceRule"} <= set(conformance.__all__)
    assert "main" in cli.__all__
    assert callable(cli.main)
    assert conformance.RULES and all(
        isinstance(rule, conformance.ConformanceRule) for rule in conformance.RULES
    )


def test_every_public_class_and_function_has_a_docstring() -> None:
    undocumented: List[str] = []
    for qualified, obj in _public_objects():
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not _has_docstring(obj):
            undocumented.append(qualified)
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_every_public_method_and_property_has_a_docstring() -> None:
    undocumented = set()
    checked = 0
    for _, obj in _public_objects():
        if not inspect.isclass(obj):
            continue
        for qualified, member in _own_members(obj):
            checked += 1
            if not _has_docstring(member):
                undocumented.add(qualified)
    assert checked > 100  # the walk reaches the stores, the runtime and the processors
    assert not undocumented, f"public methods/properties without a docstring: {sorted(undocumented)}"


def test_docstring_check_bites() -> None:
    @dataclasses.dataclass(frozen=True)
    class Bare:
        x: int

    class Documented:
        """Has one."""

        def method(self) -> None:
            pass

    assert not _has_docstring(Bare)
    assert _has_docstring(Documented)
    assert [name for name, member in _own_members(Documented) if not _has_docstring(member)] == []
    Documented.__module__ = "ptb_fence.fake"
    assert [name.rsplit(".", 1)[1] for name, member in _own_members(Documented)
            if not _has_docstring(member)] == ["method"]


@pytest.mark.parametrize("name", SPEC_TOP_LEVEL)
def test_spec_names_are_importable_from_ptb_fence(name: str) -> None:
    module = importlib.import_module("ptb_fence")
    assert hasattr(module, name), f"ptb_fence.{name} is promised by the SPEC"
    assert name in module.__all__, f"ptb_fence.{name} is missing from ptb_fence.__all__"


def test_spec_names_in_subpackages() -> None:
    from telegram.ext import BaseUpdateProcessor

    from ptb_fence.conformance import check_update_store
    from ptb_fence.ptb import DurableUpdateProcessor, FencedUpdateProcessor

    assert issubclass(DurableUpdateProcessor, BaseUpdateProcessor)
    assert issubclass(FencedUpdateProcessor, BaseUpdateProcessor)
    assert callable(check_update_store)
    assert list(inspect.signature(check_update_store).parameters) == ["make"]


def _is_frozen_dataclass(cls: object) -> bool:
    return (
        inspect.isclass(cls)
        and dataclasses.is_dataclass(cls)
        and bool(getattr(cls, "__dataclass_params__").frozen)
    )


@pytest.mark.parametrize("name", sorted(VALUE_TYPES))
def test_value_types_are_frozen_keyword_dataclasses(name: str) -> None:
    cls: Any = getattr(ptb_fence, name)
    fields, kwargs = VALUE_TYPES[name]
    assert _is_frozen_dataclass(cls), f"{name} is not a frozen dataclass"
    assert tuple(field.name for field in dataclasses.fields(cls)) == fields
    value = cls(**kwargs)
    assert {field: getattr(value, field) for field in fields} == kwargs
    assert value == cls(**kwargs) and hash(value) == hash(cls(**kwargs))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, fields[0], kwargs[fields[0]])


def test_exhaustion_identity_is_its_exact_attempt_identity() -> None:
    fields = VALUE_TYPES["Exhaustion"][1]
    exhaustion = ptb_fence.Exhaustion(**fields)
    assert exhaustion.identity == ptb_fence.AttemptIdentity(
        update_id=fields["update_id"], attempt=fields["attempt"], claim_id=fields["claim_id"]
    )


def test_store_protocols_have_the_spec_capability_levels() -> None:
    def members(protocol: type) -> Set[str]:
        return {
            name
            for klass in protocol.__mro__
            if klass.__module__.startswith("ptb_fence")
            for name in vars(klass)
            if not name.startswith("_")
        }

    assert members(ptb_fence.UpdateStore) == BASE_METHODS
    assert members(ptb_fence.FencedUpdateStore) == FENCED_METHODS
    assert members(ptb_fence.DurableUpdateStore) == DURABLE_METHODS
    for store_class in (
        ptb_fence.MemoryUpdateStore,
        ptb_fence.SQLiteUpdateStore,
        ptb_fence.PostgresUpdateStore,
    ):
        missing = {
            name for name in DURABLE_METHODS | {"close", "__enter__", "__exit__"}
            if not callable(getattr(store_class, name, None))
        }
        assert not missing, f"{store_class.__name__} lacks {sorted(missing)}"


def test_py_typed_is_shipped() -> None:
    package_dir = Path(ptb_fence.__file__).resolve().parent
    assert (package_dir / "py.typed").is_file()
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    package_data = config.get("options.package_data", "ptb_fence", fallback="")
    assert "py.typed" in package_data.split(), package_data
    assert "Typing :: Typed" in config.get("metadata", "classifiers")


def _readme_python_blocks() -> List[str]:
    """The Python code blocks of README.rst (``.. code-block:: python`` and ``::`` literal blocks
    that import from ptb_fence)."""
    lines = (ROOT / "README.rst").read_text(encoding="utf-8").splitlines()
    blocks: List[str] = []
    for index, line in enumerate(lines):
        if not (line.strip() == ".. code-block:: python" or line.rstrip().endswith("::")):
            continue
        body: List[str] = []
        for following in lines[index + 1:]:
            if following.strip() and not following.startswith(" "):
                break
            body.append(following)
        text = inspect.cleandoc("\n".join(body))
        if line.strip() == ".. code-block:: python" or re.search(
            r"^(from ptb_fence\S* import|import ptb_fence)", text, re.MULTILINE
        ):
            blocks.append(text)
    return blocks


def _api_problems(blocks: List[str]) -> List[str]:
    """Imports of missing names, unknown attributes of the README's usual variables, and
    unknown keyword arguments of ptb_fence calls in ``blocks``."""
    import ast

    from ptb_fence.ptb import FencedUpdateProcessor

    # the README's variable names and the classes they stand for
    receivers = {
        "attempt": ptb_fence.Attempt,
        "intake": ptb_fence.UpdateIntake,
        "processor": FencedUpdateProcessor,
        "store": ptb_fence.SQLiteUpdateStore,
    }
    problems: List[str] = []
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ptb_fence"):
                module = importlib.import_module(node.module or "")
                problems += [
                    f"from {node.module} import {alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                ]
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in receivers
                and not hasattr(receivers[node.value.id], node.attr)
            ):
                problems.append(f"{node.value.id}.{node.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                target = getattr(ptb_fence, name, None) or (
                    getattr(receivers.get(getattr(node.func.value, "id", "")), name, None)
                    if isinstance(node.func, ast.Attribute)
                    else None
                )
                if target is None or not callable(target):
                    continue
                try:
                    signature = inspect.signature(target)
                except (TypeError, ValueError):
                    continue
                accepts_any = any(
                    p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
                )
                for keyword in node.keywords:
                    if keyword.arg and keyword.arg not in signature.parameters and not accepts_any:
                        problems.append(f"{name}(..., {keyword.arg}=...)")
    return problems


def test_readme_code_uses_real_names_and_methods() -> None:
    blocks = _readme_python_blocks()
    # the README keeps its first bot; the site's code is included from files that tests run
    assert len(blocks) >= 1, blocks
    problems = _api_problems(blocks)
    assert not problems, f"README code does not match the API: {problems}"


def test_readme_check_bites() -> None:
    wrong = (
        "from ptb_fence import SQLiteUpdateStore, FencedStore\n"
        "store = SQLiteUpdateStore('bot.db', tables='x')\n"
        "attempt.run_in_transaction(write, completed=True)\n"
        "attempt.claim\n"
    )
    assert sorted(_api_problems([wrong])) == [
        "SQLiteUpdateStore(..., tables=...)",
        "attempt.claim",
        "from ptb_fence import FencedStore",
        "run_in_transaction(..., completed=...)",
    ]
