"""TransactionGroup: concurrent fenced transactions on a store's own connection, one commit.

A call that finds a flight free (fewer than :data:`FLIGHTS` transactions of its store in
flight) runs alone at once, as it always did: no wait at low load, no timer. Calls that
arrive while every flight is taken wait on the event loop, holding no thread. When a flight
ends a leader thread takes it over: one transaction, a savepoint per member, its ownership
check (and completion), its block, back to its savepoint on its error or lost ownership
(that member alone fails), then one commit. A commit (or connection) that fails
reports no member committed: each runs again alone.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Optional, Protocol, TypeVar

from ptb_fence._dbapi import library_of, transaction_ended
from ptb_fence.runtime._daemon_pool import DaemonThreadPool

if TYPE_CHECKING:
    import asyncio  # imported where used: import ptb_fence stays light

__all__ = ["FLIGHTS", "MAX_MEMBERS", "TransactionGroup", "in_flight", "queued", "run_grouped"]

T = TypeVar("T")


class FencedBlock(Protocol):
    """The steps of one fenced transaction that a group drives (the attempt's block)."""

    def run(self, fn: Callable[[Any], Any], conn: Any, check: Any = None) -> Any:
        """Check ownership on ``conn`` and run ``fn`` inside the block."""

    def raised(self) -> None:
        """The member's block raised: its effects are discarded."""

    def landed_with_escape(self) -> Optional[bool]:
        """Whether the writes of a block that ended the transaction itself landed."""

    def committed(self) -> None:
        """The group's commit landed."""

    def end(self) -> None:
        """The block is over, whatever happened."""


class Attempt(Protocol):
    """What a group needs of an attempt. The runtime's attempt has it."""

    @property
    def host(self) -> Any:
        """The runtime the attempt belongs to (its store port)."""

    def run_alone(
        self, fn: Callable[[Any], Any], connection: Any = None, complete: bool = False
    ) -> Any:
        """Run ``fn`` in a fenced transaction of its own."""

    def open_block(self, complete: bool) -> FencedBlock:
        """Open a fenced block on a connection the group commits."""

OffLoop = Callable[[Callable[[], Any]], Awaitable[Any]]
"""Runs a blocking function on a store thread and awaits its result."""


_LOGGER = logging.getLogger("ptb_fence.runtime")

MAX_MEMBERS = 32
"""Members of one group at most. PostgreSQL keeps 64 subtransactions of a transaction in
shared memory, and a member may take two (its savepoint and one of its state writes)."""

FLIGHTS = 2
"""Transactions of one store in flight at once before calls wait for a group. Two: one
group runs its members while the other commits (one alone serialises every statement on one
connection, four leave groups too small to save commits)."""

_LEADER_THREADS = 8
"""Groups led at once in a process at most (:data:`FLIGHTS` per store)."""

# numbered per member: rolling back to a savepoint that is not there fails (the group fails
# and each runs alone), where a shared name would reach back to the member before
_SAVEPOINT = "SAVEPOINT ptb_fence_member"

# drivers whose connections take the savepoint statements as they are
_SAVEPOINT_DRIVERS = frozenset({"sqlite3", "psycopg2", "psycopg"})

# a member's outcome (what its caller does once told)
_WAITING, _DONE, _FAILED, _ALONE = range(4)

_LOCK = threading.Lock()
_POOL: "List[DaemonThreadPool]" = []  # the leader threads, made when first needed
# the groups with a transaction in flight, by id() of their store port: a group lives only
# while one is (its callers keep the port alive, so the id cannot be reused meanwhile)
_GROUPS: "Dict[int, TransactionGroup]" = {}


def _leaders() -> "DaemonThreadPool":
    """The threads that lead groups (daemon threads: a stuck group never blocks an exit)."""
    with _LOCK:
        if not _POOL:
            _POOL.append(DaemonThreadPool(_LEADER_THREADS, "ptb_fence-group"))
        return _POOL[0]


def _wake(futures: "List[asyncio.Future[None]]") -> None:
    for future in futures:
        if not future.done():  # its caller was cancelled: no one reads the outcome
            future.set_result(None)


def _tell(members: "List[_Member]") -> None:
    """From any thread: wake the callers of ``members``, which read their outcomes (one
    wake-up of each event loop for all its callers)."""
    by_loop: "Dict[asyncio.AbstractEventLoop, List[asyncio.Future[None]]]" = {}
    for member in members:
        by_loop.setdefault(member.loop, []).append(member.future)
    for loop, futures in by_loop.items():
        try:
            loop.call_soon_threadsafe(_wake, futures)
        except RuntimeError:  # the loop is closed: no one waits any more
            pass


class _Member:
    """One call waiting for a group: what it runs, in which context, and how it ended."""

    __slots__ = ("attempt", "complete", "context", "fn", "future", "loop", "outcome", "value")

    def __init__(self, attempt: "Attempt", fn: Callable[[Any], Any], complete: bool,
                 loop: "asyncio.AbstractEventLoop") -> None:
        self.attempt = attempt
        self.fn = fn
        self.complete = complete
        # the caller's context variables: its block runs in them on the leader's thread
        self.context = contextvars.copy_context()
        self.loop = loop
        self.future: "asyncio.Future[None]" = loop.create_future()
        self.outcome = _WAITING
        self.value: Any = None

    def finish(self, outcome: int, value: Any = None) -> None:
        """Set the outcome (the caller is told once the group ended)."""
        self.outcome = outcome
        self.value = value

    def result(self) -> Any:
        """The block's result, or raise its error."""
        if self.outcome == _FAILED:
            error = self.value
            self.value = None
            raise error
        return self.value


class _Unguarded(Exception):
    """A member's ownership check did not go through the connection that carries its
    savepoint: nothing of the group may commit."""


class _SavepointFirst:
    """A psycopg2 connection whose next statement starts with the member's savepoint (one
    round trip for both). Everything else is the connection's own.

    Args:
        connection: The group's connection.
        savepoint: The member's ``SAVEPOINT`` statement.
    """

    __slots__ = ("_connection", "_savepoint", "sent")

    def __init__(self, connection: Any, savepoint: str) -> None:
        self._connection = connection
        self._savepoint = savepoint
        self.sent = False  # the savepoint went out (with the statement that carried it)

    def cursor(self, *args: Any, **kwargs: Any) -> "_SavepointCursor":
        """A cursor of the connection whose first ``execute`` carries the savepoint."""
        return _SavepointCursor(self, self._connection.cursor(*args, **kwargs))

    def carry(self, sql: Any) -> Any:
        """``sql`` preceded by the savepoint, the first time (a text statement only)."""
        if self.sent or not isinstance(sql, str):
            return sql
        self.sent = True
        return f"{self._savepoint}; {sql}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


class _SavepointCursor:
    """A cursor whose statements go through :meth:`_SavepointFirst.carry`."""

    __slots__ = ("_cursor", "_owner")

    def __init__(self, owner: _SavepointFirst, cursor: Any) -> None:
        self._owner = owner
        self._cursor = cursor

    def execute(self, sql: Any, params: Any = None) -> Any:
        """The cursor's ``execute``, the savepoint first if it has not gone out yet."""
        return self._cursor.execute(self._owner.carry(sql), params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class TransactionGroup:
    """The fenced transactions of one store port: a few in flight, the others waiting for
    the next group.

    Args:
        key: The id of the store port (its key among the groups in flight).
    """

    __slots__ = ("_flights", "_key", "_queue")

    def __init__(self, key: int) -> None:
        self._key = key
        self._queue: "List[_Member]" = []
        self._flights = 1  # transactions in flight (the first caller's)

    def take_off(self) -> bool:
        """Under the lock: take a flight if one is free (:obj:`True`)."""
        if self._flights < FLIGHTS:
            self._flights += 1
            return True
        return False

    def wait(self, member: _Member) -> None:
        """Under the lock: queue ``member`` for the next group."""
        self._queue.append(member)

    def relay(self) -> None:
        """On the store thread whose transaction of this flight just ended: the members that
        waited meanwhile (at most :data:`MAX_MEMBERS`) take the flight over on a leader
        thread, or it lands. Never raises."""
        with _LOCK:
            batch = self._queue[:MAX_MEMBERS]
            del self._queue[:MAX_MEMBERS]
            if not batch:
                self._land()
                return
        try:
            _leaders().submit(self.fly, batch)
        except BaseException:  # no thread to lead them: each meets that alone
            _LOGGER.exception("fenced transactions: a group could not be led")
            for member in batch:
                member.outcome = _ALONE
            _tell(batch)
            self.grounded()

    def fly(self, batch: List[_Member]) -> None:
        """On a store thread: lead ``batch``, then the members that waited meanwhile (at
        most :data:`MAX_MEMBERS` a group) until none waits, then land."""
        try:
            while True:
                self.lead(batch)
                with _LOCK:
                    batch = self._queue[:MAX_MEMBERS]
                    del self._queue[:MAX_MEMBERS]
                    if not batch:
                        self._land()
                        return
        except BaseException:  # lead never raises: a last resort, the waiting run alone
            _LOGGER.exception("fenced transactions: leading a group failed")
            self.grounded()

    def grounded(self) -> None:
        """A flight ended without leading what waits (it never took off, or failed): the
        members waiting run alone when no other flight will lead them."""
        with _LOCK:
            self._land()
            stranded: List[_Member] = []
            if self._flights == 0:
                stranded, self._queue = self._queue, []
        for member in stranded:
            member.outcome = _ALONE
        _tell(stranded)

    def _land(self) -> None:
        """Under the lock: one flight fewer (the last one ends the group)."""
        self._flights -= 1
        if self._flights == 0 and _GROUPS.get(self._key) is self:
            del _GROUPS[self._key]

    def lead(self, batch: List[_Member]) -> None:
        """On a store thread: run the batch, set each member's outcome and tell it."""
        pending: "List[tuple[_Member, FencedBlock]]" = []
        try:
            if len(batch) == 1:
                member = batch[0]
                try:
                    value = member.context.run(
                        member.attempt.run_alone, member.fn, None, member.complete
                    )
                except BaseException as error:
                    member.finish(_FAILED, error)
                else:
                    member.finish(_DONE, value)
            else:
                self._together(batch, pending)
        except Exception:  # the members it concerns run alone and meet it there
            _LOGGER.debug("a grouped fenced transaction failed: its members run alone",
                          exc_info=True)
        finally:
            # what no commit carried (a failing commit or connection): each runs alone
            self._alone(pending)
            for member in batch:
                if member.outcome == _WAITING:
                    member.outcome = _ALONE
            _tell(batch)

    def _together(
        self, batch: "List[_Member]", pending: "List[tuple[_Member, FencedBlock]]"
    ) -> None:
        """Run the members in one transaction on one connection, then commit. A member that
        ran is in ``pending`` until the commit lands (then it is done)."""
        port = batch[0].attempt.host.port
        with port.transaction() as conn:
            driver = library_of(type(conn))
            if driver not in _SAVEPOINT_DRIVERS:
                return  # no savepoints here: all run alone
            cursor = conn.cursor()
            try:
                for number, member in enumerate(batch):
                    try:
                        block = member.attempt.open_block(member.complete)
                    except BaseException as error:  # nothing was opened
                        member.finish(_FAILED, error)
                        continue
                    savepoint = f"{_SAVEPOINT}_{number}"
                    # psycopg2 sends the savepoint with the ownership check, one round trip
                    check = _SavepointFirst(conn, savepoint) if driver == "psycopg2" else None
                    try:
                        if check is None:
                            cursor.execute(savepoint)
                        member.value = member.context.run(block.run, member.fn, conn, check)
                        if check is not None and not check.sent:
                            # the check bypassed the savepoint: it could not be undone alone
                            raise _Unguarded
                    except _Unguarded:
                        block.end()
                        raise
                    except BaseException as error:
                        if transaction_ended(conn) is not None:
                            # its block ended the shared transaction itself
                            block.end()
                            member.finish(_FAILED, error)
                            self._escaped(pending)
                            return
                        try:
                            if check is None or check.sent:  # else nothing of it was sent
                                cursor.execute(f"ROLLBACK TO {savepoint}")
                        finally:
                            block.end()
                            member.finish(_FAILED, error)
                        continue
                    pending.append((member, block))
            finally:
                try:
                    cursor.close()
                except Exception:  # a broken connection: the commit reports it
                    pass
        self._committed(pending)

    @staticmethod
    def _alone(pending: "List[tuple[_Member, FencedBlock]]") -> None:
        """End the blocks of members no commit carried: each runs again alone."""
        for member, block in pending:
            try:
                block.end()
            finally:
                member.finish(_ALONE)
        pending.clear()

    def _escaped(self, pending: "List[tuple[_Member, FencedBlock]]") -> None:
        """A member's block ended the shared transaction itself (a cursor's ``COMMIT`` or
        ``ROLLBACK``): what the members before it wrote was committed or rolled back with
        it. A completion made at a block's start tells which. Committed: they are done.
        Rolled back, or nothing tells: undo what escaped of the fence's own (completions,
        outbox calls), then each runs again alone (its own writes may then land twice, as
        after any escape)."""
        landed: Optional[bool] = None
        for _member, block in pending:
            try:
                landed = block.landed_with_escape()
            except Exception:  # nothing tells: each runs again alone
                _LOGGER.warning("fenced transactions: could not tell whether a group's "
                                "transaction ended by its block committed", exc_info=True)
                landed = None
                break
            if landed is not None:
                break
        if landed:
            self._committed(pending)
            return
        for _member, block in pending:
            block.raised()
        self._alone(pending)

    @staticmethod
    def _committed(pending: "List[tuple[_Member, FencedBlock]]") -> None:
        """The commit carrying ``pending`` landed: each member is done."""
        done, pending[:] = list(pending), []
        for member, block in done:
            try:
                member.context.run(block.committed)
            except BaseException as error:
                member.finish(_FAILED, error)
            else:
                member.finish(_DONE, member.value)
            finally:
                block.end()


async def run_grouped(
    attempt: "Attempt", fn: Callable[[Any], T], complete: bool, off_loop: OffLoop
) -> T:
    """Run ``fn`` in a fenced transaction of ``attempt`` on the store's own connection: alone
    on a store thread (``off_loop``) when a flight is free, else in the next group, waiting
    on the event loop meanwhile. Returns ``fn``'s result.

    Raises:
        OwnershipLost: As :meth:`Attempt.transaction`.
        AttemptFinished: As :meth:`Attempt.transaction`.
        TransactionEnded: As :meth:`Attempt.transaction`.
        UsageError: ``fn`` returned an awaitable.
    """
    key = id(attempt.host.port)
    member: Optional[_Member] = None
    with _LOCK:
        group = _GROUPS.get(key)
        if group is None:
            group = _GROUPS[key] = TransactionGroup(key)
        elif not group.take_off():
            import asyncio

            member = _Member(attempt, fn, complete, asyncio.get_running_loop())
            group.wait(member)
    if member is None:  # today's path: a transaction of its own at once

        def first() -> T:
            try:
                result: T = attempt.run_alone(fn, None, complete)
                return result
            finally:  # on this thread: the members waiting start at once
                group.relay()

        result: T = await off_loop(first)
        return result
    await member.future
    if member.outcome == _ALONE:
        alone: T = await off_loop(lambda: attempt.run_alone(fn, None, complete))
        return alone
    done: T = member.result()
    return done


def queued(port: object) -> int:
    """How many calls on ``port`` wait for the next group (0: none, or none in flight)."""
    with _LOCK:
        group = _GROUPS.get(id(port))
        return 0 if group is None else len(group._queue)


def in_flight(port: object) -> int:
    """How many transactions on ``port`` are in flight (alone or leading a group)."""
    with _LOCK:
        group = _GROUPS.get(id(port))
        return 0 if group is None else group._flights
