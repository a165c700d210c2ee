"""pytest plugin: every ``ApplicationBuilder.build()`` wires the Application through
``FencedUpdateProcessor(MemoryUpdateStore()).install(builder)`` first.

Used to run python-telegram-bot's own offline tests with ptb_fence installed in every
Application they build (see ``tests/ptb_upstream.py`` and ``tests/test_ptb_upstream.py``)::

    cd <PTB checkout> && PYTHONPATH=<deps>:<repo>/tests:<repo> \\
        python -m pytest -p ptb_upstream_plugin -m "not req" tests/ext/test_application.py

A ``concurrent_updates(n)`` set on the builder is passed on as ``max_concurrent=n`` (what a
user does: the processor owns the setting), and the processor gets a ``handle_exhaustion``
(as a configured app has; without one ptb_fence logs a warning at start). This is test support: it wraps PTB's
``ApplicationBuilder.build`` (never ptb_fence).
"""

from __future__ import annotations

from typing import Any

from telegram.ext import ApplicationBuilder, BaseUpdateProcessor

from ptb_fence import MemoryUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor

_ORIGINAL_BUILD = ApplicationBuilder.build


def _ignore(exhaustion: Any) -> None:
    """An exhaustion handler (a configured app has one; without, ptb_fence warns at start)."""


def _build_with_install(self: Any) -> Any:
    current = getattr(self, "_update_processor", None)  # test support: read what PTB holds
    max_concurrent = 1
    if isinstance(current, BaseUpdateProcessor) and not isinstance(
        current, FencedUpdateProcessor
    ):
        max_concurrent = max(1, current.max_concurrent_updates)
    if not isinstance(current, FencedUpdateProcessor):
        FencedUpdateProcessor(
            MemoryUpdateStore(), max_concurrent=max_concurrent, handle_exhaustion=_ignore
        ).install(self)
    return _ORIGINAL_BUILD(self)


def pytest_configure(config: Any) -> None:
    """Wrap ``ApplicationBuilder.build`` for the whole run."""
    ApplicationBuilder.build = _build_with_install  # type: ignore[method-assign]
