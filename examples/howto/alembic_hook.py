"""Alembic's ``env.py``: keep autogenerate away from ptb_fence's tables."""

from typing import Any

from ptb_fence.contrib.sqlalchemy import alembic_include_object

# Name every bot's update table. Your own hook, if any, goes in as chain=your_hook.
include_object = alembic_include_object("telegram_updates")


def configure(context: Any, connection: Any, target_metadata: Any) -> None:
    """What ``run_migrations_online()`` in ``env.py`` calls."""
    context.configure(connection=connection, target_metadata=target_metadata,
                      include_object=include_object)
