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
    UsageError,
    is_misuse,
)
from ptb_fence.contract import (
    Batch,
    BatchStore,
    Committed,
    StoreFeatures,
    ClaimTerms,
    OutboxStore,
    StateStore,
    StoreCapabilities,
    DurableUpdateStore,
    FencedUpdateStore,
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
    PaceBucket,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    StepRecord,
    JobFire,
    JobWrite,
    StoredJob,
    StoreFigures,
    StoredUpdate,
)
from ptb_fence.runtime._alarms import Health
from ptb_fence.runtime._options import AlarmThresholds
from ptb_fence.runtime._pacer import OutboxPacing
from ptb_fence.runtime._stats import HistogramSnapshot, Stats
from ptb_fence.runtime._delivered import DeliveredExhaustion
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
    "Batch",
    "BatchStore",
    "ClaimTerms",
    "Committed",
    "Completed",
    "DeliveredExhaustion",
    "DurableUpdateStore",
    "Exhaustion",
    "Failed",
    "FencedUpdateStore",
    "Health",
    "HistogramSnapshot",
    "MemoryUpdateStore",
    "HeldCall",
    "Outbox",
    "OutboxCall",
    "OutboxEntry",
    "OutboxStore",
    "OwnershipLost",
    "OutboxPacing",
    "PaceBucket",
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
    "StepRecord",
    "JobFire",
    "JobWrite",
    "StoredJob",
    "StoreBusy",
    "StoreCapabilities",
    "StoreFeatures",
    "StoreFigures",
    "Stats",
    "RowLocked",
    "TableBotMismatch",
    "StoredUpdate",
    "TransactionEnded",
    "UsageError",
    "UpdateIntake",
    "UpdateStore",
    "__version__",
    "current_attempt",
    "default_retry",
    "is_misuse",
    "is_durable",
    "is_fenced",
    "postgres_update_store_schema",
    "webhook_app",
]
