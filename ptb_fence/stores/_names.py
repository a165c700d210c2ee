"""Validation of what reaches SQL: table names and update ids, checked before any SQL runs."""

from __future__ import annotations

import re

from ptb_fence._update_ids import is_update_id

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def validate_table_name(table: object) -> str:
    """Return ``table`` if it is a safe table name, else raise :exc:`ValueError`.

    A name must fully match ``[A-Za-z_][A-Za-z0-9_]{0,62}``.
    """
    if not isinstance(table, str) or _TABLE_NAME.fullmatch(table) is None:
        raise ValueError(
            f"invalid table name {table!r}: a table name must match "
            "[A-Za-z_][A-Za-z0-9_]{0,62} (letters, digits and underscores, at most 63 "
            "characters, not starting with a digit)"
        )
    return table


def split_table_name(name: object) -> "tuple[str | None, str]":
    """Split the command line's ``schema.table`` into its two parts, each validated like a
    table name (a name without a dot is ``(None, table)``). The stores take the two apart:
    ``PostgresUpdateStore(dsn, table, schema=...)``.

    Raises:
        ValueError: A part that is not a valid name, or more than one dot.
    """
    if isinstance(name, str) and name.count(".") == 1:
        schema, table = name.split(".")
        return validate_schema_name(schema), validate_table_name(table)
    return None, validate_table_name(name)


def validate_schema_name(schema: object) -> str:
    """Return ``schema`` if it is a safe schema name (the rule of table names), else raise
    :exc:`ValueError`."""
    if not isinstance(schema, str) or _TABLE_NAME.fullmatch(schema) is None:
        raise ValueError(
            f"invalid schema name {schema!r}: a schema name must match "
            "[A-Za-z_][A-Za-z0-9_]{0,62} (letters, digits and underscores, at most 63 "
            "characters, not starting with a digit)"
        )
    return schema


def validate_update_id(update_id: object) -> int:
    """Return ``update_id`` if it can be a Telegram ``update_id``, else raise.

    Stores check this before writing: SQLite would turn ``None`` into a fresh rowid and
    ``"5"`` or ``1.0`` into ``5`` / ``1``.

    Raises:
        TypeError: Not an :obj:`int` (booleans and floats included).
        ValueError: Negative or above ``2**63 - 1`` (a BIGINT).
    """
    if isinstance(update_id, bool) or not isinstance(update_id, int):
        raise TypeError(f"update_id must be an int, got {type(update_id).__name__}")
    if not is_update_id(update_id):
        raise ValueError(f"update_id must be from 0 to 2**63-1, got {update_id}")
    return update_id
