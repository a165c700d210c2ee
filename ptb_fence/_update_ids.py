"""What a valid ``update_id`` is: the one definition every way in (runtime, PTB adapter,
stores, CLI) imports."""

from __future__ import annotations

from typing import Optional

__all__ = ["MAX_UPDATE_ID", "is_update_id", "update_id_problem"]

MAX_UPDATE_ID = 2**63 - 1
"""The largest ``update_id`` a store can hold (a BIGINT)."""


def update_id_problem(update_id: object) -> Optional[str]:
    """Why ``update_id`` is not a valid Telegram ``update_id``, or :obj:`None` when it is.

    Valid: an :obj:`int` (not a :obj:`bool`, not a float such as ``1.0``) from 0 to
    :data:`MAX_UPDATE_ID`. Stores must not see anything else (SQLite would turn ``None`` into
    a fresh rowid, ``1.0`` into ``1``).
    """
    if type(update_id) is int and 0 <= update_id <= MAX_UPDATE_ID:
        return None  # the usual case first: this runs several times per update
    if isinstance(update_id, bool) or not isinstance(update_id, int):
        return "update_id is missing or not an integer"
    if update_id < 0 or update_id > MAX_UPDATE_ID:
        return "update_id is out of range (0 to 2**63-1)"
    return None


def is_update_id(update_id: object) -> bool:
    """:obj:`True` when ``update_id`` is a valid Telegram ``update_id``."""
    if type(update_id) is int:
        return 0 <= update_id <= MAX_UPDATE_ID
    return update_id_problem(update_id) is None
