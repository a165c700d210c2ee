"""Counts the steps a polled update takes through asyncio and whose Python code runs for it.

Counted, not timed: the polling bot of ``instructions.py`` (a real ``Application`` polling the
fast fake Bot API, 200 chats, ``max_concurrent=32``) runs once per row with a
``sys.setprofile`` hook that counts the asyncio futures, tasks and event-loop callbacks made
(and who asked for them), and once with a ``sys.settrace`` hook that counts the Python lines
run per package, and once (not slowed down) with a ``gc.callbacks`` hook that counts the
garbage collector's passes per generation, their time and the objects it tracks when a full
pass starts. Each figure is the run's total over its updates (start-up included), per
update. The hooks slow the bot down some 50 times, so what depends on timing (how many
updates share a grouped store call) is not what it is at full speed; what an update does on
its own is::

    python benchmarks/steps.py                        # plain and fenced-sqlite, ~3 min
    python benchmarks/steps.py --only plain,conv-none,conv-fenced --who
    python benchmarks/steps.py --updates 20000         # the collector over a long feed

Rows as in ``instructions.py``. ``--who`` also lists, per row, who asked for the futures,
tasks and callbacks (the innermost frame outside asyncio).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
from typing import Any, Callable, Counter, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import instructions  # noqa: E402  (the bot and its rows)

_ASKED = ("create_future", "create_task", "call_soon")
_PACKAGES = (("/ptb_fence/", "ptb_fence"), ("/telegram/", "python-telegram-bot"),
             ("/asyncio/", "asyncio"))


def _frame_name(frame: Any) -> str:
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{getattr(code, 'co_qualname', code.co_name)}"


def _count_asks(row: str, count: int, dsn: Optional[str]) -> Dict[str, Any]:
    asks: Counter[str] = collections.Counter()
    who: Counter[str] = collections.Counter()

    def hook(frame: Any, event: str, arg: Any) -> None:
        # the event loop's own methods only (asyncio.create_task calls the loop's: one task)
        if event != "call" or frame.f_code.co_name not in _ASKED:
            return
        if not frame.f_code.co_filename.endswith(os.path.join("asyncio", "base_events.py")):
            return
        caller = frame.f_back
        while caller is not None and "/asyncio/" in caller.f_code.co_filename:
            caller = caller.f_back
        asks[frame.f_code.co_name] += 1
        who[f"{frame.f_code.co_name} <- {'-' if caller is None else _frame_name(caller)}"] += 1

    _run_bot_under(threading.setprofile, sys.setprofile, hook, row, count, dsn)
    return {"asks": dict(asks), "who": dict(who)}


def _count_lines(row: str, count: int, dsn: Optional[str]) -> Dict[str, Any]:
    lines: Counter[str] = collections.Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        path = frame.f_code.co_filename
        package = next((name for marker, name in _PACKAGES if marker in path), None)
        if package is None:
            return None
        lines[package] += 1

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line":
                lines[package] += 1
            return local

        return local

    _run_bot_under(threading.settrace, sys.settrace, tracer, row, count, dsn)
    return {"lines": dict(lines)}


def _count_gc(row: str, count: int, dsn: Optional[str]) -> Dict[str, Any]:
    import gc
    import time

    passes: Counter[str] = collections.Counter()
    seconds: Dict[str, float] = collections.defaultdict(float)
    heaps: List[int] = []
    started = [0.0]

    def hook(phase: str, info: Dict[str, Any]) -> None:
        generation = str(info["generation"])
        if phase == "start":
            if generation == "2":
                heaps.append(len(gc.get_objects()))
            started[0] = time.perf_counter()
        else:
            passes[generation] += 1
            seconds[generation] += time.perf_counter() - started[0]

    gc.callbacks.append(hook)
    try:
        instructions._child(row, count, dsn)
    finally:
        gc.callbacks.remove(hook)
    return {"gc": {"passes": dict(passes), "seconds": dict(seconds), "heaps": heaps}}


def _run_bot_under(
    for_threads: Callable[[Any], None], for_this: Callable[[Any], None], hook: Any,
    row: str, count: int, dsn: Optional[str],
) -> None:
    """Run the bot of ``row`` with ``hook`` set in this thread and every thread it starts."""
    for_threads(hook)
    for_this(hook)
    try:
        instructions._child(row, count, dsn)
    finally:
        for_this(None)
        for_threads(None)


def _run(kind: str, row: str, count: int, dsn: str) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, row, str(count),
           "--dsn", dsn]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{row} ({kind}) failed:\n{done.stderr[-2000:]}")
    result: Dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="plain,fenced-sqlite",
                        help=f"comma-separated rows of {', '.join(instructions.ROWS)}")
    parser.add_argument("--updates", type=int, default=1800)
    parser.add_argument("--who", action="store_true", help="who asked, per row")
    parser.add_argument("--gc-only", action="store_true",
                        help="only the garbage collector's figures (no slow hooked runs)")
    parser.add_argument("--dsn", default=os.environ.get(
        "PTB_FENCE_POSTGRES_DSN", "host=127.0.0.1 user=postgres dbname=test"))
    parser.add_argument("--child", nargs=3, metavar=("KIND", "ROW", "COUNT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, row, count = args.child[0], args.child[1], int(args.child[2])
        counter = {"asks": _count_asks, "lines": _count_lines, "gc": _count_gc}[kind]
        counted = counter(row, count, args.dsn)
        print(json.dumps(counted))
        return 0
    rows = [r.strip() for r in args.only.split(",") if r.strip()]
    unknown = [r for r in rows if r not in instructions.ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}: choose from {', '.join(instructions.ROWS)}")
    n = args.updates
    kinds = ("gc",) if args.gc_only else ("asks", "lines", "gc")
    results: Dict[str, Dict[str, Any]] = {row: {} for row in rows}
    for row in rows:
        for kind in kinds:
            results[row].update(_run(kind, row, n, args.dsn))
    git = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip() or "?"
    import ptb_fence  # which checkout the children import (PYTHONPATH may point at another)

    print(f"per polled update ({n} updates per run, start-up included; git {git}; ptb_fence "
          f"from {os.path.dirname(os.path.dirname(ptb_fence.__file__))})")
    header = f"{'':38}" + "".join(f"{row:>16}" for row in rows)
    print(header)
    for label, section, key in () if args.gc_only else (
        ("asyncio futures made", "asks", "create_future"),
        ("tasks made", "asks", "create_task"),
        ("event-loop callbacks (call_soon)", "asks", "call_soon"),
        ("lines of asyncio's Python code", "lines", "asyncio"),
        ("lines of ptb_fence's Python code", "lines", "ptb_fence"),
        ("lines of PTB's Python code", "lines", "python-telegram-bot"),
    ):
        print(f"{label:38}" + "".join(
            f"{results[row][section].get(key, 0) / n:16,.2f}" for row in rows))
    print("\nthe garbage collector, per polled update (a run without hooks but this one)")
    print(f"{'':38}" + "".join(f"{row:>16}" for row in rows))
    for generation in ("0", "1", "2"):
        print(f"{f'passes of generation {generation} (per 1,000)':38}" + "".join(
            f"{results[row]['gc']['passes'].get(generation, 0) * 1000 / n:16,.2f}"
            for row in rows))
    print(f"{'its time, all generations (us)':38}" + "".join(
        f"{sum(results[row]['gc']['seconds'].values()) * 1e6 / n:16,.1f}" for row in rows))
    print(f"{'objects tracked at a full pass, max':38}" + "".join(
        f"{max(results[row]['gc']['heaps'], default=0):16,}" for row in rows))
    if args.who and not args.gc_only:
        for row in rows:
            print(f"\n{row}: who asked (per update)")
            who: List[Any] = sorted(results[row]["who"].items(), key=lambda kv: -kv[1])
            for name, count in who[:20]:
                print(f"  {count / n:6.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
