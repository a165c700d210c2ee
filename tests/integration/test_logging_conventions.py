"""Logging conventions: every logger of the package is named in the *Logs* section of
docs/howto/monitoring.rst, and the lines an operator matches carry a stable
``ptb_fence_event`` in their ``extra`` (that page's table of events is
``ptb_fence._events.EVENTS``), checked on the records a real
``UpdateIntake`` logs through a failing handler, a store outage and an alarm.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import List, Set

import pytest

from ptb_fence import AlarmThresholds, UpdateIntake
from ptb_fence._events import EVENT_KEY, EVENTS
from ptb_fence.contract import DURABLE_METHODS, FIGURES_METHODS
from runtime_support import FakeClock, StoreDown, StoreWrapper, body

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ptb_fence"


def logging_section() -> str:
    page = (ROOT / "docs" / "howto" / "monitoring.rst").read_text(encoding="utf-8")
    return page[page.index("\nLogs\n----\n"):]


def package_loggers() -> Set[str]:
    """The name of every logger the package asks for: ``getLogger("...")`` literals, names
    bound to module constants first (``getLogger(SCHEDULER_LOGGER)``), ``getLogger(__name__)``
    as the module's name (the CLI's ``getLogger("ptb_fence")`` is the root of them all)."""
    names: Set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {
            target.id: node.value.value
            for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)
        }
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "getLogger"
                    and node.args):
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.add(arg.value)
            elif isinstance(arg, ast.Name) and arg.id == "__name__":
                names.add(module)
            elif isinstance(arg, ast.Name) and arg.id in constants:
                names.add(constants[arg.id])
    names.discard("ptb_fence")
    return names


def test_every_logger_of_the_package_is_in_the_monitoring_page() -> None:
    loggers = package_loggers()
    assert {"ptb_fence.store", "ptb_fence.outbox", "ptb_fence.probes",
            "ptb_fence.scheduler"} <= loggers
    table = set(re.findall(r"^``(ptb_fence\.[a-z_.]+)``", logging_section(), re.M))
    assert loggers == table, (sorted(loggers - table), sorted(table - loggers))


def test_the_monitoring_page_lists_every_event() -> None:
    table = set(re.findall(r"^``([a-z_]+)``\s{2,}", logging_section(), re.M)) - {EVENT_KEY}
    assert table == set(EVENTS), table ^ set(EVENTS)


def events(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [getattr(r, EVENT_KEY) for r in caplog.records if hasattr(r, EVENT_KEY)]


def test_the_lines_an_operator_matches_carry_their_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ptb_fence")
    clock = FakeClock()
    store = StoreWrapper(methods=DURABLE_METHODS + FIGURES_METHODS)
    runs: List[int] = []

    def handle(update: object) -> None:
        runs.append(1)
        if len(runs) == 1:
            raise ConnectionError("the first attempt fails")

    intake = UpdateIntake(store, handle=handle, clock=clock, sweep_every_seconds=60,
                          alarms=AlarmThresholds(ingest_failing_seconds=0.0))
    intake.start()
    try:
        assert intake.accept(body(1)) == "accepted"
        assert intake.idle(5)
        (failed,) = [r for r in caplog.records if getattr(r, EVENT_KEY, None) == "attempt_failed"]
        assert (failed.update_id, failed.outcome, failed.levelno) == (1, "retrying", logging.WARNING)
        for name in DURABLE_METHODS + FIGURES_METHODS:  # the database is down
            store.fail[name] = StoreDown("connection refused")
        intake.sweep()
        errors = [r for r in caplog.records if getattr(r, EVENT_KEY, None) == "store_error"]
        assert errors and errors[0].step == "sweep" and errors[0].levelno == logging.ERROR
        with pytest.raises(StoreDown):  # recording fails: the ingest_failing alarm
            intake.accept(body(2))
        store.fail.clear()
        clock.advance(10)  # the retry is due
        intake.sweep()
        assert intake.idle(5)
        (back,) = [r for r in caplog.records
                   if getattr(r, EVENT_KEY, None) == "store_answers_again"]
        assert back.name == "ptb_fence.store" and back.store_errors
    finally:
        intake.close()
    said = events(caplog)
    assert {"attempt_failed", "store_error", "store_answers_again", "alarm"} <= set(said), said
    assert set(said) <= set(EVENTS)
    alarm = next(r for r in caplog.records if getattr(r, EVENT_KEY, None) == "alarm")
    assert alarm.name == "ptb_fence.alarms" and alarm.alarm == "ingest_failing"
