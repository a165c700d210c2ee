"""Smoke test of the benchmark harness (benchmarks/run.py) at tiny settings.

Runs the real harness as a subprocess, as a user would, on a subset of rows with a few hundred
updates and one run each, and checks that the table is printed with numbers, that the counts
and the targets section are there, and that the JSON results are consistent. pgqueuer is not
run here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any, Dict, List

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "benchmarks", "run.py")
_RATE = re.compile(r"^([0-9][0-9,]*) \(([0-9][0-9,]*)-([0-9][0-9,]*)\)")


def _harness(args: List[str], env_extra: Dict[str, str], timeout: float = 120) -> "subprocess.CompletedProcess[str]":
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, RUN, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env=env,
    )


def _row(out: str, name: str) -> str:
    for line in out.splitlines():
        if line.startswith(name + " "):
            return line[len(name):].strip()
    raise AssertionError(f"row {name} missing from the output:\n{out}")


def test_list_and_unknown_rows() -> None:
    listed = _harness(["--list"], {}, timeout=30)
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    for name in ("plain-32", "fenced-pg-32", "naive-pg-32", "pgqueuer-32", "poll-fenced-pg-32",
                 "lease-sqlite", "backlog-pg", "jobs-memory", "jobs-sqlite", "jobs-pg"):
        assert name in names
    bad = _harness(["--only", "no-such-row"], {}, timeout=30)
    assert bad.returncode != 0
    assert "no row matches" in bad.stderr


def test_quick_harness_prints_the_table_with_numbers(pg_dsn: str, tmp_path: Any) -> None:
    results_file = tmp_path / "results.json"
    proc = _harness(
        [
            "--only", "plain-32,fenced-sqlite-32,fenced-pg-32,lease-sqlite",
            "--updates", "300", "--runs", "1", "--warmup", "0", "--latency-seconds", "0.5",
            "--lease-sizes", "1,100", "--json", str(results_file),
        ],
        {"PTB_FENCE_POSTGRES_DSN": pg_dsn},
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    assert re.search(r"\d+ cores", out), out
    assert "THROUGHPUT" in out and "TARGETS" in out and "LEASE RENEWAL" in out

    for name in ("plain-32", "fenced-sqlite-32", "fenced-pg-32"):
        cells = _row(out, name)
        assert "FAILED" not in cells and "skipped" not in cells, cells
        match = _RATE.match(cells)
        assert match, cells
        assert float(match.group(1).replace(",", "")) > 0

    # ratios and counts are numbers on the ptb_fence rows
    fenced = _row(out, "fenced-pg-32").split()
    assert re.fullmatch(r"\d+\.\d\d", fenced[2]), fenced  # x plain
    assert re.fullmatch(r"\d+\.\d\d/\d+\.\d\d", fenced[4]), fenced  # latency p50/p99

    results = json.loads(results_file.read_text())["results"]
    for name in ("fenced-sqlite-32", "fenced-pg-32"):
        result = results[name]
        assert result["handled"] == 300
        assert result["commits_per_update"] > 0
        assert result["statements_per_update"] > 0
        assert result["store_calls_per_update"] > 0
        assert result["latency"]["n"] >= 5
    assert results["plain-32"]["commits_per_update"] == 0
    # server-side commits were read from pg_stat_database for the PostgreSQL row
    assert results["fenced-pg-32"]["server_commits_per_update"] is not None
    lease = results["lease-sqlite"]["lease"]
    assert [item["active"] for item in lease] == [1, 100]
    assert all(item["owner_lost"] == 0 for item in lease)

    targets = out[out.index("TARGETS"):]
    assert re.search(r"(PASS|FAIL)  fenced SQLite", targets), targets
    assert re.search(r"(PASS|FAIL)  lease renewal", targets), targets
    assert "SKIP  fenced PG conc-32 >= 5x naive (fenced-pg-32)" in targets  # naive-pg-32 not run


POLL_ROWS = (
    "poll-plain-32", "poll-plain-fakebotapi-32", "poll-naive-sqlite-32", "poll-naive-pg-32",
    "poll-fenced-sqlite-32", "poll-fenced-pg-32", "poll-fenced-write-sqlite-32",
    "poll-fenced-write-pg-32",
)


def test_polling_rows_measure_cpu_against_the_fast_server(pg_dsn: str, tmp_path: Any) -> None:
    """Every polling row runs, prints its CPU us/update next to plain PTB's, and the CPU
    targets are checked as ratios of rows of the same run."""
    results_file = tmp_path / "results.json"
    proc = _harness(
        ["--only", ",".join(POLL_ROWS), "--poll-updates", "200", "--runs", "1", "--warmup", "0",
         "--json", str(results_file)],
        {"PTB_FENCE_POSTGRES_DSN": pg_dsn}, timeout=240,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    assert "POLLING" in out and "pre-serialised getUpdates pages" in out, out
    results = json.loads(results_file.read_text())["results"]
    assert results["poll-plain-32"]["paired_plain"] is None  # the plain row is its own baseline
    for name in POLL_ROWS:
        cells = _row(out, name)
        assert "FAILED" not in cells and "skipped" not in cells, cells
        assert _RATE.match(cells), cells
        result = results[name]
        assert result["handled"] == 200
        assert result["cpu_us_per_update"] > 0
        assert result["server_cpu_us_per_update"] is not None  # the server's own process
        fields = cells.split()
        # upd/s, (min-max), x plain, plain upd/s, CPU us/u of the row, CPU us/u of plain PTB
        assert fields[4] == f"{result['cpu_us_per_update']:.0f}", cells
        if name == "poll-plain-32":
            assert fields[5] == fields[4], cells
            continue
        # the row's runs alternated with plain PTB polling runs in its process
        paired = result["paired_plain"]
        assert len(paired["ratios"]) == 1 and paired["cpu_us_per_update"] > 0
        assert fields[2] == f"{paired['ratio_median']:.2f}", cells
        assert fields[3] == f"{paired['median']:,.0f}", cells
        assert fields[5] == f"{paired['cpu_us_per_update']:.0f}", cells
    for name in ("poll-fenced-sqlite-32", "poll-fenced-pg-32", "poll-fenced-write-sqlite-32",
                 "poll-fenced-write-pg-32", "poll-naive-sqlite-32", "poll-naive-pg-32"):
        assert results[name]["commits_per_update"] > 0, name
    assert results["poll-plain-32"]["commits_per_update"] == 0

    targets = out[out.index("TARGETS"):]
    for goal in (
        "fenced write PG polling >= 0.35x plain PTB polling no-op",
        "fenced write PG polling >= 2.5x naive PG polling",
        "fenced write PG polling: bot CPU <= 500 us/update",
        "fenced write SQLite polling >= 0.45x plain PTB polling no-op",
        "fenced no-op pg polling >= 0.8x plain PTB polling no-op",
        "fenced no-op sqlite polling >= 0.8x plain PTB polling no-op",
        "fenced no-op pg polling: <= 1 commit per 20 updates",
        "fenced no-op sqlite polling: <= 1 commit per 20 updates",
    ):
        assert re.search(r"(PASS|FAIL)  \[14\] " + re.escape(goal), targets), (goal, targets)
    assert "SKIP  [14] backlog after a restart, no-op, pg" in targets  # backlog-pg not run
    for goal in (
        "fenced no-op pg polling >= 0.6x plain PTB polling no-op",
        "fenced no-op sqlite polling >= 0.6x plain PTB polling no-op",
        "fenced no-op pg polling: ptb_fence adds <= 80 us CPU/update",
        "fenced no-op sqlite polling: ptb_fence adds <= 80 us CPU/update",
        "fenced write PG polling >= 0.25x plain PTB polling no-op",
        "fenced write PG polling >= 2x naive PG polling",
    ):
        assert re.search(r"(PASS|FAIL)  \[36\] " + re.escape(goal), targets), (goal, targets)
    assert re.search(r"(PASS|FAIL)  \[24\] fenced no-op pg polling: ptb_fence adds <= 120 us", targets)


def test_burst_and_backlog_write_rows(pg_dsn: str, tmp_path: Any) -> None:
    """The webhook-burst row (32 producers putting at once) and the fenced-write backlog row
    run, count every update once, and their targets are checked."""
    results_file = tmp_path / "results.json"
    proc = _harness(
        ["--only", "plain-32,burst-fenced-sqlite-32,backlog-write-sqlite", "--updates", "300",
         "--runs", "1", "--warmup", "0", "--latency-seconds", "0", "--backlog", "300",
         "--json", str(results_file)],
        {"PTB_FENCE_POSTGRES_DSN": pg_dsn}, timeout=240,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    results = json.loads(results_file.read_text())["results"]
    burst = results["burst-fenced-sqlite-32"]
    assert burst["handled"] == 300
    # puts that arrive together are recorded together: fewer commits than updates
    assert 0 < burst["commits_per_update"] < 1.0, burst["commits_per_update"]
    assert _RATE.match(_row(out, "burst-fenced-sqlite-32")), out
    backlog = results["backlog-write-sqlite"]["backlog"]
    assert backlog["updates"] == 300 and backlog["handled"] == 300
    assert backlog["store_calls_per_update"]["complete_owned"] == 1.0  # one fenced write each
    targets = out[out.index("TARGETS"):]
    assert "backlog after a restart, fenced write, sqlite: >= 1,000 upd/s: 300 updates" in targets
    assert "SKIP  [14] webhook burst, 32 producers, fenced PG" in targets  # the pg row not run


def test_fenced_persistence_runs_alternate_with_runs_without_persistence(tmp_path: Any) -> None:
    """The FencedPersistence goal reads ratios of runs made one after the other in one process
    (each run of the row next to a run of the bot without persistence), and prints the ratio
    of the two rows' medians beside it."""
    results_file = tmp_path / "results.json"
    proc = _harness(
        ["--only", "poll-conv-fenced-sqlite-32,poll-conv-none-sqlite-32", "--poll-updates",
         "200", "--runs", "2", "--warmup", "0", "--latency-seconds", "0",
         "--json", str(results_file)],
        {}, timeout=240,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    results = json.loads(results_file.read_text())["results"]
    assert results["poll-conv-none-sqlite-32"]["paired_rows"] is None  # the baseline itself
    fenced = results["poll-conv-fenced-sqlite-32"]
    paired = fenced["paired_rows"]
    assert paired["kind"] == "poll-conv-none"
    assert len(paired["rates"]) == 2 and all(rate > 0 for rate in paired["rates"])
    assert paired["ratios"] == pytest.approx(
        [rate / base for rate, base in zip(fenced["rates"], paired["rates"])]
    )
    assert paired["ratio_median"] == pytest.approx(sum(paired["ratios"]) / 2)
    line = next(line for line in out.splitlines()
                if "[22] FencedPersistence sqlite polling >= 0.7x" in line)
    assert line.lstrip().startswith(("PASS", "FAIL")), line
    assert f"median of 2 paired ratios {paired['ratio_median']:.2f}x" in line, line
    assert "the two rows' medians: poll-conv-fenced-sqlite-32" in line, line


def test_jobs_rows_run_every_job_once_and_check_the_37_targets(pg_dsn: str, tmp_path: Any) -> None:
    """The durable jobs rows schedule one-off jobs with run_once, run each once through a real
    Application, and print their lateness, commits per job and the [37] targets."""
    results_file = tmp_path / "results.json"
    proc = _harness(
        ["--quick", "--only", "jobs-*", "--jobs", "200", "--jobs-window", "2",
         "--json", str(results_file)],
        {"PTB_FENCE_POSTGRES_DSN": pg_dsn}, timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    assert "JOBS: one-off durable jobs" in out, out
    results = json.loads(results_file.read_text())["results"]
    for store in ("memory", "sqlite", "pg"):
        result = results[f"jobs-{store}"]
        assert "error" not in result and "skipped" not in result, result
        assert result["jobs"] == 200 and result["ran_once"], result
        assert result["attempts"] == {"1": 200} and result["jobs_left"] == 0, result
        assert 0 < result["lateness_ms"]["p50"] <= result["lateness_ms"]["p99"], result
        assert result["runs_s"] > 0 and result["sweep"] == 1.0
    assert results["jobs-memory"]["commits_per_job"] is None  # no driver to count at
    for store in ("sqlite", "pg"):
        result = results[f"jobs-{store}"]
        assert result["domain"] == {"rows": 200, "tags": 200}, result
        assert result["schedule_commits_per_job"] == pytest.approx(1.0, abs=0.05), result
        # runs due together are fired, claimed and completed in groups
        assert 0 < result["commits_per_job"] < 1, result
    targets = out[out.index("TARGETS"):]
    for store in ("sqlite", "pg"):
        assert f"PASS  [37] every job ran exactly once (jobs-{store})" in targets, targets
        assert re.search(rf"(PASS|FAIL)  \[37\] lateness p99 <= sweep_every_seconds \+ 1 s "
                         rf"\(jobs-{store}\): p99 [0-9.]+ s, p50 [0-9.]+ s \(sweep 1 s", targets)
    assert "PASS  [37] commits per job < 1, runs due together grouped (jobs-pg)" in targets
    assert "INFO  [37] commits per job < 1, runs due together grouped (jobs-sqlite)" in targets
