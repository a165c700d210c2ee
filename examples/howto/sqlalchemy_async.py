"""The AsyncSession recipe: hand the fenced block the sync Session through ``run_sync``."""

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from ptb_fence import Attempt


async def book(async_engine: AsyncEngine, attempt: Attempt, booking: Any) -> None:
    """Add ``booking`` and complete the update in one commit (call it from a PTB handler)."""

    def write(session: Session) -> None:  # the AsyncSession's sync Session
        with attempt.transaction(connection=session, complete=True):
            session.add(booking)

    async with AsyncSession(async_engine) as session:
        await session.run_sync(write)  # the I/O still runs on the event loop
