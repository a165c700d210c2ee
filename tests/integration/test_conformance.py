"""The public conformance check: the shipped stores pass it, and it bites on broken stores."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Sequence, Type

import pytest

import ptb_fence.conformance as conformance
from broken_stores import (
    BROKEN,
    BaseOnlyStore,
    BaseOnlyTakeoverAtDueAtStore,
    CloseRaisesStore,
    DueRaisesAndReadThenWriteClaimStore,
    DueRaisesStore,
    EmptyClaimIdStore,
    FencedOnlySettleOwnedIgnoresClaimIdStore,
    FencedOnlyStore,
    IntBooleansStore,
    ReadThenWriteClaimStore,
)
from ptb_fence import MemoryUpdateStore
from ptb_fence.conformance import RULES, check_update_store

RULE_NAMES = [rule.name for rule in RULES]
BASE_RULES = [rule.name for rule in RULES if rule.level == "base"]
FENCED_RULES = [rule.name for rule in RULES if rule.level in ("base", "fenced")]
VIOLATION = re.compile(
    r"^(" + "|".join(re.escape(name) for name in RULE_NAMES) + r"): \S.*$", re.DOTALL
)


class Counting:
    """A ``make`` that counts the stores it builds and the ``close()`` calls they get."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self.stores: List[Any] = []
        self.closed: List[int] = []

    def __call__(self) -> Any:
        store = self.factory()
        index = len(self.stores)
        self.stores.append(store)
        close = getattr(store, "close", None)
        if callable(close):

            def counted_close() -> None:
                self.closed.append(index)
                close()

            try:
                store.close = counted_close
            except AttributeError:  # __slots__ without __dict__
                pass
        return store


def rules_reported(violations: Sequence[str]) -> "set[str]":
    return {v.split(":", 1)[0] for v in violations}


def assert_well_formed(violations: Sequence[str]) -> None:
    for violation in violations:
        assert VIOLATION.match(violation), violation


# -- the shipped stores pass ----------------------------------------------------------------------
class CountingMemoryStore(MemoryUpdateStore):
    """A memory store whose ``close`` can be counted (it has a ``__dict__``)."""


def test_memory_store_conforms_quickly() -> None:
    make = Counting(CountingMemoryStore)
    started = time.perf_counter()
    violations = check_update_store(make)
    elapsed = time.perf_counter() - started
    assert violations == []
    assert len(make.stores) == len(RULES)
    assert len({id(store) for store in make.stores}) == len(RULES), "a store was reused"
    assert sorted(make.closed) == list(range(len(RULES))), "every store is closed after its rule"
    assert elapsed < 2.0, f"the check took {elapsed:.2f} s for the memory store"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_real_store_conforms(fresh_stores: Callable[[], Any]) -> None:
    make = Counting(fresh_stores)
    violations = check_update_store(make)
    assert violations == [], "\n".join(violations)
    assert len(make.stores) == len(RULES)


def test_the_shipped_stores_are_durable() -> None:
    """All three stores implement the durable level, so every rule runs for them."""
    from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore, is_durable

    for cls in (MemoryUpdateStore, SQLiteUpdateStore, PostgresUpdateStore):
        assert is_durable(cls), cls


# -- it bites -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("broken", "expected_rules"),
    list(BROKEN.items()),
    ids=[cls.__name__ for cls in BROKEN],
)
def test_broken_store_is_reported_by_the_named_rule(
    broken: Type[Any], expected_rules: Sequence[str]
) -> None:
    violations = check_update_store(broken)
    assert_well_formed(violations)
    reported = rules_reported(violations)
    for rule in expected_rules:
        assert rule in reported, f"{broken.__name__}: {rule} missing in {violations}"


def test_a_correct_isolating_store_conforms() -> None:
    from broken_stores import IsolatingMemoryStore

    assert check_update_store(IsolatingMemoryStore) == []


