"""Cutting a database connection's socket from another thread (shared by the runtime and the
PostgreSQL store)."""

from __future__ import annotations

import os
import socket
import threading
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["cut", "cut_after"]


def cut(connection: Any) -> bool:
    """Shut the socket of a psycopg2 connection down (both directions), from any thread.

    The thread using the connection gets an error at once, whether it waits for the server
    (which may not answer at all: frozen, partitioned) or runs Python code between statements.
    The server, once it sees the client gone, rolls back the connection's open transaction and
    drops its locks. Returns :obj:`False` when there is no socket to cut (closed, or not a
    psycopg2 connection).
    """
    fileno = getattr(connection, "fileno", None)
    if getattr(connection, "closed", 1) or not callable(fileno):
        return False
    try:
        sock = socket.socket(fileno=os.dup(fileno()))
    except (OSError, ValueError, TypeError):
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)  # acts on the connection's own descriptor too
    except OSError:
        return False
    finally:
        sock.close()  # only the duplicate
    return True


@contextmanager
def cut_after(connection: Any, seconds: float) -> Iterator[None]:
    """Cut ``connection`` (:func:`cut`) if the block has not ended within ``seconds``: a
    client-side bound for calls a server-side ``statement_timeout`` cannot bound (a server
    that does not answer enforces nothing)."""
    timer = threading.Timer(seconds, cut, (connection,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
