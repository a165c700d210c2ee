"""``ptb-fence``: the operator command line for a ptb_fence update table.

Run it as ``ptb-fence`` (console script) or ``python -m ptb_fence``::

    ptb-fence --store sqlite:///bot.sqlite3 status
    ptb-fence --store postgresql://bot@db/bot --table telegram_updates exhaustions

Commands: ``status``, ``health``, ``list``, ``show``, ``exhaustions``, ``ack``, ``retry``,
``prune``, ``schema``, ``migrate``, ``check``, and ``outbox list|show|retry|drop`` for the Bot
API calls in the table's outbox (see ``ptb-fence --help``). Exit statuses: ``0``
ok, ``1`` the conformance check found violations, ``health`` found the table unhealthy or
``migrate --check`` found the schema behind, ``2`` bad input or a refused action (one line on stderr; nothing was changed), ``3`` the store
could not be reached or failed (``health`` reports that as unhealthy, ``1``).

The ``retry`` and ``ack`` actions (and ``outbox retry``/``outbox drop``, with ``call_id`` too)
are logged under the ``ptb_fence.cli`` logger with ``update_id``, ``attempt`` and ``claim_id``
as ``extra`` fields.
"""

from ptb_fence.cli._commands import build_parser, main

__all__ = ["build_parser", "main"]
