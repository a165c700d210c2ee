"""Shared pieces of the benchmark harness: counting, completion tracking, RSS, PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import resource
import sqlite3
import threading
import time
import uuid
from collections import Counter
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, cast

import psycopg2
import psycopg2.extensions

from ptb_fence import Completed
from ptb_fence.testing import make_message_update

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BATCH = 100
"""Updates per ingest batch (PTB's getUpdates limit)."""
CHATS = 1000
"""Distinct chats the synthetic updates are spread over (round robin)."""

_REAL_SQLITE_CONNECT = sqlite3.connect
_REAL_PG_CONNECT = psycopg2.connect


def pg_dsn() -> str:
    """The PostgreSQL DSN (``PTB_FENCE_POSTGRES_DSN`` or the local default)."""
    return os.environ.get("PTB_FENCE_POSTGRES_DSN", DEFAULT_DSN)


def pg_connect(dsn: str, *, autocommit: bool = True) -> Any:
    """A harness connection (never counted by :class:`DriverCounter`)."""
    conn = _REAL_PG_CONNECT(dsn, connect_timeout=5)
    conn.autocommit = autocommit
    return conn


def sqlite_connect(path: str) -> sqlite3.Connection:
    """A harness SQLite connection (never counted by :class:`DriverCounter`)."""
    return _REAL_SQLITE_CONNECT(path, timeout=30, isolation_level=None)


def pg_problem(dsn: str) -> Optional[str]:
    """Why PostgreSQL cannot be used, or None."""
    try:
        pg_connect(dsn).close()
    except Exception as exc:
        return f"PostgreSQL not reachable ({type(exc).__name__}: {str(exc).strip()[:120]})"
    return None


def dsn_for_database(dsn: str, dbname: str) -> str:
    """``dsn`` with its database replaced by ``dbname``."""
    params = psycopg2.extensions.parse_dsn(dsn)
    params["dbname"] = dbname
    return str(psycopg2.extensions.make_dsn(**params))


def database_of(dsn: str) -> str:
    """The database name a DSN connects to."""
    conn = pg_connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_database()")
            return str(cur.fetchone()[0])
    finally:
        conn.close()


def create_bench_database(admin_dsn: str) -> Tuple[str, str, Optional[str]]:
    """Create a private database for one harness run.

    Returns ``(dsn, dbname, note)``. A private database makes ``pg_stat_database.xact_commit``
    count only this harness's transactions. If it cannot be created, the DSN's own database is
    used and ``note`` says so.
    """
    name = "ptb_fence_bench_" + uuid.uuid4().hex[:10]
    try:
        conn = pg_connect(admin_dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
    except Exception as exc:
        note = (
            f"could not create a private database ({type(exc).__name__}); server-side commit "
            "counts are database-wide and may include other sessions"
        )
        return admin_dsn, database_of(admin_dsn), note
    return dsn_for_database(admin_dsn, name), name, None


def drop_bench_database(admin_dsn: str, name: str) -> None:
    """Drop a database made by :func:`create_bench_database`."""
    if not name.startswith("ptb_fence_bench_"):
        return
    conn = pg_connect(admin_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


def drop_tables(dsn: str, *tables: str) -> None:
    """``DROP TABLE IF EXISTS`` each table (harness connection)."""
    conn = pg_connect(dsn)
    try:
        with conn.cursor() as cur:
            for table in tables:
                cur.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
    finally:
        conn.close()


def server_commits(
    admin_dsn: Optional[str], dbname: Optional[str], *, settle: float = 0.1
) -> Optional[int]:
    """``pg_stat_database.xact_commit`` of ``dbname``, read from the admin database.

    Backends flush their statistics when they exit (the stores are closed before this is
    called) or after about a second of idleness; the value is read until it stops changing
    (bounded to ~1.5 s). None when it cannot be read.
    """
    if not admin_dsn or not dbname:
        return None
    try:
        conn = pg_connect(admin_dsn)
    except Exception:
        return None
    try:
        last: Optional[int] = None
        deadline = time.monotonic() + 1.5
        while True:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_stat_force_next_flush()")
                cur.execute("SELECT pg_stat_clear_snapshot()")
                cur.execute(
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,)
                )
                row = cur.fetchone()
            value = None if row is None else int(row[0])
            if value is not None and value == last:
                return value
            if time.monotonic() > deadline:
                return value
            last = value
            time.sleep(settle)
    except Exception:
        return None
    finally:
        conn.close()


# -- driver-level counting ----------------------------------------------------------------------
class DriverCounter:
    """Counts SQL statements and commits at the database driver (sqlite3 and psycopg2).

    :func:`install` replaces ``sqlite3.connect`` and ``psycopg2.connect`` in this (child)
    process by wrappers: every SQLite connection gets a trace callback (it sees each statement
    the library runs: ``BEGIN``, ``COMMIT``, ``PRAGMA`` and the rest), every psycopg2
    connection is a subclass that counts ``cursor.execute`` / ``executemany`` calls and
    ``commit()``. Harness connections (:func:`pg_connect`, :func:`sqlite_connect`) are not
    counted. The library itself is untouched.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.statements = 0
        self.commits = 0
        self.begins = 0
        self.rollbacks = 0
        self.other = 0  # PRAGMA and trigger comments (SQLite)
        self.installed = False

    def reset(self) -> None:
        with self._lock:
            self.statements = self.commits = self.begins = self.rollbacks = self.other = 0

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return {
                "statements": self.statements,
                "commits": self.commits,
                "begins": self.begins,
                "rollbacks": self.rollbacks,
                "other": self.other,
            }

    def sql(self, text: str) -> None:
        head = text.lstrip()[:10].upper()
        with self._lock:
            if head.startswith("COMMIT") or head.startswith("END"):
                self.commits += 1
            elif head.startswith("BEGIN"):
                self.begins += 1
            elif head.startswith("ROLLBACK"):
                self.rollbacks += 1
            elif head.startswith("PRAGMA") or head.startswith("--"):
                self.other += 1
            else:
                self.statements += 1

    def statement(self) -> None:
        with self._lock:
            self.statements += 1

    def commit(self) -> None:
        with self._lock:
            self.commits += 1

    def install(self) -> None:
        """Wrap the drivers' ``connect`` functions (idempotent)."""
        if self.installed:
            return
        counter = self

        def sqlite_connect_counting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn: sqlite3.Connection = _REAL_SQLITE_CONNECT(*args, **kwargs)
            conn.set_trace_callback(counter.sql)
            return conn

        class CountingCursor(psycopg2.extensions.cursor):
            def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002
                counter.statement()
                return super().execute(query, vars)

            def executemany(self, query: Any, vars_list: Any) -> Any:
                counter.statement()
                return super().executemany(query, vars_list)

        class CountingConnection(psycopg2.extensions.connection):
            def cursor(self, *args: Any, **kwargs: Any) -> Any:
                kwargs.setdefault("cursor_factory", CountingCursor)
                return super().cursor(*args, **kwargs)

            def commit(self) -> None:
                counter.commit()
                super().commit()

        def pg_connect_counting(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("connection_factory", CountingConnection)
            return _REAL_PG_CONNECT(*args, **kwargs)

        setattr(sqlite3, "connect", sqlite_connect_counting)
        setattr(psycopg2, "connect", pg_connect_counting)
        self.installed = True


# -- completion tracking ------------------------------------------------------------------------
class CompletionTracker:
    """Records when each update was completed and wakes the event loop when all are.

    ``mark`` may be called from any thread (store settles run on worker threads). With
    ``keep_times=False`` (the backlog rows) only a count is kept, so the harness itself holds
    no per-update memory while RSS is sampled (a completion lands once per update).
    """

    def __init__(self, keep_times: bool = True) -> None:
        self._lock = threading.Lock()
        self._keep = keep_times
        self.times: Dict[int, float] = {}
        self._count = 0
        self._target = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._future: Optional["asyncio.Future[None]"] = None

    def reset(self) -> None:
        with self._lock:
            self.times = {}
            self._count = 0
            self._target = 0
            self._future = None

    def mark(self, update_id: int, at: Optional[float] = None) -> None:
        at = time.perf_counter() if at is None else at
        with self._lock:
            if self._keep:
                if update_id in self.times:
                    return
                self.times[update_id] = at
            self._count += 1
            done = self._future is not None and self._count >= self._target
            loop, future = self._loop, self._future
        if done and loop is not None and future is not None:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:
                pass

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    async def wait(self, target: int, timeout: float) -> bool:
        """Wait until ``target`` updates are marked; False on timeout."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._count >= target:
                return True
            self._target = target
            self._loop = loop
            self._future = loop.create_future()
            future = self._future
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
            return True
        except asyncio.TimeoutError:
            return False


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


# -- the store proxy ----------------------------------------------------------------------------
_SETTLE_WORDS = ("settle", "complete", "commit")


def _observes(name: str) -> bool:
    return any(word in name for word in _SETTLE_WORDS)


class CountingStore:
    """A thin proxy around a store: counts calls per method, observes completions.

    Attribute lookups go to the wrapped store, so the proxy has exactly the wrapped store's
    capabilities (the runtime detects optional methods by ``getattr``). Completions are
    observed on the settle methods the library uses today: ``settle(…, Completed)``,
    ``settle_owned(identity, Completed)`` without ``connection`` (a settle inside a caller's
    transaction is only final at the caller's commit; those rows mark completion in their
    handler), and ``commit`` (per landed settlement of its batch).
    """

    def __init__(
        self, inner: Any, tracker: Optional[CompletionTracker] = None, *, exact_claims: bool = False
    ) -> None:
        self.__dict__["_inner"] = inner
        self.__dict__["_tracker"] = tracker
        self.__dict__["_calls"] = Counter()
        self.__dict__["_lock"] = threading.Lock()
        self.__dict__["_claims"] = ClaimTally(exact_claims)

    @property
    def claims(self) -> "ClaimTally":
        """The claims this proxy saw the store grant and end (the most held at once)."""
        return self.__dict__["_claims"]

    @property
    def inner(self) -> Any:
        return self.__dict__["_inner"]

    def calls(self) -> Dict[str, int]:
        with self.__dict__["_lock"]:
            return dict(self.__dict__["_calls"])

    def reset_calls(self) -> None:
        with self.__dict__["_lock"]:
            self.__dict__["_calls"].clear()

    def __repr__(self) -> str:
        return f"CountingStore({self.__dict__['_inner']!r})"

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.__dict__["_inner"], name)
        if name.startswith("_") or not callable(attr):
            return attr
        wrapped = self._wrap(name, attr)
        self.__dict__[name] = wrapped
        return wrapped

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        calls = self.__dict__["_calls"]
        lock = self.__dict__["_lock"]
        tracker: Optional[CompletionTracker] = self.__dict__["_tracker"]

        tally: ClaimTally = self.__dict__["_claims"]
        claims = tally.exact and (name in _CLAIM_GRANTS or name in _CLAIM_ENDS)
        if not claims and (tracker is None or not _observes(name)):

            def counted(*args: Any, **kwargs: Any) -> Any:
                with lock:
                    calls[name] += 1
                return fn(*args, **kwargs)

            counted.__name__ = name
            return counted

        def settled(*args: Any, **kwargs: Any) -> Any:
            with lock:
                calls[name] += 1
            if claims:
                with tally.serial:
                    result = fn(*args, **kwargs)
                    tally.observe(name, args, kwargs, result)
            else:
                result = fn(*args, **kwargs)
            if tracker is not None and _observes(name):
                _observe_settle(tracker, name, args, kwargs, result)
            return result

        settled.__name__ = name
        return settled

    def close(self) -> None:
        self.__dict__["_inner"].close()


_CLAIM_GRANTS = frozenset(
    {"commit", "claim_owned", "claim_in_chat_order"}
)
"""Store methods whose result holds the identities of claims they granted."""

_CLAIM_ENDS = frozenset(
    {"commit", "settle_owned", "release_many", "exhaust"}
)
"""Store methods that end claims (the settles that landed, the claims given back)."""


class ClaimTally:
    """The claims held in the store by the process, as seen at the store proxy: claims granted
    (identities returned) minus claims ended (settles that landed without ``connection=``,
    releases), and the most held at once (``peak``). A settle inside a caller's transaction
    (a fenced write) is not seen, so the tally only means something for no-op rows.

    Exact only with ``exact`` (the harness's ``--claims-exact``): the proxy then runs the
    store calls that grant or end claims one at a time (``serial``), so the tally follows their
    commits in order. Otherwise a claim and a settle that overlap may be tallied in the other
    order than they committed, and ``peak`` is not reported."""

    def __init__(self, exact: bool = False) -> None:
        self.held = 0
        self.peak = 0
        self.exact = exact
        self._lock = threading.Lock()
        self.serial = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.peak = self.held

    def observe(self, name: str, args: Sequence[Any], kwargs: Dict[str, Any], result: Any) -> None:
        granted = ended = 0
        if name == "commit":  # a batch store's commit: its claims and settlements in one
            granted = sum(1 for i in (*result.claimed_records, *result.claims) if i is not None)
            ended = sum(1 for landed in result.landed if landed is True)
        elif kwargs.get("connection") is None:
            if name in _CLAIM_ENDS:
                ended = _ended_count(name, args, kwargs, result)
            if name in _CLAIM_GRANTS:
                granted = _granted_count(result)
        with self._lock:
            # one commit settles, then claims: the bound holds at the commit with both
            self.held += granted - ended
            self.peak = max(self.peak, self.held)


def _granted_count(result: Any) -> int:
    values = result if isinstance(result, (list, tuple)) else [result]
    if _is_pair(result):
        values = list(result[0]) + list(result[1])
    return sum(1 for value in values if hasattr(value, "claim_id") and hasattr(value, "attempt"))


def _is_pair(result: Any) -> bool:
    return isinstance(result, tuple) and len(result) == 2 and all(
        isinstance(part, list) for part in result
    )


def _ended_count(name: str, args: Sequence[Any], kwargs: Dict[str, Any], result: Any) -> int:
    if name in ("settle_owned", "exhaust"):
        return 1 if result else 0
    if name == "release_many":
        return sum(1 for flag in result if flag) if isinstance(result, list) else 0
    for value in list(args) + list(kwargs.values()):
        pairs = _pairs(value)
        if pairs:
            flags = _landed_flags(result, len(pairs))
            return sum(1 for flag in flags or [] if flag)
    return 0


def _pairs(value: Any) -> Optional[List[Tuple[Any, Any]]]:
    """``value`` as a list of (AttemptIdentity, Settlement) pairs, or None."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        return None
    pairs = []
    for item in value:
        if not (isinstance(item, tuple) and len(item) == 2):
            return None
        identity, settlement = item
        if not hasattr(identity, "claim_id") or not hasattr(settlement, "at"):
            return None
        pairs.append((identity, settlement))
    return pairs


def _landed_flags(result: Any, n: int) -> Optional[List[bool]]:
    """The per-pair outcome list in a batched settle's result (itself, or a tuple member)."""
    candidates = [result] + (list(result) if isinstance(result, tuple) else [])
    for candidate in reversed(candidates):
        if isinstance(candidate, list) and len(candidate) == n and all(
            isinstance(x, bool) for x in candidate
        ):
            return candidate
    return None


def _observe_settle(
    tracker: CompletionTracker, name: str, args: Sequence[Any], kwargs: Dict[str, Any], result: Any
) -> None:
    now = time.perf_counter()
    if name == "commit":  # a batch store's commit: its settlements, with what landed
        batch = args[0]
        for (identity, settlement), landed in zip(batch.settlements, result.landed):
            if landed is True and isinstance(settlement, Completed):
                tracker.mark(int(identity.update_id), now)
        return
    if name == "settle":
        update_id, _attempt, settlement = (list(args) + [None] * 3)[:3]
        settlement = kwargs.get("settlement", settlement)
        update_id = kwargs.get("update_id", update_id)
        if isinstance(settlement, Completed):
            tracker.mark(int(update_id), now)
        return
    if kwargs.get("connection") is not None:
        return  # inside the caller's transaction: final only at the caller's commit
    if name == "settle_owned":
        identity: Any = args[0] if args else kwargs.get("identity")
        settlement = args[1] if len(args) > 1 else kwargs.get("settlement")
        if result and identity is not None and isinstance(settlement, Completed):
            tracker.mark(int(identity.update_id), now)
        return
    for value in list(args) + list(kwargs.values()):
        pairs = _pairs(value)
        if not pairs:
            continue
        flags = _landed_flags(result, len(pairs))
        if flags is None:
            continue
        for (identity, settlement), landed in zip(pairs, flags):
            if landed and isinstance(settlement, Completed):
                tracker.mark(int(identity.update_id), now)
        return


# -- misc ---------------------------------------------------------------------------------------
def create_domain_table(store_kind: str, table: str, *, path: str = "", dsn: str = "") -> None:
    """The fenced-write rows' domain table (one row per update: its attempt and claim id), in
    the SQLite file ``path`` or on PostgreSQL ``dsn``."""
    if store_kind == "sqlite":
        conn = sqlite_connect(path)
        try:
            conn.execute(
                f'CREATE TABLE "{table}" (update_id INTEGER PRIMARY KEY, '
                "attempt INTEGER NOT NULL, claim_id TEXT NOT NULL)"
            )
        finally:
            conn.close()
        return
    pg = pg_connect(dsn)
    try:
        with pg.cursor() as cur:
            cur.execute(
                f'CREATE TABLE "{table}" (update_id BIGINT PRIMARY KEY, '
                "attempt INT NOT NULL, claim_id TEXT NOT NULL)"
            )
    finally:
        pg.close()


def domain_write(store_kind: str, table: str) -> Callable[[Any], Callable[[Any], None]]:
    """``for_attempt(attempt) -> write(conn)``: the fenced write of the fenced-write rows, one
    INSERT of the attempt's identity into ``table`` (for ``run_in_transaction``)."""
    mark = "?" if store_kind == "sqlite" else "%s"
    sql = f'INSERT INTO "{table}" (update_id, attempt, claim_id) VALUES ({mark}, {mark}, {mark})'

    def for_attempt(attempt: Any) -> Callable[[Any], None]:
        def write(conn: Any) -> None:
            if store_kind == "sqlite":
                conn.execute(sql, (attempt.update_id, attempt.attempt, attempt.claim_id))
                return
            with conn.cursor() as cur:
                cur.execute(sql, (attempt.update_id, attempt.attempt, attempt.claim_id))

        return write

    return for_attempt


def update_dicts(count: int, first_id: int = 1, chats: int = CHATS) -> List[Dict[str, Any]]:
    """``count`` realistic message updates over ``chats`` chats (round robin), ids from ``first_id``."""
    return [
        make_message_update(first_id + i, 1 + i % chats, f"message {i}", message_id=1 + i // chats)
        for i in range(count)
    ]


def chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def current_rss_kb() -> int:
    """Resident set size now (``VmRSS``), in KiB."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_kb() -> int:
    """Peak resident set size of this process (``ru_maxrss``, KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 0.5)


# -- profiling of the measured runs -------------------------------------------------------------
class Profiler:
    """Profiles a block of the child (the measured runs only, not set-up or warm-up).

    ``cprofile``: a ``cProfile.Profile`` in the main thread and one in every thread started
    inside the block (``threading.setprofile``), merged. ``py-spy``: ``py-spy record --pid`` of
    this process for the block, raw stacks aggregated (``gil=True``: only the thread holding
    the GIL is sampled).
    """

    def __init__(self, mode: str, top: int = 30, workdir: str = "/tmp", gil: bool = False) -> None:
        self.mode = mode
        self.top = top
        self.workdir = workdir
        self.gil = gil
        self.report = ""
        self._profiles: List[Any] = []
        self._main: Any = None
        self._spy: Any = None
        self._spy_out = os.path.join(workdir, f"py-spy-{os.getpid()}.txt")

    def __enter__(self) -> "Profiler":
        if self.mode == "cprofile":
            import cProfile
            import sys

            self._main = cProfile.Profile()
            lock = threading.Lock()
            profiles = self._profiles

            def boot(frame: Any, event: str, arg: Any) -> None:
                # every thread started during the measured runs (the processors' store
                # threads are created when each run's app starts) is profiled for its life
                sys.setprofile(None)
                prof = cProfile.Profile()
                with lock:
                    profiles.append(prof)
                prof.enable()

            threading.setprofile(boot)
        elif self.mode == "py-spy":
            import shutil
            import subprocess

            exe = shutil.which("py-spy")
            if exe is None:
                raise RuntimeError("py-spy is not installed (pip install py-spy)")
            cmd = [exe, "record", "--pid", str(os.getpid()), "--format", "raw", "--rate", "250",
                   "-o", self._spy_out]
            if self.gil:
                cmd.append("--gil")
            # --nonblocking: py-spy must not stop this process to sample it. It is paused with
            # SIGSTOP outside the timed part (below), and a py-spy paused in the middle of a
            # sample left this process stopped under ptrace, unable to resume it: a --profile run
            # hung until its timeout (seen twice in a row)
            cmd.append("--nonblocking")
            self._spy = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            time.sleep(1.0)  # let py-spy attach
            self._signal("SIGSTOP")
        return self

    def _signal(self, name: str) -> None:
        import signal

        if self._spy is not None and self._spy.poll() is None:
            self._spy.send_signal(getattr(signal, name))

    def resume(self) -> None:
        """Start sampling (the timed part of a run begins)."""
        if self.mode == "cprofile":
            self._main.enable()
        elif self.mode == "py-spy":
            self._signal("SIGCONT")

    def pause(self) -> None:
        """Stop sampling (the timed part of a run ended)."""
        if self.mode == "cprofile":
            self._main.disable()
        elif self.mode == "py-spy":
            self._signal("SIGSTOP")

    def __exit__(self, *exc: Any) -> None:
        if self.mode == "cprofile":
            threading.setprofile(cast(Any, None))
            self.report = self._cprofile_report()
        elif self.mode == "py-spy" and self._spy is not None:
            self._signal("SIGCONT")
            self._signal("SIGINT")
            try:
                self._spy.wait(timeout=30)
            except Exception:
                self._spy.kill()
            self.report = py_spy_report(self._spy_out, self.top, self.gil)

    def _cprofile_report(self) -> str:
        import io
        import pstats

        out = io.StringIO()
        stats = pstats.Stats(self._main, stream=out)
        for prof in self._profiles:
            try:
                stats.add(prof)
            except Exception:
                pass
        stats.strip_dirs()
        out.write(
            f"cProfile of the measured runs, {1 + len(self._profiles)} threads merged: the event "
            f"loop thread during the timed part only, the other threads (store thread pools, "
            f"lease keeper) for their whole life (the app's start and stop included); times are "
            f"summed over threads, and a worker's wait for work counts as time\n"
            f"top {self.top} by cumulative time\n"
        )
        stats.sort_stats("cumulative").print_stats(self.top)
        out.write(f"top {self.top} by own time (tottime)\n")
        stats.sort_stats("tottime").print_stats(self.top)
        return out.getvalue()


def py_spy_report(path: str, top: int, gil: bool = False) -> str:
    """Aggregate py-spy's raw (collapsed) stacks: inclusive and own sample shares per frame."""
    inclusive: Dict[str, int] = {}
    own: Dict[str, int] = {}
    owners: Dict[str, int] = {}
    fence: Dict[str, int] = {}
    total = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                stack, _, count_text = line.rstrip("\n").rpartition(" ")
                try:
                    count = int(count_text)
                except ValueError:
                    continue
                frames = [f for f in stack.split(";") if f]
                while frames and (frames[0].startswith("thread ") or frames[0].startswith("process ")):
                    frames = frames[1:]
                if not frames:
                    continue
                total += count
                for frame in set(frames):
                    inclusive[frame] = inclusive.get(frame, 0) + count
                own[frames[-1]] = own.get(frames[-1], 0) + count
                who, frame = _innermost_owned(frames)
                owners[who] = owners.get(who, 0) + count
                if who == "ptb_fence":  # by function, its lines together
                    name, _, where = frame.partition(" (")
                    function = f"{name} ({where.rsplit(':', 1)[0]})"
                    fence[function] = fence.get(function, 0) + count
    except OSError as exc:
        return f"py-spy produced no output: {exc}"
    if not total:
        return "py-spy recorded no samples"
    what = "samples of the thread holding the GIL" if gil else "samples of active (non-idle) threads"
    lines = [f"py-spy of the measured runs: {total} {what}; top {top} inclusive"]
    for frame, count in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {count / total * 100:5.1f}%  {frame}")
    lines.append(f"top {top} own (leaf)")
    for frame, count in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {count / total * 100:5.1f}%  {frame}")
    lines.append(
        "by owner (each sample to the innermost frame of ptb_fence, python-telegram-bot or the "
        "harness's store and driver counting; the stdlib, asyncio and the drivers count for the "
        "code that called them; 'loop': asyncio's own scheduling, under none of them)"
    )
    for who, count in sorted(owners.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {count / total * 100:5.1f}%  {who}")
    lines.append(
        f"ptb_fence's share by function, top {top} (each ptb_fence sample to its innermost "
        "ptb_fence function, all its lines together, with the stdlib and driver code it called; "
        "% of all samples)"
    )
    for function, count in sorted(fence.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {count / total * 100:5.1f}%  {function}")
    return "\n".join(lines)


# py-spy names a frame "function (path:line)", the path relative to its sys.path entry; the
# harness's run.py frames are the roots of every stack (its event loop), so only its store and
# driver proxies count as its own
_OWNERS = (("(ptb_fence/", "ptb_fence"), ("(telegram/", "python-telegram-bot"),
           ("(_common.py:", "harness (store and driver counting)"),
           ("(_ptb_rows.py:", "harness (store and driver counting)"))


def _innermost_owned(frames: Sequence[str]) -> Tuple[str, str]:
    """Whose work a sample is (the innermost frame in ptb_fence, PTB or the harness) and that
    frame; ``("loop", "")`` when it is under none of them."""
    for frame in reversed(frames):
        for marker, who in _OWNERS:
            if marker in frame:
                return who, frame
    return "loop", ""
