"""Smoke test of the benchmark harness's SCALE-OUT section (``benchmarks/run.py --scale-out``).

Runs the real harness as a subprocess at tiny settings: the per-update PostgreSQL cost rows
(``poll-fenced-pg-32``, ``poll-fenced-write-pg-32``, and the naive yardstick
``poll-naive-pg-32``) and the ``scaleout-*`` rows, whose runs put
one and then two real bot processes (PTB ``Application`` + ``FencedUpdateProcessor``, each
polling a fast fake Bot API of its own) on one PostgreSQL table. Checks that every row prints
its statements, commits and PostgreSQL backend CPU per update, that the two-process runs handled
both processes' updates, and that the printed cells are the JSON results'. Throughput is not
asserted (the machine's load decides it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "benchmarks", "run.py")
UPDATES = 200


def _section(out: str) -> List[str]:
    start = out.index("SCALE-OUT:")
    lines = out[start:].splitlines()[3:]  # the title, the header, the rule
    return lines[: next(i for i, l in enumerate(lines) if l.startswith("  procs:"))]


def _cells(lines: List[str], name: str) -> List[List[str]]:
    """The cells of ``name``'s line and of the continuation lines that follow it."""
    for i, line in enumerate(lines):
        if line.startswith(name + " "):
            found = [line.split()[1:]]
            for more in lines[i + 1:]:
                if not more.startswith(" " * 27):  # the next row, or the notes ("  name: ...")
                    break
                found.append(more.split())
            return found
    raise AssertionError(f"row {name} missing from the SCALE-OUT section:\n" + "\n".join(lines))


def _check_cells(cells: List[str], figures: Dict[str, Any]) -> None:
    # procs upd/s x1 per-proc stmts/u commits/u srv-c/u PG-us/u bot-us/u bots/PG-core at-rate
    assert cells[4] == f"{figures['statements_per_update']:.2f}", cells
    assert cells[5] == f"{figures['commits_per_update']:.3f}", cells
    assert cells[7] == f"{figures['pg_cpu_us_per_update']:.0f}", cells
    assert cells[8] == f"{figures['cpu_us_per_update']:.0f}", cells
    feeds = figures["cpu_us_per_update"] / figures["pg_cpu_us_per_update"]
    assert cells[9] == f"{feeds:.1f}", cells


def test_scale_out_rows_print_postgres_cost_per_update(pg_dsn: str, tmp_path: Any) -> None:
    results_file = tmp_path / "results.json"
    env = dict(os.environ, PTB_FENCE_POSTGRES_DSN=pg_dsn)
    proc = subprocess.run(
        [sys.executable, RUN, "--scale-out", "--poll-updates", str(UPDATES), "--runs", "1",
         "--warmup", "0", "--json", str(results_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    assert "SCALE-OUT" in out, out
    results = json.loads(results_file.read_text())["results"]
    assert sorted(results) == [
        "poll-fenced-pg-32", "poll-fenced-write-pg-32", "poll-naive-pg-32",
        "scaleout-fenced-pg-32", "scaleout-fenced-write-pg-32",
    ], sorted(results)
    lines = _section(out)

    for name in ("poll-fenced-pg-32", "poll-fenced-write-pg-32", "poll-naive-pg-32"):
        result = results[name]
        assert "error" not in result, result
        assert result["handled"] == UPDATES
        assert result["pg_cpu_us_per_update"] > 0, result
        cells = _cells(lines, name)
        assert len(cells) == 1 and cells[0][0] == "1", cells
        _check_cells(cells[0], result)

    for name in ("scaleout-fenced-pg-32", "scaleout-fenced-write-pg-32"):
        result = results[name]
        assert "error" not in result, result
        assert result["processes"] == 2 and result["updates_per_process"] == UPDATES
        assert result["cores"] >= 1 and len(result["speedups"]) == 1
        one, many = result["scaleout"]["one"], result["scaleout"]["many"]
        assert [r["n"] for r in one["runs"]] == [UPDATES]
        assert [r["n"] for r in many["runs"]] == [2 * UPDATES]  # both processes' updates
        assert len(many["runs"][0]["process_rates"]) == 2
        for figures in (one, many):
            assert figures["pg_cpu_us_per_update"] > 0, figures
            assert figures["statements_per_update"] > 0 and figures["commits_per_update"] > 0
            assert figures["server_commits_per_update"] > 0
        cells = _cells(lines, name)
        assert [c[0] for c in cells] == ["1", "2"], cells
        _check_cells(cells[0], one)
        _check_cells(cells[1], many)
        assert cells[1][2] == f"{result['speedup_median']:.2f}", cells
        assert re.search(rf"  {name}: {UPDATES} updates per process, 1 pair\(s\); .* \d+ cores", out), out

    # the fenced write commits at most one transaction per update (concurrent ones share a
    # commit). The no-op batches its commits.
    for name in ("poll-fenced-write-pg-32", "scaleout-fenced-write-pg-32"):
        figures = results[name] if name.startswith("poll") else results[name]["scaleout"]["one"]
        assert 0 < figures["commits_per_update"] <= 1.1, (name, figures)
    assert results["poll-fenced-pg-32"]["commits_per_update"] < 1.0


def test_scale_processes_must_be_two_or_more() -> None:
    proc = subprocess.run(
        [sys.executable, RUN, "--scale-out", "--scale-processes", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert "--scale-processes must be at least 2" in proc.stderr


def test_scale_out_rows_cannot_be_profiled() -> None:
    """Their child only coordinates the bot processes; a profile of it would show none of them."""
    proc = subprocess.run(
        [sys.executable, RUN, "--profile", "scaleout-fenced-pg-32"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert "cannot be profiled: profile poll-fenced-pg-32" in proc.stderr
