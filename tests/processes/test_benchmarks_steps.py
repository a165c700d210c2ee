"""The counting tools of the benchmarks, run as a user runs them: ``benchmarks/steps.py`` (the
asyncio steps and Python lines per polled update) on a small run, and the per-function share
that ends the harness's py-spy report, on a raw py-spy file written here."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Dict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")


def _table(out: str, title: str = "per polled update") -> Dict[str, Dict[str, float]]:
    """The printed table that starts with the line ``title`` as ``{label: {row: value}}``."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = lines[header + 1].split()
    table: Dict[str, Dict[str, float]] = {}
    for line in lines[header + 2:]:
        if not line.strip():
            break
        label, values = line[:38].strip(), line[38:].split()
        table[label] = {row: float(v.replace(",", "")) for row, v in zip(rows, values)}
    return table


def _steps(rows: str, *options: str) -> "subprocess.CompletedProcess[str]":
    """``benchmarks/steps.py`` over 300 updates of ``rows``, as a user runs it; it succeeded."""
    done = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "steps.py"), "--only", rows,
         "--updates", "300", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_steps_counts_what_the_fence_adds_per_update() -> None:
    done = _steps("plain,fenced-sqlite", "--who")
    table = _table(done.stdout)
    futures = table["asyncio futures made"]
    # plain PTB polling makes almost none per update; the fence one per await it adds (its
    # chat's turn, its slot, its grouped claim and completion, its handler's wake-up)
    assert futures["plain"] < 0.5 and futures["fenced-sqlite"] >= 3, table
    assert table["tasks made"]["fenced-sqlite"] > table["tasks made"]["plain"] >= 0.9
    assert table["lines of ptb_fence's Python code"]["plain"] == 0
    assert table["lines of ptb_fence's Python code"]["fenced-sqlite"] > 100
    assert table["lines of PTB's Python code"]["plain"] > 100
    # Python 3.10 code objects have no co_qualname: the caller is named without its class
    enqueue = "AsyncGroupCommit.enqueue" if sys.version_info >= (3, 11) else "enqueue"
    assert f"create_future <- _group_commit.py:{enqueue}\n" in done.stdout, done.stdout
    collector = _table(done.stdout, "the garbage collector")
    # every run allocates enough for young-generation passes; a full pass finds the heap
    assert collector["passes of generation 0 (per 1,000)"]["plain"] > 0, collector
    full_passes = collector["passes of generation 2 (per 1,000)"]["fenced-sqlite"]
    if sys.version_info < (3, 13):  # 3.13's collector makes no full pass in a run this short
        assert full_passes > 0, collector
    if full_passes > 0:
        assert collector["objects tracked at a full pass, max"]["fenced-sqlite"] > 10_000, collector
    else:  # no full pass: no heap seen, and the table says so
        assert collector["objects tracked at a full pass, max"]["fenced-sqlite"] == 0, collector


def test_steps_gc_only_counts_the_collector_alone() -> None:
    done = _steps("fenced-sqlite", "--gc-only")
    assert "asyncio futures made" not in done.stdout  # no hooked runs
    collector = _table(done.stdout, "the garbage collector")
    assert set(collector) == {
        "passes of generation 0 (per 1,000)", "passes of generation 1 (per 1,000)",
        "passes of generation 2 (per 1,000)", "its time, all generations (us)",
        "objects tracked at a full pass, max",
    }, collector
    assert collector["its time, all generations (us)"]["fenced-sqlite"] > 0, collector


def test_py_spy_report_ends_with_ptb_fence_by_function(tmp_path: Any) -> None:
    sys.path.insert(0, BENCHMARKS)
    try:
        import _common
    finally:
        sys.path.remove(BENCHMARKS)
    raw = tmp_path / "raw.txt"
    raw.write_text(
        # of 10 samples: 4 in _process (on two of its lines, one under asyncio code it
        # called), 2 in PTB called from _process (PTB's), 2 in add_in under add_many (add_in's),
        # 2 in the loop alone
        "thread (1);run (asyncio/base_events.py:607);_process (ptb_fence/ptb/_processor.py:480) 3\n"
        "thread (1);_process (ptb_fence/ptb/_processor.py:494);create_task "
        "(asyncio/base_events.py:436) 1\n"
        "thread (1);_process (ptb_fence/ptb/_processor.py:480);de_json "
        "(telegram/_update.py:862) 2\n"
        "thread (2);add_many (ptb_fence/stores/sqlite/_store.py:301);add_in "
        "(ptb_fence/stores/sqlite/_writes.py:85) 2\n"
        "thread (1);run (asyncio/base_events.py:607) 2\n",
        encoding="utf-8",
    )
    report = _common.py_spy_report(str(raw), 5, gil=True)
    share = report[report.index("ptb_fence's share by function"):].splitlines()[1:]
    assert share == [
        "   40.0%  _process (ptb_fence/ptb/_processor.py)",
        "   20.0%  add_in (ptb_fence/stores/sqlite/_writes.py)",
    ], report
