"""Attempt owns its life cycle (an explicit phase, transition methods) and no
module outside ``runtime/_attempt.py`` touches an attempt's private state."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List, Set

import pytest

from ptb_fence import AttemptFinished, MemoryUpdateStore, RuntimeOptions
from ptb_fence.runtime._attempt import Phase
from ptb_fence.runtime._runtime import Outcome, Runtime

PACKAGE = Path(__file__).resolve().parents[2] / "ptb_fence"

# Nothing may be listed here: ptb/ uses ``attempt.body = …`` and ``attempt.begin_settling()``.
KNOWN_PTB_OFFENDERS: Set[str] = set()


def _private_attempt_accesses(path: Path) -> List[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and "attempt" in node.value.id.lower()
        ):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: .{node.attr}")
    return found


def test_nothing_outside_attempt_touches_its_private_state() -> None:
    offenders: List[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_attempt.py" and path.parent.name == "runtime":
            continue
        offenders += _private_attempt_accesses(path)
    unexpected = [o for o in offenders if o.split(":")[0] not in KNOWN_PTB_OFFENDERS]
    assert unexpected == []


def _runtime(**kwargs: object) -> Runtime:
    return Runtime(
        MemoryUpdateStore(),
        RuntimeOptions(),
        attempt_aware=True,
        handle_exhaustion=bool(kwargs.get("durable", False)),
    )


def test_completed_in_a_transaction_then_settled_then_ended() -> None:
    runtime = _runtime()
    runtime.store.add(1, '{"update_id": 1}', runtime.now_ms())
    attempt = runtime.claim(1, '{"update_id": 1}')
    assert attempt is not None and attempt.phase is Phase.RUNNING
    assert runtime.keeper.active() == [attempt]
    with attempt.transaction(complete=True):
        assert attempt.phase is Phase.RUNNING  # COMPLETING only while the settle runs
    assert attempt.phase is Phase.COMPLETED and attempt.completed and attempt.finished
    with pytest.raises(AttemptFinished):
        with attempt.transaction():
            pass
    outcome, exhaustion = runtime.settle(attempt, None)
    assert outcome is Outcome.COMPLETED and exhaustion is None
    runtime.end(attempt)
    assert attempt.phase is Phase.ENDED and attempt.result is Phase.COMPLETED
    assert attempt.completed
    assert runtime.keeper.active() == []


def test_a_failed_completing_transaction_returns_to_running() -> None:
    runtime = _runtime()
    runtime.store.add(2, '{"update_id": 2}', runtime.now_ms())
    attempt = runtime.claim(2)
    assert attempt is not None
    with pytest.raises(ZeroDivisionError):
        with attempt.transaction(complete=True):
            1 / 0
    assert attempt.phase is Phase.RUNNING and not attempt.completed


def test_settling_then_exhausted_by_the_policy() -> None:
    runtime = Runtime(
        MemoryUpdateStore(),
        RuntimeOptions(max_attempts=1),
        attempt_aware=True,
        handle_exhaustion=True,
    )
    runtime.store.add(3, '{"update_id": 3}', runtime.now_ms())
    attempt = runtime.claim(3, '{"update_id": 3}')
    assert attempt is not None
    attempt.begin_settling()
    assert attempt.phase is Phase.SETTLING and attempt.settling and not attempt.finished
    with pytest.raises(AttemptFinished):  # the handler returned
        attempt.exhaust("too late")
    outcome, exhaustion = runtime.settle_failed(attempt, RuntimeError("boom"))
    assert outcome is Outcome.EXHAUSTED
    assert attempt.phase is Phase.EXHAUSTED and attempt.exhausted
    assert exhaustion is not None and exhaustion.error == "RuntimeError: boom"
    assert exhaustion.body == '{"update_id": 3}'


def test_exhaust_from_the_handler() -> None:
    runtime = _runtime(durable=True)
    runtime.store.add(4, '{"update_id": 4}', runtime.now_ms())
    attempt = runtime.claim(4)
    assert attempt is not None
    attempt.exhaust("bad input")
    assert attempt.phase is Phase.EXHAUSTED and attempt.exhaustion_error == "bad input"
    assert attempt.exhausted_at is not None
    assert attempt.proven_until <= attempt.exhausted_at  # nothing left to renew
    with pytest.raises(AttemptFinished):
        attempt.exhaust("again")


def test_after_transactions_calls_back_once_the_open_transaction_ended() -> None:
    """What waits for an attempt's fenced transaction (a failure settle refused while it was
    open) is called once, on the thread that ends it, when ``completed`` is already final; with
    none open it is not called at all and the caller decides at once."""
    import threading

    runtime = _runtime()
    runtime.store.add(5, '{"update_id": 5}', runtime.now_ms())
    attempt = runtime.claim(5)
    assert attempt is not None
    assert attempt.after_transactions(lambda: None) is False  # none open: never called
    inside, release = threading.Event(), threading.Event()
    seen: List[object] = []

    def complete() -> None:
        with attempt.transaction(complete=True):
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=complete)
    worker.start()
    assert inside.wait(10)
    assert attempt.after_transactions(
        lambda: seen.append((attempt.completed, attempt.in_fenced_transaction,
                             threading.current_thread() is worker))
    )
    assert seen == []  # still open
    release.set()
    worker.join(10)
    assert seen == [(True, False, True)]