def test_read_then_write_claim_has_several_winners() -> None:
    violations = check_update_store(ReadThenWriteClaimStore)
    concurrent = [v for v in violations if v.startswith("concurrent-claim: ")]
    assert concurrent, violations
    assert "expected exactly one winner with attempt 1" in concurrent[0]
    owned = [v for v in violations if v.startswith("concurrent-claim-owned: ")]
    assert owned and "winner(s)" in owned[0], violations


def test_claim_id_breakers_name_the_exact_call() -> None:
    from broken_stores import (
        AcknowledgeIgnoresClaimIdStore,
        ExhaustIgnoresClaimIdStore,
        RenewOwnedIgnoresClaimIdStore,
        SettleOwnedAlwaysTrueStore,
        SettleOwnedIgnoresClaimIdStore,
    )

    cases = {
        RenewOwnedIgnoresClaimIdStore: "fence: renew_owned with a wrong claim id returned True",
        SettleOwnedIgnoresClaimIdStore: "fence: settle_owned with a wrong claim id returned True",
        ExhaustIgnoresClaimIdStore: "durable-exhaustion: exhaust with a wrong claim id returned "
        "True",
        AcknowledgeIgnoresClaimIdStore: "durable-exhaustion: acknowledge_exhaustion with a wrong "
        "claim id returned True",
        SettleOwnedAlwaysTrueStore: "attempt-ownership: settle_owned with a wrong attempt "
        "returned True",
    }
    for cls, expected in cases.items():
        violations = check_update_store(cls)
        assert expected in violations, f"{cls.__name__}: {violations}"


def test_a_raising_method_is_reported_and_the_other_rules_still_run() -> None:
    make = Counting(DueRaisesAndReadThenWriteClaimStore)
    violations = check_update_store(make)
    assert_well_formed(violations)
    assert "lease: raised RuntimeError: due is broken (from store.due)" in violations
    assert any(v.startswith("concurrent-claim: ") for v in violations), violations
    assert len(make.stores) == len(RULES)


def test_a_raising_method_stops_only_its_rule() -> None:
    violations = check_update_store(DueRaisesStore)
    assert violations, "a store whose due raises must not conform"
    for violation in violations:
        assert violation.endswith(": raised RuntimeError: due is broken (from store.due)")
    reported = rules_reported(violations)
    # rules that never call due report nothing: the check went on with them
    assert {"attempt-ownership", "concurrent-claim", "fence"}.isdisjoint(reported)
    assert {"lease", "due-listing"} <= reported


def test_non_bool_results_are_reported() -> None:
    violations = check_update_store(IntBooleansStore)
    assert (
        "one-record-per-update: add returned int 1; it must return a real bool (True or False)"
        in violations
    )
    # reported once per rule, not once per call
    assert len([v for v in violations if v.startswith("one-record-per-update: ")]) == 1


def test_empty_claim_id_is_reported() -> None:
    violations = check_update_store(EmptyClaimIdStore)
    assert any(
        v.startswith("fence: claim_owned returned AttemptIdentity") and "non-empty str" in v
        for v in violations
    ), violations


def test_close_that_raises_is_reported() -> None:
    violations = check_update_store(CloseRaisesStore)
    assert violations == [
        f"{name}: raised OSError: close is broken (from store.close)" for name in RULE_NAMES
    ]


# -- capability levels ----------------------------------------------------------------------------
def test_base_only_store_runs_only_base_rules() -> None:
    make = Counting(BaseOnlyStore)
    assert check_update_store(make) == []
    assert len(make.stores) == len(BASE_RULES)


def test_broken_base_only_store_is_blamed_by_base_rules_only() -> None:
    violations = check_update_store(BaseOnlyTakeoverAtDueAtStore)
    reported = rules_reported(violations)
    assert "lease" in reported
    assert reported <= set(BASE_RULES), violations


def test_fenced_store_without_durable_methods_runs_fenced_rules() -> None:
    make = Counting(FencedOnlyStore)
    assert check_update_store(make) == []
    assert len(make.stores) == len(FENCED_RULES)


