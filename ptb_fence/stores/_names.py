"""Validation of SQL identifiers (table names) before any SQL runs."""

from __future__ import annotations

import re

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
