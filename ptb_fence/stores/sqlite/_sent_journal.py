"""SentJournal: the record of sent outbox calls that never waits for the database's write lock.

SQLite has one write lock per database file. A fenced transaction holds it while its handler's
code runs. So the ``record_sent`` of another chat's call waits behind it, for seconds, up to
``busy_timeout``. A sender that dies meanwhile leaves a call that Telegram answered looking
unsent, and the next sender sends it again. So each answer is first written to a journal of
its own. It is a small SQLite file next to the database (``<database>.sent``, WAL). Only
senders take its write lock, each for one short insert. :class:`SentJournal` says how the
journal is folded in.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

from ptb_fence._values import OutboxEntry
from ptb_fence.stores._queries import Statements, load

__all__ = ["SentJournal", "SentRow", "fold_order", "journal_path"]

SentRow = Tuple[int, str, str, int]
"""``(call_id, sender, result_json, at)``, as ``record_sent`` takes it."""



@lru_cache(maxsize=64)
def _statements(outbox: str) -> Statements:
    """The journal's statements, ``outbox_sending`` on the outbox table ``outbox``."""
    return load("sqlite journal", __package__, ("journal.sql",)).fill({"outbox": outbox}, {})


def journal_path(database: str) -> str:
    """The journal file of the database file ``database``."""
    return database + ".sent"


class SentJournal:
    """The sent journal of one database file, for one store object. Thread-safe.

    Every claim of the outbox folds the journal in under the database's write lock before it
    picks calls. A journaled call is ``sent``, and never claimed again. The stores' readers
    show a journaled call as ``sent``. Folded rows are deleted from the journal after the
    commit that folded them.

    One connection, opened on first use (again after a fork), serves every thread: each
    statement is short, so a lock is cheaper than a connection per sender thread.

    Args:
        database: The absolute path of the database file.
        synchronous: ``PRAGMA synchronous`` (the database's).
        busy_timeout: Seconds a write waits for another process's journal write.
    """

    __slots__ = ("_busy_timeout", "_conn", "_lock", "_pid", "_synchronous", "path")

    def __init__(self, database: str, synchronous: str, busy_timeout: float) -> None:
        self.path = journal_path(database)
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._conn: Optional[sqlite3.Connection] = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _connection(self, create: bool) -> Optional[sqlite3.Connection]:
        """The connection (under ``_lock``). :obj:`None` when the file is not there and
        ``create`` is false (nothing was ever journaled: readers need no file)."""
        if self._pid != os.getpid():  # a forked child: never touch the parent's connection
            self._conn, self._pid = None, os.getpid()
        if self._conn is not None:
            return self._conn
        if not create and not os.path.exists(self.path):
            return None
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute(_statements("sent")["journal_create"])  # (no outbox in it)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def note(self, outbox: str, rows: Sequence[SentRow]) -> None:
        """Journal ``rows`` of ``outbox``, committed when this returns."""
        if not rows:
            return
        with self._lock:
            conn = self._connection(create=True)
            assert conn is not None
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(_statements(outbox)["journal_note"], [
                    {"outbox": outbox, "call_id": int(c), "sender": str(s), "result": str(r),
                     "at": int(a)}
                    for c, s, r, a in rows
                ])
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def read(self, outbox: str) -> Dict[int, SentRow]:
        """Every row journaled for ``outbox`` and not forgotten, by call id."""
        with self._lock:
            conn = self._connection(create=False)
            if conn is None:
                return {}
            rows = conn.execute(
                _statements(outbox)["journal_read"], {"outbox": outbox}
            ).fetchall()
        return {int(c): (int(c), str(s), str(r), int(a)) for c, s, r, a in rows}

    def forget(self, outbox: str, call_ids: Sequence[int]) -> None:
        """Delete the rows of ``call_ids`` (their record landed in the database)."""
        if not call_ids:
            return
        with self._lock:
            conn = self._connection(create=False)
            if conn is None:
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(_statements(outbox)["journal_forget"],
                                 [{"outbox": outbox, "call_id": int(c)} for c in call_ids])
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def unfolded(self, conn: sqlite3.Connection, outbox: str) -> Dict[int, SentRow]:
        """The journaled rows whose call the database (read on ``conn``) still has
        ``sending`` by the sender that journaled it: sent, not folded in yet."""
        journaled = self.read(outbox)
        if not journaled:
            return {}
        rows = conn.execute(
            _statements(outbox)["outbox_sending"], {"call_ids": json.dumps(sorted(journaled))},
        ).fetchall()
        return {int(c): journaled[int(c)] for c, who in rows if journaled[int(c)][1] == who}

    def shown(
        self, conn: sqlite3.Connection, outbox: str, entries: List[OutboxEntry]
    ) -> List[OutboxEntry]:
        """``entries`` as readers see them: a ``sending`` call journaled as sent by its
        sender is ``sent`` (with the journal's ``sent_at`` and result)."""
        if not any(entry.state == "sending" for entry in entries):
            return entries
        sent = self.unfolded(conn, outbox)
        if not sent:
            return entries
        return [
            dataclasses.replace(entry, state="sent", sent_at=sent[entry.call_id][3],
                                result_json=sent[entry.call_id][2])
            if entry.state == "sending" and entry.call_id in sent else entry
            for entry in entries
        ]

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            conn.close()


def fold_order(rows: Dict[int, SentRow]) -> List[SentRow]:
    """The journaled rows in call order (one transaction writes them in a fixed order)."""
    return [rows[c] for c in sorted(rows)]