def test_broken_fenced_store_is_not_blamed_by_durable_rules() -> None:
    violations = check_update_store(FencedOnlySettleOwnedIgnoresClaimIdStore)
    reported = rules_reported(violations)
    assert "fence" in reported
    assert "durable-exhaustion" not in reported
    assert "fence: settle_owned with a wrong claim id returned True" in violations


# -- how the check uses make() --------------------------------------------------------------------
def test_a_fresh_store_for_every_rule() -> None:
    make = Counting(CountingMemoryStore)
    check_update_store(make)
    assert len(make.stores) >= len(RULES)
    assert len({id(store) for store in make.stores}) == len(make.stores)


def test_a_shared_store_does_not_pass() -> None:
    """Rows from one rule would leak into the next: make() must build an empty store."""
    shared = MemoryUpdateStore()
    assert check_update_store(lambda: shared) != []


def test_make_that_raises_is_reported_for_every_rule() -> None:
    def make() -> Any:
        raise ValueError("no database")

    violations = check_update_store(make)
    assert violations == [
        f"{name}: raised ValueError: no database (from make())" for name in RULE_NAMES
    ]


def test_not_a_store_is_one_clear_violation() -> None:
    violations = check_update_store(lambda: object())  # type: ignore[arg-type,return-value]
    assert len(violations) == 1
    assert violations[0].startswith("one-record-per-update: the store lacks the base method(s) ")
    assert "add, claim, renew, settle, due, prune" in violations[0]


# -- the module itself ----------------------------------------------------------------------------
def test_rules_are_named_and_documented() -> None:
    assert len(set(RULE_NAMES)) == len(RULE_NAMES)
    doc = inspect.getdoc(conformance) or ""
    for rule in RULES:
        assert rule.level in ("base", "fenced", "durable")
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", rule.name)
        assert f"``{rule.name}`` ({rule.level}," in doc, rule.name
        assert rule.description
    assert RULE_NAMES[0] == "one-record-per-update"
    levels = [r.level for r in RULES]
    assert set(levels[levels.index("durable"):]) == {"durable"}  # the durable rules run last


def test_every_declared_rule_runs_once() -> None:
    """A rule declared in a family module but missing from the run order would never run."""
    import importlib
    import pkgutil

    from ptb_fence.conformance._rule import RuleCheck

    declared = []
    for info in pkgutil.iter_modules(conformance.__path__):
        if info.name.startswith("_") and info.name != "__main__":
            module = importlib.import_module(f"ptb_fence.conformance.{info.name}")
            declared += [v.rule for v in vars(module).values() if isinstance(v, RuleCheck)]
    assert sorted(declared, key=lambda r: r.name) == sorted(RULES, key=lambda r: r.name)


