"""The public conformance check for update stores.

:func:`check_update_store` runs the rules of the ``ptb_fence`` store contract against a store.
It returns what the store violates.
The three stores that ship with ``ptb_fence`` pass it.
Authors of a custom store run it in their own test suite.
``ptb-fence check --store URL`` runs it on a shipped store, on scratch files or tables.
The rules come in families, listed below with what each rule checks.
Each heading says the level a rule needs and the stores it runs for.
:data:`RULES` holds the rules in the order they run.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from ptb_fence.contract import BASE_METHODS, StoreCapabilities, UpdateStore, missing_methods
from ptb_fence.conformance import (
    _base,
    _batches,
    _bot,
    _broadcasts,
    _chat_order,
    _commit,
    _durable,
    _fence,
    _figures,
    _jobs,
    _outbox,
    _pacing,
    _races,
    _recovery,
    _renewal,
    _state,
    _steps,
)
from ptb_fence.conformance._probe import Abort, Probe, StoreRaised
from ptb_fence.conformance._rule import LEVELS, ConformanceRule, RuleCheck

__all__ = ["RULES", "ConformanceRule", "check_update_store"]

_CHECKS: Tuple[RuleCheck, ...] = (
    _base.rule_one_record,
    _base.rule_lease,
    _base.rule_ownership,
    _base.rule_retry_and_spend,
    _base.rule_due_listing,
    _base.rule_prune,
    _races.rule_concurrent_claim,
    _races.rule_concurrent_claim_owned,
    _renewal.rule_renewal,
    _renewal.rule_batch_renewal,
    _batches.rule_batch_add,
    _bot.rule_bind_bot,
    _batches.rule_batch_claim_at_ingest,
    _batches.rule_batch_claim,
    _batches.rule_batch_settle,
    _batches.rule_combined_write,
    _batches.rule_settle_and_claim,
    _commit.rule_features,
    _fence.rule_transaction,
    _fence.rule_connection_fence,
    _fence.rule_completing,
    _fence.rule_fence,
    _recovery.rule_release,
    _recovery.rule_liveness,
    _recovery.rule_isolation,
    _chat_order.rule_chat_order,
    _chat_order.rule_chat_keys,
    _figures.rule_figures,
    _outbox.rule_outbox_effects,
    _outbox.rule_outbox_claim,
    _outbox.rule_outbox_operators,
    _outbox.rule_outbox_concurrent_claim,
    _outbox.rule_outbox_claimed_inserts,
    _outbox.rule_outbox_concurrent_claimed_inserts,
    _outbox.rule_outbox_record_and_claim,
    _state.rule_state_versions,
    _state.rule_state_effects,
    _state.rule_state_concurrent,
    _steps.rule_steps,
    _durable.rule_durable_exhaustion,
    _commit.rule_batch_commit,
    _commit.rule_batch_commit_atomic,
    _jobs.rule_jobs,
    _jobs.rule_jobs_concurrent_fire,
    _jobs.rule_jobs_effects,
    _pacing.rule_pacing,
    _pacing.rule_pacing_concurrent,
    _broadcasts.rule_broadcasts,
    _broadcasts.rule_broadcasts_concurrent,
    _broadcasts.rule_broadcasts_effects,
)
"""The declared rules in the order they run.

