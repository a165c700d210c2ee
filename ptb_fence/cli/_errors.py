"""The errors of the ``ptb-fence`` command line and their exit statuses."""

from __future__ import annotations

__all__ = ["CommandError", "Refused", "StoreFailure"]


class CommandError(Exception):
    """A command stopped with a one-line message. ``status`` is the process exit status."""

    status = 1


class Refused(CommandError):
    """Bad input or a refused action (exit status 2). Nothing was changed."""

    status = 2


class StoreFailure(CommandError):
    """The store could not be reached or failed (exit status 3)."""

    status = 3
