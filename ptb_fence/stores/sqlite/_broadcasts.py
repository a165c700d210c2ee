"""The broadcasts a completion started, written in its SQLite transaction."""

from __future__ import annotations

import json
import sqlite3
from typing import Sequence

from ptb_fence._values import BroadcastWrite
from ptb_fence.stores._queries import Statements

__all__ = ["write_broadcasts_in"]


def write_broadcasts_in(sql: Statements, conn: sqlite3.Connection,
                        writes: Sequence[BroadcastWrite], at: int) -> None:
    """Start each broadcast and add its chats, in the caller's transaction. The writes were
    checked when they were held (:func:`ptb_fence.stores._broadcasts.check_write`)."""
    for write in writes:
        params = {"name": write.name, "method": write.method, "params": write.params_json,
                  "at": int(at)}
        conn.execute(sql["broadcast_start"], params)
        if write.chat_ids:
            conn.execute(sql["broadcast_add_named"],
                         {**params, "chats": json.dumps(list(write.chat_ids))})
