"""The PostgreSQL server's CPU time spent for the benchmark: its backends' CPU, from ``/proc``.

``pg_stat_statements`` would give the server's time per statement, but it needs
``shared_preload_libraries`` (a server restart). Without it, the cost a bot puts on the server
is the CPU time of the backend processes serving its connections. The harness gives every run a
private database (``create_bench_database``), so the bot's backends are exactly the client
backends of that database (``pg_stat_activity``); with the server on this machine their CPU
time is in ``/proc/<pid>/schedstat`` (nanoseconds on the CPU; ``/proc/<pid>/stat``'s
utime+stime, in clock ticks, as a fallback).

What this leaves out, on purpose: the server's shared processes (WAL writer, checkpointer,
background writer, autovacuum) also work for the benchmark's writes, but they work for every
database of the server, which other sessions may be using; and the time spent waiting for I/O
(``fsync`` at commit), which is not CPU.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

from _common import pg_connect

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_ns(pid: int) -> Optional[int]:
    """CPU time of process ``pid`` so far in nanoseconds, or None (no such local process)."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // _CLK_TCK
    except (OSError, ValueError, IndexError):
        return None


def _is_local_postgres(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().startswith(b"postgres")
    except OSError:
        return False


class BackendCpu:
    """Snapshots of the CPU time of the client backends connected to one database.

    ``snapshot()`` reads the backends' pids from ``pg_stat_activity`` over a connection to the
    admin database (so the reading backend is never one of them) and their CPU time from
    ``/proc``. :meth:`delta` of two snapshots is the CPU the backends spent in between; a
    backend that appeared in between counts from zero (its start-up is in the figure), one that
    left in between is lost (counted in ``gone``; the stores keep their connections open, so
    normally none leaves).
    """

    def __init__(self, admin_dsn: str, dbname: str) -> None:
        self.admin_dsn = admin_dsn
        self.dbname = dbname
        self.problem: Optional[str] = None
        self._conn: Any = None

    @classmethod
    def for_run(cls, cfg: Dict[str, Any]) -> Optional["BackendCpu"]:
        """The probe of a harness row (``admin_dsn``, ``bench_db``), or None when the database
        is not the run's own (its backends would include other sessions')."""
        admin, db = cfg.get("admin_dsn"), cfg.get("bench_db")
        if not admin or not db or not str(db).startswith("ptb_fence_bench_"):
            return None
        return cls(admin, db)

    def snapshot(self) -> Optional[Dict[int, int]]:
        """``{pid: cpu ns}`` of the database's client backends, or None (``problem`` says why)."""
        if self.problem is not None:
            return None
        try:
            if self._conn is None or self._conn.closed:
                self._conn = pg_connect(self.admin_dsn)
            with self._conn.cursor() as cur:
                cur.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s "
                    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                    (self.dbname,),
                )
                pids = [int(row[0]) for row in cur.fetchall()]
        except Exception as exc:
            self.problem = f"pg_stat_activity not readable ({type(exc).__name__})"
            return None
        result: Dict[int, int] = {}
        for pid in pids:
            cpu = process_cpu_ns(pid)
            if cpu is None or not _is_local_postgres(pid):
                self.problem = (
                    f"backend {pid} is not a local process readable in /proc (the server is on "
                    "another machine or in another PID namespace)"
                )
                return None
            result[pid] = cpu
        return result

    @staticmethod
    def delta(before: Dict[int, int], after: Dict[int, int]) -> Tuple[int, int, int, int]:
        """``(cpu ns, backends at the end, backends new in between, backends gone)``."""
        total = 0
        for pid, cpu in after.items():
            total += cpu - before.get(pid, 0)
        new = sum(1 for pid in after if pid not in before)
        gone = sum(1 for pid in before if pid not in after)
        return total, len(after), new, gone

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None
