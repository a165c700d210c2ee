"""The names of the tables a ptb_fence store owns, for the ORM helpers."""

from __future__ import annotations

from typing import FrozenSet, Iterable

from ptb_fence.stores import validate_table_name
from ptb_fence.stores._jobs_sql import jobs_table_name
from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.stores._broadcasts import broadcast_tables
from ptb_fence.stores._pace import pace_table_name
from ptb_fence.stores._state_sql import state_table_name
from ptb_fence.stores._steps_sql import steps_table_name
from ptb_fence.stores.postgres._sql import INSTANCES_TABLE, META_TABLE

__all__ = ["DEFAULT_TABLE", "owned_tables"]

DEFAULT_TABLE = "telegram_updates"


def owned_tables(tables: Iterable[str]) -> FrozenSet[str]:
    """Every table the stores on ``tables`` create: each update table, its outbox, state, steps,
    jobs, pace, broadcasts and recipients tables, and the ``ptb_fence_meta`` and ``ptb_fence_instances`` tables they share.

    Raises:
        ValueError: A name that is not a valid table name.
    """
    found = {META_TABLE, INSTANCES_TABLE}
    for table in tables:
        validate_table_name(table)
        found.update((
            table, outbox_table_name(table), state_table_name(table), steps_table_name(table),
            jobs_table_name(table), pace_table_name(table),
            broadcast_tables(table)["broadcasts"], broadcast_tables(table)["recipients"],
        ))
    return frozenset(found)