The base rules come first, and the first of them detects the store's level.
The durable rules come last.
"""

RULES: Tuple[ConformanceRule, ...] = tuple(check.rule for check in _CHECKS)
"""Tuple[:class:`ConformanceRule`, ...]: The rules of :func:`check_update_store`, in the order
they run. Their names prefix the violations."""


def _rules_by_family(checks: Tuple[RuleCheck, ...]) -> str:
    """The rule list of this module's documentation.

    Each family comes with its rules.
    The family's title is the first line of its module's docstring.
    Families come in the order their first rule runs.
    """
    families: List[str] = []
    by_family: Dict[str, List[RuleCheck]] = {}
    for check in checks:
        family = check.run.__module__
        if family not in by_family:
            families.append(family)
            by_family[family] = []
        by_family[family].append(check)
    out: List[str] = []
    for family in families:
        title = (sys.modules[family].__doc__ or "").strip().split("\n\n", 1)[0]
        if title:
            out += ["", ".. rubric:: " + " ".join(title.split()).rstrip(".")]
        for check in by_family[family]:
            rule = check.rule
            out += ["", f"``{rule.name}`` ({rule.level}, {check.applies})"]
            out += ["    " + line if line else "" for line in check.details.splitlines()]
    return "\n".join(out) + "\n"


if __doc__ is not None:  # None under python -OO
    __doc__ += _rules_by_family(_CHECKS)


def _close(store: Any) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


def _raised(rule: str, error: BaseException, where: str) -> str:
    return f"{rule}: raised {type(error).__name__}: {error} ({where})"


def check_update_store(make: Callable[[], UpdateStore]) -> List[str]:
    """Check a store against the rules of the store contract.

    ``make`` must return a new, empty store on every call.
    Rows from an earlier rule would change what a later rule sees.
    The check does not clean up files or tables, so your fixture does that.
    Run the check in your test suite::

        from ptb_fence.conformance import check_update_store

        def test_my_store_conforms(tmp_path):
            counter = iter(range(1_000_000))

            def make():
                # A FRESH, EMPTY store on every call: one table/file/schema per call.
                return MyUpdateStore(f"{tmp_path}/store-{next(counter)}.db")

            assert check_update_store(make) == []

    The capability level comes from the first store, through :class:`ptb_fence.StoreCapabilities`.
    Fenced rules run only for a fenced store.
    Durable rules run only for a durable store.
    The batch rules run only for a batch store, one that declares ``features`` and has
    ``commit``.
    A store with part of a capability group gets one violation.
    It names the methods the store has and lacks, and nothing else is checked.

    Args:
        make (Callable[[], :class:`ptb_fence.UpdateStore`]): Returns a new, empty store on every
            call. It is called once per rule that runs. Each store is closed after its rule, when
            it has ``close()``.

    Returns:
        List[:obj:`str`]: The violations, each ``"<rule>: <what happened>"`` with a rule name from
        :data:`RULES`. An empty list means the store conforms. A rule that raises is reported as
        ``"<rule>: raised <ExcType>: <message> (from store.<method>)"``. The check then goes on
        with the next rule.
    """
    violations: List[str] = []
    level: Optional[int] = None
    for declared in _CHECKS:
        rule = declared.rule
        needed = LEVELS.index(rule.level)
        if level is not None and needed > level:
            continue
        try:
            store: Any = make()
        except Exception as exc:
            violations.append(_raised(rule.name, exc, "from make()"))
            continue
        try:
            if level is None:
                missing = missing_methods(store, BASE_METHODS)
                if missing:
                    violations.append(
                        f"{rule.name}: the store lacks the base method(s) {', '.join(missing)}; "
                        "it is not an UpdateStore (see ptb_fence.UpdateStore)"
                    )
                    return violations
                try:
                    capabilities = StoreCapabilities.of(store)
                except TypeError as exc:  # part of a capability group: the message names it
                    violations.append(f"{rule.name}: {exc}")
                    return violations
                level = 2 if "durable" in capabilities else 1 if "fenced" in capabilities else 0
                if needed > level:  # pragma: no cover - the first rule is a base rule
                    continue
            probe = Probe(store, rule.name, violations)
            try:
                declared.run(probe, level >= 1, level >= 2)
            except Abort:
                pass
            except StoreRaised as exc:
                violations.append(_raised(rule.name, exc.error, f"from store.{exc.method}"))
            except Exception as exc:
                violations.append(_raised(rule.name, exc, "in the check"))
        finally:
            try:
                _close(store)
            except Exception as exc:
                violations.append(_raised(rule.name, exc, "from store.close"))
    return violations
