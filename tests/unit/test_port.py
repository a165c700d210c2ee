"""One port: the store is probed for its optional capabilities in one place
(``runtime/_port.py``), and a store with only the required methods (base, fenced, durable) works
end to end."""

from __future__ import annotations

import ast
import importlib.util
import logging
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Set

import pytest

from ptb_fence import Attempt, Exhaustion, MemoryUpdateStore, UpdateIntake
from ptb_fence.contract import DURABLE_METHODS, LIVENESS_METHODS, ClaimTerms
from ptb_fence.runtime._port import StorePort

from runtime_support import StoreWrapper, body, wait_until

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ptb_fence"

# modules that probe stores legitimately: the port itself, the protocol helpers it uses, and
# the tools that inspect a user's store (conformance check, CLI, chaos runner, test helpers)
ALLOWED = {"ptb_fence/runtime/_port.py", "ptb_fence/contract.py"}
ALLOWED_PACKAGES = (
    "ptb_fence/cli/",
    "ptb_fence/chaos/",
    "ptb_fence/conformance/",
    "ptb_fence/testing/",
)
# Nothing may be listed here: the PTB adapter calls only the runtime.
KNOWN_PTB_OFFENDERS: Set[str] = set()

OPTIONAL_NAMES = (
    {"add_many", "renew_many", "renew_owned_many"}
    | set(LIVENESS_METHODS)
    | {"transaction", "bind_bot", "release_many"}
)


def _probes(path: Path) -> List[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
        ):
            continue
        target = ast.unparse(node.args[0])
        name = node.args[1]
        probed = name.value if isinstance(name, ast.Constant) else None
        if "store" in target.lower() or probed in OPTIONAL_NAMES:
            where = path.relative_to(ROOT).as_posix()
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_capability_probe_outside_the_port() -> None:
    offenders: List[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where in ALLOWED or where.startswith(ALLOWED_PACKAGES):
            continue
        offenders += _probes(path)
    unexpected = [o for o in offenders if o.split(":")[0] not in KNOWN_PTB_OFFENDERS]
    assert unexpected == [], "capability probes outside runtime/_port.py:\n" + "\n".join(
        unexpected
    )


def test_the_probe_finder_finds_probes() -> None:
    assert _probes(PACKAGE / "runtime" / "_port.py")


# -- a store with only the required methods ---------------------------------------------------
def _custom_store_module() -> Any:
    spec = importlib.util.spec_from_file_location("custom_store", ROOT / "examples" / "custom_store.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("custom_store", module)
    spec.loader.exec_module(module)
    return module


def test_custom_store_completes_in_the_callers_transaction(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """examples/custom_store.py conforms but its settle_owned takes no connection=: a
    transaction(connection=…, complete=True) used to raise TypeError; now it commits the
    domain write, then completes (at-least-once), and the runtime said so once at start."""
    store = _custom_store_module().DictUpdateStore()
    db = tmp_path / "domain.db"
    with sqlite3.connect(db) as setup:
        setup.execute("CREATE TABLE writes (update_id INTEGER PRIMARY KEY)")
    errors: List[BaseException] = []
    exhaustions: List[Exhaustion] = []
    runs: Dict[int, int] = {}
    lock = threading.Lock()

    def handle_attempt(update: Dict[str, Any], attempt: Attempt) -> None:
        update_id = update["update_id"]
        with lock:
            runs[update_id] = runs.get(update_id, 0) + 1
        if update_id == 2:
            raise RuntimeError("always fails")
        if update_id == 3 and runs[update_id] == 1:
            raise RuntimeError("fails once")
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            conn.execute("BEGIN")
            try:
                with attempt.transaction(connection=conn, complete=True) as tx:
                    tx.execute("INSERT INTO writes VALUES (?)", (update_id,))
            except BaseException as exc:
                errors.append(exc)
                raise
        finally:
            conn.close()

    with caplog.at_level(logging.WARNING, logger="ptb_fence"):
        intake = UpdateIntake(
            store,
            handle_attempt=handle_attempt,
            handle_exhaustion=exhaustions.append,
            max_attempts=2,
            retry=lambda error, attempt: 0.0,
            sweep_every_seconds=0.2,
            pending_grace_seconds=0.1,
        )
    warnings = [r for r in caplog.records if "connection=" in r.getMessage()]
    assert len(warnings) == 1 and "at-least-once" in warnings[0].getMessage()
    with intake:
        for update_id in (1, 2, 3):
            assert intake.accept(body(update_id)) == "accepted"
        assert wait_until(lambda: len(exhaustions) == 1 and runs.get(3) == 2, 20)
        assert intake.idle(10)
    assert errors == []
    with sqlite3.connect(db) as check:
        written = sorted(r[0] for r in check.execute("SELECT update_id FROM writes"))
    assert written == [1, 3]
    assert runs == {1: 1, 2: 2, 3: 2}  # completed ones never ran again
    assert exhaustions[0].update_id == 2 and "always fails" in exhaustions[0].error
    assert store.due(now=10**15, pending_before=10**15, limit=10) == []
    assert store.due_exhaustions(limit=10) == []  # acknowledged


def test_a_store_without_transaction_names_the_fix() -> None:
    store = StoreWrapper(methods=DURABLE_METHODS)
    seen: List[BaseException] = []

    def handle_attempt(update: Dict[str, Any], attempt: Attempt) -> None:
        try:
            with attempt.transaction():
                pass
        except TypeError as exc:
            seen.append(exc)

    with UpdateIntake(store, handle_attempt=handle_attempt) as intake:
        intake.accept(body(1))
        assert intake.idle(10)
    assert len(seen) == 1 and "pass connection=" in str(seen[0])


# -- fallbacks equal the native batch calls ---------------------------------------------------
def _ports() -> "list[tuple[StorePort, MemoryUpdateStore]]":
    native = MemoryUpdateStore()
    inner = MemoryUpdateStore()
    return [
        (StorePort(native, component="t", fenced=True, durable=True), native),
        (
            StorePort(
                StoreWrapper(inner, methods=DURABLE_METHODS), component="t", fenced=True, durable=True
            ),
            inner,
        ),
    ]


def test_port_flags_are_decided_once() -> None:
    (native, _), (bare, _) = _ports()
    assert native.commits_batches and native.has_transaction
    assert native.atomic_completion
    assert not bare.commits_batches
    assert not bare.has_transaction and not bare.renews_owned_in_batches
    bare.bind_bot(42)  # no bind_bot: nothing to do


def test_batch_fallbacks_row_by_row() -> None:
    results = []
    for port, inner in _ports():
        inner.add(5, body(5), 0)
        recorded = port.record_claimed(
            [(4, body(4), 0), (5, body(5), 0)], ClaimTerms(0, 10_000, 3, True)
        )
        identity = recorded[0]
        assert recorded[1] is False
        assert not isinstance(identity, bool) and identity.attempt == 1
        assert port.owns(identity, 10_000) and not port.owns(identity, 10_001)
        assert port.renew_owned_many([identity], 20_000, 5_000) == [True]
        assert port.renew_many([(5, 1)], 20_000, 5_000) == [False]
        assert port.add_many([(6, body(6), 0), (4, body(4), 0)]) == [True, False]
        from ptb_fence import Completed

        landed = port.settle_owned_many([(identity, Completed(6_000)), (identity, Completed(6_000))])
        assert landed == [True, False]
        results.append((recorded[1], landed))
    assert results[0] == results[1]
