"""Typed user code, checked by ``mypy --strict`` in tests/processes/test_typing.py (never imported
or run).

It states what the public API promises to a type checker: the three stores satisfy the
``DurableUpdateStore`` Protocol structurally, the value types are keyword-constructible, and the
documented entry points accept the documented callables.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from telegram import Update
from telegram.ext import Application, ContextTypes

from ptb_fence import (
    Abandoned,
    Attempt,
    AttemptIdentity,
    Completed,
    DurableUpdateStore,
    Exhaustion,
    Failed,
    FencedUpdateStore,
    MemoryUpdateStore,
    OwnershipLost,
    PostgresUpdateStore,
    Settlement,
    SQLiteUpdateStore,
    StoredUpdate,
    UpdateIntake,
    UpdateStore,
    current_attempt,
    is_durable,
    is_fenced,
    postgres_update_store_schema,
    webhook_app,
)
from ptb_fence.conformance import check_update_store
from ptb_fence.ptb import DurableUpdateProcessor, FencedCallbackContext, FencedUpdateProcessor


def stores_satisfy_the_protocols(path: str, dsn: str) -> List[UpdateStore]:
    memory: DurableUpdateStore = MemoryUpdateStore()
    sqlite: DurableUpdateStore = SQLiteUpdateStore(path, table="telegram_updates")
    postgres: DurableUpdateStore = PostgresUpdateStore(dsn, "telegram_updates", create_table=True)
    fenced: FencedUpdateStore = sqlite
    schema: str = postgres_update_store_schema("telegram_updates")
    assert schema and is_fenced(fenced) and is_durable(memory)
    return [memory, sqlite, postgres]


def store_calls(store: DurableUpdateStore) -> None:
    added: bool = store.add(1, '{"update_id": 1}', 0)
    attempt: Optional[int] = store.claim(1, now=0, lease_until=10, max_attempts=5)
    identity: Optional[AttemptIdentity] = store.claim_owned(
        1, now=0, lease_until=10, max_attempts=5, durable_exhaustion=True
    )
    assert added and attempt is None and identity is not None
    settlements: List[Settlement] = [
        Completed(at=1),
        Failed(at=1, retry_at=2, error="boom"),
        Abandoned(at=1, error="gave up"),
    ]
    landed: bool = store.settle_owned(identity, settlements[0])
    owns: bool = store.owns(identity, 5, connection=None)
    due: List[StoredUpdate] = store.due(now=0, pending_before=0, limit=10)
    exhaustions: List[Exhaustion] = store.due_exhaustions(limit=100, after_update_id=None)
    for exhaustion in exhaustions:
        acked: bool = store.acknowledge_exhaustion(exhaustion.identity, 7)
        assert acked
    assert landed or owns or due
    pruned: int = store.prune(0)
    assert pruned >= 0


def conformance() -> List[str]:
    return check_update_store(MemoryUpdateStore)


def blocking_intake(store: DurableUpdateStore) -> Any:
    def handle_attempt(update: Dict[str, Any], attempt: Attempt) -> None:
        with attempt.transaction(complete=True) as connection:
            assert connection is None or connection
        if attempt.owner_lost.is_set():
            raise OwnershipLost(attempt.identity)

    def handle_exhaustion(exhaustion: Exhaustion) -> None:
        print(exhaustion.update_id, exhaustion.error)

    intake = UpdateIntake(
        store,
        handle_attempt=handle_attempt,
        handle_exhaustion=handle_exhaustion,
        max_attempts=3,
        lease_seconds=30.0,
    )
    result: str = intake.accept(b'{"update_id": 5}')
    assert result in ("accepted", "duplicate", "invalid")
    intake.start()
    assert intake.idle(timeout=1.0) in (True, False)
    return webhook_app(intake, secret_token="secret")


def unary_intake(store: UpdateStore) -> UpdateIntake:
    def handle(update: Dict[str, Any]) -> None:
        print(update["update_id"])

    return UpdateIntake(store, handle=handle)


async def ptb_handler(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    attempt = current_attempt()
    if attempt is None:
        return
    attempt.raise_if_lost()

    def write(connection: Any) -> int:
        return 1

    rows: int = await attempt.run_in_transaction(write, complete=True)
    assert rows == 1


def ptb_wiring(store: DurableUpdateStore, token: str) -> None:
    async def on_exhaustion(exhaustion: Exhaustion) -> None:
        print(exhaustion.identity)

    fenced = FencedUpdateProcessor(store, handle_exhaustion=on_exhaustion, max_concurrent=8)
    application = fenced.install(Application.builder().token(token)).build()
    assert application.update_processor is fenced

    durable = DurableUpdateProcessor(store, lease_seconds=60.0)
    durable.install(Application.builder().token(token)).build()


def custom_context(context: FencedCallbackContext) -> Optional[Attempt]:
    return context.attempt


async def required_attempt(context: FencedCallbackContext) -> int:
    attempt: Attempt = context.require_attempt()  # never None under mypy --strict
    return attempt.attempt


class ReminderContext(FencedCallbackContext):
    """A user's own context class, derived as the README says."""


async def remind(context: FencedCallbackContext) -> None:
    assert context.job is not None and context.attempt is None


async def remind_default(context: ContextTypes.DEFAULT_TYPE) -> None:
    assert context.job is not None


async def remind_mine(context: ReminderContext) -> None:
    assert context.job is not None


async def on_text(update: Update, context: FencedCallbackContext) -> None:
    assert context.job_queue is not None
    context.job_queue.run_once(remind, 60, chat_id=update.effective_chat.id if update.effective_chat else None)


async def on_text_mine(update: Update, context: ReminderContext) -> None:
    assert context.job_queue is not None
    context.job_queue.run_once(remind_mine, 60)
    context.job_queue.run_repeating(remind, interval=60)


def jobs_take_the_fenced_context(store: DurableUpdateStore, token: str) -> None:
    """Job callbacks annotated with FencedCallbackContext (or the default context type) are
    accepted by ``context.job_queue`` in a handler, and by the Application's ``job_queue`` once
    the builder's context type is FencedCallbackContext (as the README says); a subclass of it
    once it is the builder's context type."""
    from telegram.ext import MessageHandler, filters

    processor = FencedUpdateProcessor(store)
    application = processor.install(
        Application.builder().token(token).context_types(ContextTypes(context=FencedCallbackContext))
    ).build()
    queue = application.job_queue
    assert queue is not None
    queue.run_once(remind, 60)
    queue.run_repeating(remind, interval=60)
    queue.run_once(remind_default, 60)
    application.add_handler(MessageHandler(filters.TEXT, on_text))
    application.add_handler(MessageHandler(filters.TEXT, ptb_handler))
    mine = processor.install(
        Application.builder().token(token).context_types(ContextTypes(context=ReminderContext))
    ).build()
    assert mine.job_queue is not None
    mine.job_queue.run_once(remind_mine, 60)
    mine.job_queue.run_once(remind, 60)
