"""ptb_fence: durable, fenced update handling for python-telegram-bot.

Every update is recorded before Telegram is told it was received, claimed under a lease with a
persisted, globally unique claim id, handled, and settled. Handlers check inside their own
database transaction that their attempt still owns the update before they write.
"""

from ptb_fence._errors import (
    AttemptFinished,
    OwnershipLost,
    RowLocked,
    SchemaError,
    StateConflictError,
    StoreBusy,
    TableBotMismatch,
    TransactionEnded,
)
from ptb_fence.contract import (
    BatchUpdateStore,
    BotBoundStore,
    ClaimTerms,
    ClaimingUpdateStore,
    ChatOrderedUpdateStore,
    CompletingUpdateStore,
    FiguresStore,
    IsolatingUpdateStore,
    LivenessStore,
    ClaimedInsertOutboxStore,
    OutboxStore,
    ReleasingUpdateStore,
    StateStore,
    StoreCapabilities,
    DurableUpdateStore,
    FencedUpdateStore,
    TransactionalUpdateStore,
    UpdateStore,
    is_durable,
    is_fenced,
)
from ptb_fence._values import (
    Abandoned,
    AttemptEffects,
    CallClaim,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Failed,
    OutboxCall,
    OutboxEntry,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    StoreFigures,
    StoredUpdate,
)
from ptb_fence.runtime._alarms import Health
from ptb_fence.runtime._options import AlarmThresholds
from ptb_fence.runtime._stats import HistogramSnapshot, Stats
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._outbox import Outbox
from ptb_fence.runtime import (
    Attempt,
    AttemptTimeout,
    RuntimeOptions,
    current_attempt,
    default_retry,
)
from ptb_fence.blocking import UpdateIntake, webhook_app
from ptb_fence.stores import (
    MemoryUpdateStore,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    postgres_update_store_schema,
)

__version__ = "0.1.0"

__all__ = [
    "Abandoned",
    "AlarmThresholds",
    "Attempt",
    "AttemptEffects",
    "CallClaim",
    "AttemptFinished",
    "AttemptIdentity",
    "AttemptTimeout",
    "BatchUpdateStore",
    "BotBoundStore",
    "ClaimTerms",
    "ClaimingUpdateStore",
    "ChatOrderedUpdateStore",
    "CompletingUpdateStore",
    "IsolatingUpdateStore",
    "LivenessStore",
    "ReleasingUpdateStore",
    "Completed",
    "DurableUpdateStore",
    "Exhaustion",
    "Failed",
    "FencedUpdateStore",
    "FiguresStore",
    "Health",
    "HistogramSnapshot",
    "MemoryUpdateStore",
    "HeldCall",
    "Outbox",
    "OutboxCall",
    "OutboxEntry",
    "ClaimedInsertOutboxStore",
    "OutboxStore",
    "OwnershipLost",
    "PostgresUpdateStore",
    "SQLiteUpdateStore",
    "SchemaError",
    "RuntimeOptions",
    "Settlement",
    "StateConflict",
    "StateConflictError",
    "StateEntry",
    "StateKey",
    "StateStore",
    "StateWrite",
    "StoreBusy",
    "StoreCapabilities",
    "StoreFigures",
    "Stats",
    "RowLocked",
    "TableBotMismatch",
    "StoredUpdate",
    "TransactionEnded",
    "TransactionalUpdateStore",
    "UpdateIntake",
    "UpdateStore",
    "__version__",
    "current_attempt",
    "default_retry",
    "is_durable",
    "is_fenced",
    "postgres_update_store_schema",
    "webhook_app",
]
