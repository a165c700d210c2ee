"""``ptb-fence``: the operator command line for a ptb_fence update table.

Run it as ``ptb-fence`` (console script) or ``python -m ptb_fence``::

    ptb-fence --store sqlite:///bot.sqlite3 status
    ptb-fence --store postgresql://bot@db/bot --table telegram_updates exhaustions

``ptb-fence --help`` lists the commands. :func:`main` gives the exit statuses.
The ``retry`` and ``ack`` actions are logged under the ``ptb_fence.cli`` logger with the
``update_id``, ``attempt`` and ``claim_id`` extras. ``outbox retry|drop`` add ``call_id``.
"""

from ptb_fence.cli._commands import build_parser, main

__all__ = ["build_parser", "main"]
