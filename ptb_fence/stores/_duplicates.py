"""What every store does with an ``update_id`` that arrives again, in one place.

* The same update again (same fingerprint, see :func:`ptb_fence._fingerprint.update_fingerprint`,
  or either side without a fingerprint) is a plain duplicate. Nothing changes.
* A different update with a stored id whose row is *settled* (completed, or abandoned with
  ``settled_at`` set: an ordinary abandonment or an acknowledged exhaustion): the new update
  replaces the row exactly like a fresh insert.
* A different update while the stored row is *live* (pending, processing, failed, or an
  unacknowledged exhaustion) is dropped, and the first is kept. A WARNING on the
  ``ptb_fence.store`` logger names the id and both fingerprints.
"""

from __future__ import annotations

import logging
from typing import Optional

__all__ = ["warn_conflict", "LOGGER"]

LOGGER = logging.getLogger("ptb_fence.store")


def warn_conflict(
    update_id: int,
    stored: Optional[str],
    new: Optional[str],
    state: str,
    settled_at: Optional[int],
) -> None:
    """Log the WARNING for a different update whose id is held by a live row."""
    if stored is None or new is None or stored == new:
        return
    what = (
        "an unacknowledged exhaustion"
        if state == "abandoned" and settled_at is None
        else f"{state}"
    )
    LOGGER.warning(
        "update %s arrived again with a different body (stored fingerprint %s, new %s) while "
        "the stored row is %s: the first is kept and the new one is dropped. Telegram restarts "
        "update ids after a long silence, or two bots share this table (use one table per bot).",
        update_id,
        stored,
        new,
        what,
        extra={
            "update_id": update_id,
            "stored_fingerprint": stored,
            "new_fingerprint": new,
            "state": state,
        },
    )
