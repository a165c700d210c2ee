"""The asyncio forms of :class:`~ptb_fence.Attempt`'s blocking calls (a mixin of Attempt)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, ContextManager, TypeVar

from ptb_fence.runtime._phase import _ASYNC_FN, AttemptHost


if TYPE_CHECKING:
    import asyncio  # imported where used: import ptb_fence stays light

__all__ = ["AsyncForms"]

T = TypeVar("T")


class AsyncForms:
    """``run_in_transaction``, ``owns_async`` and ``exhaust_async``: the blocking store calls
    run off the event loop (on the runtime's executor, keeping context variables)."""

    __slots__ = ()

    if TYPE_CHECKING:
        _runtime: AttemptHost

        def _raise_if_finished(self) -> None: ...

        def transaction(self, *, connection: Any = None, complete: bool = False) -> ContextManager[Any]: ...

        def owns(self, connection: Any = None) -> bool: ...

        def exhaust(self, reason: str) -> None: ...

    async def run_in_transaction(
        self, fn: Callable[[Any], T], *, connection: Any = None, complete: bool = False
    ) -> T:
        """Run ``fn(connection)`` on a worker thread inside :meth:`transaction`.

        The asyncio form of :meth:`transaction`: it never blocks the event loop.

        Args:
            fn: Called with the transaction's connection; its result is returned.
            connection: As in :meth:`transaction` (e.g. a SQLAlchemy ``Session``); ``fn``
                receives it. For Django call :meth:`transaction` in a function you run
                with :func:`asyncio.to_thread` instead, and close that thread's connection
                there (``django.db.close_old_connections()``): Django connections belong to
                the thread that opened them.
            complete: As in :meth:`transaction`.

        Raises:
            OwnershipLost: The attempt no longer owns the update; ``fn``'s writes were
                rolled back.
            TypeError: ``fn`` is an ``async def`` function (or returned an awaitable): it
                would write nothing. Pass a plain function; the transaction is rolled back.
            AttemptFinished: As in :meth:`transaction`.
            TransactionEnded: As in :meth:`transaction`.
        """
        self._raise_if_finished()
        if inspect.iscoroutinefunction(fn):
            raise TypeError(_ASYNC_FN)

        def run() -> T:
            with self.transaction(connection=connection, complete=complete) as conn:
                result = fn(conn)
                if inspect.isawaitable(result):
                    if inspect.iscoroutine(result):
                        result.close()  # never awaited: no "never awaited" warning either
                    raise TypeError(_ASYNC_FN)  # rolls the transaction back
                return result

        return await self._off_loop(run)

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        """Run blocking ``fn`` on the runtime's store threads (keeping context variables)."""
        hop = self._runtime.executor
        if hop is None:
            import asyncio

            return await asyncio.to_thread(fn)
        return await hop.run(fn)

    async def owns_async(self, connection: Any = None) -> bool:
        """The asyncio form of :meth:`owns`: the store call runs off the event loop."""
        return await self._off_loop(lambda: self.owns(connection))

    async def exhaust_async(self, reason: str) -> None:
        """The asyncio form of :meth:`exhaust`: the store call runs off the event loop."""
        await self._off_loop(lambda: self.exhaust(reason))

