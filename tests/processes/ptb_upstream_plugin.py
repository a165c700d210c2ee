"""pytest plugin: every ``ApplicationBuilder.build()`` wires the Application through a
ptb_fence processor's ``install(builder)`` first.

Used to run python-telegram-bot's own offline tests with ptb_fence installed in every Application
they build (see ``tests/processes/ptb_upstream.py`` and ``tests/processes/test_ptb_upstream.py``).
Two variables choose the wiring:

- ``PTB_FENCE_UPSTREAM_PROCESSOR``: ``fenced`` (``FencedUpdateProcessor``, the default) or
  ``durable`` (``DurableUpdateProcessor``);
- ``PTB_FENCE_UPSTREAM_STORE``: ``memory`` (the default) or ``sqlite`` (a fresh database file
  per Application, in a temporary directory removed at exit).

A ``concurrent_updates(n)`` set on the builder is passed on as ``max_concurrent=n`` (what a
user does: the processor owns the setting), and the processor gets a ``handle_exhaustion``
(as a configured app has; without one ptb_fence logs a warning at start). This is test
support: it wraps PTB's ``ApplicationBuilder.build`` (never ptb_fence).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
from typing import Any

from telegram.ext import ApplicationBuilder, BaseUpdateProcessor

from ptb_fence import MemoryUpdateStore, SQLiteUpdateStore, UpdateStore
from ptb_fence.ptb import BaseFenceProcessor, DurableUpdateProcessor, FencedUpdateProcessor

_ORIGINAL_BUILD = ApplicationBuilder.build
_PROCESSOR = os.environ.get("PTB_FENCE_UPSTREAM_PROCESSOR", "fenced")
_STORE = os.environ.get("PTB_FENCE_UPSTREAM_STORE", "memory")
_COUNTER = itertools.count()
_DIRECTORY: "list[str]" = []


def _ignore(exhaustion: Any) -> None:
    """An exhaustion handler (a configured app has one; without, ptb_fence warns at start)."""


def _new_store() -> UpdateStore:
    if _STORE == "memory":
        return MemoryUpdateStore()
    if not _DIRECTORY:
        _DIRECTORY.append(tempfile.mkdtemp(prefix="ptb-upstream-"))
        atexit.register(shutil.rmtree, _DIRECTORY[0], True)
    return SQLiteUpdateStore(os.path.join(_DIRECTORY[0], f"app{next(_COUNTER)}.db"))


def _build_with_install(self: Any) -> Any:
    current = getattr(self, "_update_processor", None)  # test support: read what PTB holds
    max_concurrent = 1
    if isinstance(current, BaseUpdateProcessor) and not isinstance(current, BaseFenceProcessor):
        max_concurrent = max(1, current.max_concurrent_updates)
    if not isinstance(current, BaseFenceProcessor):
        kind = FencedUpdateProcessor if _PROCESSOR == "fenced" else DurableUpdateProcessor
        kind(_new_store(), max_concurrent=max_concurrent, handle_exhaustion=_ignore).install(self)
    return _ORIGINAL_BUILD(self)


def pytest_configure(config: Any) -> None:
    """Check the wiring chosen and wrap ``ApplicationBuilder.build`` for the whole run."""
    if _PROCESSOR not in ("fenced", "durable") or _STORE not in ("memory", "sqlite"):
        raise ValueError(
            "PTB_FENCE_UPSTREAM_PROCESSOR must be 'fenced' or 'durable' and "
            "PTB_FENCE_UPSTREAM_STORE 'memory' or 'sqlite'"
        )
    ApplicationBuilder.build = _build_with_install  # type: ignore[method-assign]
