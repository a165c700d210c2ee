"""Wiring a processor into a PTB Application: the builder settings ``install`` makes, and
the checks of the Application's handlers at ``initialize``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypeVar

from telegram.ext import Application, ApplicationBuilder, BaseUpdateProcessor

from ptb_fence.ptb._application import fenced_application_class
from ptb_fence.ptb._persistence import FencedPersistence
from ptb_fence.ptb._ptb_internals import builder_application_class, require_internals

__all__ = ["BuilderType", "configure_builder", "warn_non_blocking", "warn_unfenced_persistence"]

_LOGGER = logging.getLogger("ptb_fence.ptb")

BuilderType = TypeVar("BuilderType", bound="ApplicationBuilder[Any, Any, Any, Any, Any, Any]")


def configure_builder(
    builder: BuilderType, processor: BaseUpdateProcessor, queue: "asyncio.Queue[object]"
) -> BuilderType:
    """Set ``processor``, its durable ``queue`` and a fenced Application class on ``builder``
    (what :meth:`~ptb_fence.ptb.BaseFenceProcessor.install` does)."""
    if not isinstance(builder, ApplicationBuilder):
        raise TypeError(f"install() needs a telegram.ext.ApplicationBuilder, got {builder!r}")
    require_internals(builder)
    builder.concurrent_updates(processor)
    try:
        builder.update_queue(queue)
    except RuntimeError as exc:
        raise RuntimeError(
            f"{type(processor).__name__}.install(): the builder has a custom updater, whose "
            "update_queue would bypass durable recording; remove .updater(...)"
        ) from exc
    # the context type is made fenced by the Application class itself, from the
    # context_types PTB passes it (set before or after install())
    app_class, kwargs = builder_application_class(builder)
    builder.application_class(fenced_application_class(app_class or Application), kwargs)
    return builder


def warn_non_blocking(application: Any) -> None:
    """Warn about each handler that runs with ``block=False`` (outside the attempt)."""
    defaults = getattr(application.bot, "defaults", None)
    default_block = True if defaults is None else bool(defaults.block)
    for group, handlers in application.handlers.items():
        for handler in handlers:
            block = handler.block
            non_blocking = (block is False) or (
                not isinstance(block, bool) and not default_block
            )
            if non_blocking:
                _LOGGER.warning(
                    "handler %r (group %s) runs with block=False: it runs OUTSIDE the "
                    "attempt (no fencing, its failures are not retried, context.attempt "
                    "is None)",
                    handler,
                    group,
                )


def warn_unfenced_persistence(application: Any) -> None:
    """Warn when a fenced Application persists its data with anything but
    :class:`~ptb_fence.ptb.FencedPersistence` (``PicklePersistence``, a ``DictPersistence``,
    your own ``BasePersistence``)."""
    persistence = application.persistence
    if persistence is None or isinstance(persistence, FencedPersistence):
        return
    _LOGGER.warning(
        "%s under a FencedUpdateProcessor: user_data, chat_data, bot_data and conversation "
        "states live in this process and reach the file only at PTB's flush, not with the "
        "update's commit, so a kill loses what changed since then, another process never "
        "sees it, and a failed attempt's changes stay for its retry. Use "
        "persistence(ptb_fence.ptb.FencedPersistence(store)) with the processor's store "
        "(ptb-fence persistence import moves a PicklePersistence file into it)",
        type(persistence).__name__,
    )
