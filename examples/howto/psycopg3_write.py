"""A fenced write on a psycopg 3 connection."""

import psycopg

from ptb_fence import Attempt


async def save_note(attempt: Attempt, conninfo: str, text: str) -> None:
    """Insert a note and complete the update in one commit (call it from a PTB handler)."""

    def write(conn: psycopg.Connection) -> None:  # guarded: no commit() or rollback() here
        conn.execute("INSERT INTO notes (update_id, text) VALUES (%s, %s)",
                     (attempt.update_id, text))

    with psycopg.connect(conninfo) as conn:  # a sync connection, not an AsyncConnection
        await attempt.run_in_transaction(write, connection=conn, complete=True)