def test_the_check_is_framework_free() -> None:
    code = (
        "import sys\n"
        "import ptb_fence.conformance\n"
        "bad = sorted(m for m in sys.modules if m == 'telegram' or m.startswith('telegram.'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    for path in Path(conformance.__file__).parent.glob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "telegram" not in re.sub(r'"""[\s\S]*?"""', "", source), path


# -- optional capabilities: rules for the methods a store may lack --------------------------------
def test_a_transactional_memory_double_conforms_to_the_capability_rules() -> None:
    """The correct double behind SettleOwnedCommitsOnItsOwnStore: its transaction() yields a
    connection and really rolls back, so every connection-fence check runs on it."""
    from broken_stores import TransactionalMemoryStore

    assert check_update_store(TransactionalMemoryStore) == []


def test_a_completing_memory_double_conforms_to_the_capability_rules() -> None:
    """The correct double behind the complete_owned breakers: every completing check runs."""
    from broken_stores import CompletingMemoryStore

    assert check_update_store(CompletingMemoryStore) == []


def test_capability_rules_are_named() -> None:
    for name in (
        "batch-add",
        "batch-claim-at-ingest",
        "batch-settle",
        "combined-write",
        "settle-and-claim",
        "transaction",
        "connection-fence",
        "completing",
        "bind-bot",
        "batch-renewal",
    ):
        assert name in RULE_NAMES, name


def test_capability_rules_do_not_blame_a_store_without_the_capabilities() -> None:
    """A store with only the declared base/fenced methods is never blamed for lacking the
    optional ones (the capability rules are skipped)."""
    assert check_update_store(FencedOnlyStore) == []
    assert check_update_store(BaseOnlyStore) == []


# -- durable jobs ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("feature", "breaker"), [("jobs", "FireIgnoresStateStore"), ("pacing", "HoldIgnoredStore"),
                             ("broadcasts", "RecipientRacesStore")]
)
def test_a_features_rules_run_only_for_a_store_that_declares_it(
    feature: str, breaker: str
) -> None:
    """A store that does not declare ``feature`` is never blamed by its rules, however broken
    its methods of that feature are."""
    import dataclasses

    import broken_stores

    class Undeclared(getattr(broken_stores, breaker)):  # type: ignore[misc]
        __slots__ = ()

        def __init__(self) -> None:
            super().__init__()
            self.features = dataclasses.replace(self.features, **{feature: False})

    assert check_update_store(Undeclared) == []


def test_jobs_breakers_name_the_exact_check() -> None:
    from broken_stores import (
        DueJobsStrictStore,
        FireIgnoresStateStore,
        KeyedDeclarationAddsStore,
        RefusedCompletionWritesJobsStore,
    )

    cases = {
        FireIgnoresStateStore: "jobs-concurrent-fire: 8 concurrent fire_jobs of run 1 of job 1",
        KeyedDeclarationAddsStore: "jobs: after declaring the keyed job 'digest' twice",
        DueJobsStrictStore: "jobs: due_jobs(T+50) returned []",
        RefusedCompletionWritesJobsStore: "jobs-effects: after the commit the jobs written by "
        "completions are",
    }
    for cls, expected in cases.items():
        violations = check_update_store(cls)
        assert any(v.startswith(expected) for v in violations), f"{cls.__name__}: {violations}"


def test_pacing_breakers_name_the_exact_check() -> None:
    from broken_stores import (
        HoldIgnoredStore,
        HoldShortenedStore,
        PaceRacesStore,
        SlotBeyondHorizonStore,
    )

    cases = {
        HoldIgnoredStore: "pacing: the bot held until",
        HoldShortenedStore: "pacing: a shorter hold shortened the first",
        SlotBeyondHorizonStore: "pacing: a read (negative horizon) of the bot",
        PaceRacesStore: "pacing-concurrent: 8 threads taking 5 slots each",
    }
    for cls, expected in cases.items():
        violations = check_update_store(cls)
        assert any(v.startswith(expected) for v in violations), f"{cls.__name__}: {violations}"


def test_broadcasts_breakers_name_the_exact_check() -> None:
    from broken_stores import (
        AnySenderSettlesStore,
        BroadcastEffectJoinsAnyCallStore,
        PausedClaimedStore,
        RecipientRacesStore,
        RefusedCompletionStartsBroadcastStore,
    )

    cases = {
        PausedClaimedStore: "broadcasts: a paused broadcast's recipient was claimed",
        AnySenderSettlesStore: "broadcasts: another sender's outcome for chat 10 returned",
        RecipientRacesStore: "broadcasts-concurrent: 8 concurrent claims of 20 got",
        RefusedCompletionStartsBroadcastStore: "broadcasts-effects: after the commit the "
        "broadcasts started by completions are ['from-1', 'from-2', 'from-3']",
        BroadcastEffectJoinsAnyCallStore: "broadcasts-effects: a completion's broadcast named "
        "like one with another call added 2 recipient(s)",
    }
    for cls, expected in cases.items():
        violations = check_update_store(cls)
        assert any(v.startswith(expected) for v in violations), f"{cls.__name__}: {violations}"
