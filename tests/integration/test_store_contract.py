"""The batch-first store contract: ClaimTerms in the claims of the three stores' ``commit``,
capability groups all or nothing (a partial group is refused with its names, by the runtime and
by the conformance check), the capabilities logged once at start, and a store with only the
batch forms of the earlier contract refused as not fenced."""

from __future__ import annotations

import inspect
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from ptb_fence import (
    Attempt,
    AttemptIdentity,
    Batch,
    ClaimTerms,
    Completed,
    Exhaustion,
    MemoryUpdateStore,
    Settlement,
    SQLiteUpdateStore,
    StoreCapabilities,
    UpdateIntake,
)
from ptb_fence.conformance import check_update_store
from ptb_fence.contract import BASE_METHODS, CAPABILITY_GROUPS, DURABLE_METHODS, FENCED_METHODS
from ptb_fence.runtime._port import StorePort

from runtime_support import StoreWrapper, body, wait_until

T = 1_700_000_000_000
L = 60_000


# -- stores ------------------------------------------------------------------------------------
class BatchOnlyStore:
    """A durable store written batch-first: the base six, ``owns``, the durable three and the
    batch forms of the fenced claim, renewal and settlement, but no ``claim_owned``,
    ``renew_owned`` or ``settle_owned``. Each call is delegated to a memory store and counted."""

    def __init__(self) -> None:
        self.inner = MemoryUpdateStore()
        self.calls: Dict[str, int] = {}
        self._lock = threading.Lock()

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    def add(self, update_id: int, body: str, received_at: int) -> bool:
        self._count("add")
        return self.inner.add(update_id, body, received_at)

    def claim(self, update_id: int, **terms: Any) -> Optional[int]:
        self._count("claim")
        return self.inner.claim(update_id, **terms)

    def renew(self, update_id: int, attempt: int, lease_until: int, now: Any = None) -> bool:
        self._count("renew")
        return self.inner.renew(update_id, attempt, lease_until, now)

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        self._count("settle")
        self.inner.settle(update_id, attempt, settlement)

    def due(self, *, now: int, pending_before: int, limit: int) -> Any:
        return self.inner.due(now=now, pending_before=pending_before, limit=limit)

    def prune(self, before: int) -> int:
        return self.inner.prune(before)

    def owns(self, identity: AttemptIdentity, at: int) -> bool:
        self._count("owns")
        return self.inner.owns(identity, at)

    def claim_owned_many(
        self, update_ids: Sequence[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        self._count("claim_owned_many")
        assert isinstance(terms, ClaimTerms)
        return list(self.inner.commit(Batch(terms, claims=tuple(update_ids))).claims)

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[bool]:
        self._count("renew_owned_many")
        return self.inner.renew_owned_many(identities, lease_until, now)

    def settle_owned_many(
        self, items: Sequence[Tuple[AttemptIdentity, Settlement]]
    ) -> List[bool]:
        self._count("settle_owned_many")
        return [bool(x) for x in self.inner.commit(Batch(settlements=tuple(items))).landed]

    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        return self.inner.exhaust(identity, at=at, error=error)

    def due_exhaustions(self, *, limit: int, after_update_id: Optional[int] = None) -> Any:
        return self.inner.due_exhaustions(limit=limit, after_update_id=after_update_id)

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        return self.inner.acknowledge_exhaustion(identity, at)


class PartialLivenessStore(MemoryUpdateStore):
    """Two of the three liveness methods: ``take_over_dead`` is hidden."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if name == "take_over_dead":
            raise AttributeError(name)
        return super().__getattribute__(name)


class EarlierPartialLivenessStore(PartialLivenessStore):
    """The same, as a store of the earlier contract: no declared features, no commit."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if name in ("commit", "features"):
            raise AttributeError(name)
        return super().__getattribute__(name)


# -- partial groups are refused ------------------------------------------------------------------
def test_a_partial_liveness_group_is_refused_by_the_runtime_naming_the_methods() -> None:
    with pytest.raises(TypeError) as caught:
        UpdateIntake(EarlierPartialLivenessStore(), handle=lambda update: None)
    message = str(caught.value)
    assert "has hold_liveness, release_liveness but not take_over_dead" in message
    assert "liveness capability" in message and message.startswith("UpdateIntake: ")


def test_a_declared_part_without_its_methods_is_refused_naming_them() -> None:
    with pytest.raises(TypeError) as caught:
        UpdateIntake(PartialLivenessStore(), handle=lambda update: None)
    message = str(caught.value)
    assert message.startswith("UpdateIntake: PartialLivenessStore declares StoreFeatures(")
    assert "liveness=True" in message and "but lacks take_over_dead:" in message


def test_a_partial_fenced_group_names_the_missing_operation_with_its_batch_form() -> None:
    store = StoreWrapper(methods=BASE_METHODS + ("claim_owned", "owns", "settle_owned"))
    with pytest.raises(TypeError) as caught:
        StorePort(store, component="t")
    message = str(caught.value)
    assert "has claim_owned, owns, settle_owned but not renew_owned" in message
    assert "fenced capability" in message


def test_a_group_without_the_group_it_needs_is_refused() -> None:
    store = StoreWrapper(methods=BASE_METHODS + ("release_many",))
    with pytest.raises(TypeError, match="has the release capability .*without fenced"):
        StorePort(store, component="t")


def test_whole_groups_and_absent_groups_are_accepted() -> None:
    assert "liveness" in StorePort(MemoryUpdateStore(), component="t").capabilities
    base_only = StorePort(StoreWrapper(methods=BASE_METHODS), component="t").capabilities
    assert base_only.groups == frozenset({"base"})
    fenced = StorePort(StoreWrapper(methods=FENCED_METHODS), component="t").capabilities
    assert fenced.groups == frozenset({"base", "fenced"})


def test_the_conformance_check_reports_a_partial_group_and_stops() -> None:
    violations = check_update_store(PartialLivenessStore)
    assert len(violations) == 1, violations
    assert "has hold_liveness, release_liveness but not take_over_dead" in violations[0]


# -- capabilities are logged once at start ---------------------------------------------------------
def test_the_capabilities_are_logged_once_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ptb_fence.runtime"):
        intake = UpdateIntake(
            MemoryUpdateStore(), handle_attempt=lambda update, attempt: None,
            handle_exhaustion=lambda exhaustion: None,
        )
        intake.close()
        UpdateIntake(StoreWrapper(methods=BASE_METHODS), handle=lambda update: None).close()
    lines = [r for r in caplog.records if "store capabilities" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO, logging.INFO]
    memory, wrapped = (r.getMessage() for r in lines)
    assert memory.startswith("UpdateIntake: store capabilities: MemoryUpdateStore: base, fenced, ")
    assert "durable" in memory and "liveness" in memory and "connection=" in memory
    assert "isolation" not in memory  # the memory store does not isolate
    assert wrapped == "UpdateIntake: store capabilities: StoreWrapper: base"


def test_store_capabilities_is_a_frozen_value() -> None:
    capabilities = StoreCapabilities.of(MemoryUpdateStore())
    assert capabilities == StoreCapabilities.of(MemoryUpdateStore())
    with pytest.raises(AttributeError):
        capabilities.groups = frozenset()  # type: ignore[misc]
    assert not hasattr(capabilities, "__dict__")  # slots


# -- ClaimTerms in the three stores --------------------------------------------------------------
@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], Any]]:
    opened: List[Any] = []

    def make() -> Any:
        if request.param == "memory":
            store: Any = MemoryUpdateStore()
        elif request.param == "sqlite":
            store = SQLiteUpdateStore(str(tmp_path / f"u{len(opened)}.db"))
        else:
            from ptb_fence import PostgresUpdateStore

            dsn = request.getfixturevalue("pg_dsn")
            tables = request.getfixturevalue("pg_tables")
            from store_support import fresh_table_name

            table = fresh_table_name()
            tables.append(table)
            store = PostgresUpdateStore(dsn, table=table)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def test_the_three_stores_claim_on_claim_terms(make_store: Callable[[], Any]) -> None:
    store = make_store()
    parameters = inspect.signature(store.commit).parameters
    assert list(parameters) == ["batch"]
    for update_id in (1, 2):
        assert store.add(update_id, f"b{update_id}", T)
    terms = ClaimTerms(now=T, lease_until=T + L, max_attempts=1)
    first = store.commit(Batch(terms, claims=(1, 2, 1))).claims
    assert [(i.update_id, i.attempt) if i else None for i in first] == [(1, 1), (2, 1), None]
    assert first[0] is not None and store.owns(first[0], T + L) and not store.owns(first[0], T + L + 1)
    # both leases lapse: spent (max_attempts=1), durable: they become exhaustions
    spent = store.commit(Batch(
        ClaimTerms(now=T + L + 1, lease_until=T + 2 * L, max_attempts=1,
                   durable_exhaustion=True),
        claims=(1, 2),
    )).claims
    assert spent == (None, None)
    assert sorted(e.update_id for e in store.due_exhaustions(limit=10)) == [1, 2]


def test_claim_terms_is_frozen_with_slots() -> None:
    terms = ClaimTerms(1, 2, 3)
    assert terms.durable_exhaustion is False
    with pytest.raises(AttributeError):
        terms.now = 5  # type: ignore[misc]
    assert not hasattr(terms, "__dict__")


def test_a_store_with_only_batch_forms_is_not_fenced() -> None:
    """The seed's fenced level is the single-row methods. Batches go through ``commit``."""
    wanted = "has owns but not claim_owned, renew_owned, settle_owned: the fenced capability"
    with pytest.raises(TypeError, match=wanted):
        StoreCapabilities.of(BatchOnlyStore())
    with pytest.raises(TypeError, match="UpdateIntake: BatchOnlyStore " + wanted):
        UpdateIntake(BatchOnlyStore(), handle_attempt=lambda update, attempt: None)


# -- the capability groups hold the durable contract ------------------------------------------
# (docs/reference/store-contract.rst renders them as the capability table: tests/processes/test_docs.py)
def test_the_capability_groups_hold_every_method_of_the_durable_contract() -> None:
    assert set(DURABLE_METHODS) <= {m for g in CAPABILITY_GROUPS for m in g.methods}
