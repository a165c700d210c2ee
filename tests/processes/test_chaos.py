"""The chaos runner (``python -m ptb_fence.chaos``) in its short CI configuration.

Each run drives real worker processes (real ``UpdateIntake``, real SQLite file / PostgreSQL
server) while the runner SIGKILLs, SIGSTOPs and (PostgreSQL) disconnects them and restarts the
server; the runner checks the outcome from the database and exits 0 only when nothing was lost
or written twice. The handlers charge the runner's fake payment API in a step, and the runner
checks that every update is charged at most once and no step calls its function after its
record landed. The tests assert the exit code and read the printed table. Three sabotaged runs
(a handler that writes outside the fence, a handler that drops its write, a handler that charges
again after its step) show that the runner's checks fail when they should.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_chaos(args: List[str], timeout: float, sabotage: Optional[str] = None) -> Tuple[int, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PTB_FENCE_CHAOS_SABOTAGE", None)
    if sabotage is not None:
        env["PTB_FENCE_CHAOS_SABOTAGE"] = sabotage
    proc = subprocess.run(
        [sys.executable, "-m", "ptb_fence.chaos", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    return proc.returncode, proc.stdout + proc.stderr


def parse_table(output: str) -> Dict[str, str]:
    """The final ``| metric | value |`` table as a dict."""
    table: Dict[str, str] = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 2 and cells[0] != "metric":
            table[cells[0]] = cells[1]
    assert "result" in table, f"no result table in the output:\n{output}"
    return table


def first_int(text: str) -> int:
    match = re.match(r"\s*(\d+)", text)
    assert match, f"no number in {text!r}"
    return int(match.group(1))


def check_passed(code: int, output: str, kinds: List[str]) -> Dict[str, str]:
    assert code == 0, output
    table = parse_table(output)
    assert table["result"] == "PASS", output
    assert table["lost updates"] == "0", output
    assert table["duplicate domain rows"] == "0", output
    assert first_int(table["handled (completed)"]) + first_int(table["exhaustions"]) == first_int(
        table["updates"]
    ), output
    assert first_int(table["fenced domain rows"]) == first_int(table["handled (completed)"]), output
    for kind in kinds:
        assert first_int(table[f"faults: {kind}"]) > 0, f"no {kind} fault:\n{output}"
    assert "progress" not in table
    check_payments(table, output)
    assert re.search(r"^\[\s*\d+\.\ds\] fed \d+/\d+ \|", output, re.M), output  # progress lines
    return table


def check_payments(table: Dict[str, str], output: str) -> None:
    """The payment rows of a passed run: one charge per recorded step, none twice."""
    updates = first_int(table["updates"])
    completed = first_int(table["handled (completed)"])
    charges = first_int(table["payments: charges"])
    assert "0 charged twice" in table["payments: charges"], output
    assert completed <= charges <= updates, output
    records = first_int(table["payments: step records"])
    assert completed <= records <= charges, output
    assert f"({records} charged exactly once)" in table["payments: step records"], output
    assert first_int(table["payments: requests"]) >= charges, output
    assert first_int(table["payments: step function calls"]) >= records, output
    assert "payments: requests with a reused key" in table, output
    assert "sent by calls made before the record landed" in table[
        "payments: requests after the record"], output
    assert "stale steps that read no record" in table["payments: calls after the record"], output
    assert "every update charged at most once" in output, output


COMMON_KINDS = [
    "SIGKILL worker (restarted)",
    "SIGSTOP worker > lease, SIGCONT",
    "transient handler failures",
    "always-failing handler runs",
]


@pytest.mark.timeout(150)
def test_chaos_sqlite(tmp_path: "os.PathLike[str]") -> None:
    store = "sqlite://" + os.path.join(str(tmp_path), "chaos.sqlite3")
    code, output = run_chaos(
        [
            "--store", store, "--updates", "400", "--workers", "3", "--rate", "40",
            "--fault-every", "1", "--seed", "11", "--duration-limit", "100",
        ],
        timeout=140,
    )
    table = check_passed(code, output, COMMON_KINDS)
    assert table["faults: pg_terminate_backend"].startswith("n/a"), output
    assert "PostgreSQL restart skipped: not PostgreSQL" in output, output


RESTART_OPT_IN = "PTB_FENCE_ALLOW_PG_RESTART"
"""Set to 1 to let the chaos test restart the machine's PostgreSQL (``.ci/run`` does)."""


def _restart_possible() -> bool:
    return (
        os.environ.get(RESTART_OPT_IN) == "1"
        and os.geteuid() == 0
        and shutil.which("pg_ctlcluster") is not None
        and os.path.isdir("/etc/postgresql")
    )


def _drop_run_tables(dsn: str, run_id: str) -> None:
    import psycopg2

    conn = psycopg2.connect(dsn, connect_timeout=10)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            for name in ("updates", "domain", "runs", "events", "exhaustions", "claims",
                         "updates_outbox", "updates_state", "updates_steps"):
                cur.execute(f'DROP TABLE IF EXISTS "chaos_{run_id}_{name}"')
    finally:
        conn.close()


def _postgres_back(dsn: str, timeout: float = 120.0) -> None:
    """Wait until PostgreSQL accepts connections again (later tests use it)."""
    from ptb_fence.chaos._runner import wait_for_postgres

    assert wait_for_postgres(dsn, timeout), "PostgreSQL did not come back after the chaos run"


@pytest.mark.timeout(200)
@pytest.mark.restarts_postgres
def test_chaos_postgres(pg_dsn: str) -> None:
    run_id = "t" + uuid.uuid4().hex[:10]
    try:
        code, output = run_chaos(
            [
                "--store", pg_dsn, "--updates", "600", "--workers", "3", "--rate", "50",
                "--fault-every", "1", "--seed", "12", "--duration-limit", "120",
                "--run-id", run_id,
            ]
            + ([] if _restart_possible() else ["--no-pg-restart"]),
            timeout=180,
        )
    finally:
        _postgres_back(pg_dsn)
        _drop_run_tables(pg_dsn, run_id)
    kinds = COMMON_KINDS + ["pg_terminate_backend"]
    if _restart_possible():
        kinds.append("PostgreSQL restart")
    else:
        assert "PostgreSQL restart skipped:" in output, output
    check_passed(code, output, kinds)


@pytest.mark.timeout(100)
@pytest.mark.parametrize(
    ("sabotage", "failure"),
    [
        ("unfenced", "FAIL: duplicate domain rows"),
        ("no-write", "FAIL: lost updates"),
        ("pay-twice", "FAIL: updates charged more than once"),
    ],
)
def test_chaos_checks_bite(tmp_path: "os.PathLike[str]", sabotage: str, failure: str) -> None:
    store = "sqlite://" + os.path.join(str(tmp_path), "chaos.sqlite3")
    code, output = run_chaos(
        [
            "--store", store, "--updates", "120", "--workers", "2", "--rate", "60",
            "--fault-every", "1", "--seed", "13", "--duration-limit", "60",
        ]
        + (["--no-payments"] if sabotage == "no-write" else []),
        timeout=90,
        sabotage=sabotage,
    )
    assert code == 1, output
    table = parse_table(output)
    assert table["result"] == "FAIL", output
    assert failure in output, output
    if sabotage == "unfenced":
        assert first_int(table["duplicate domain rows"]) > 0, output
        assert "writes that were rolled back are in the domain table" in output, output
    elif sabotage == "no-write":
        assert first_int(table["lost updates"]) > 0, output
        assert table["payments"] == "off (--no-payments)", output
    else:
        assert table["lost updates"] == "0", output
        assert table["duplicate domain rows"] == "0", output
        charges = table["payments: charges"]
        assert first_int(charges) > first_int(table["updates"]), output
        assert "FAIL: payment requests after the step's record landed" in output, output
        assert first_int(table["payments: requests after the record"]) > 0, output
    assert "kept for inspection" in output, output


def test_chaos_help_and_bad_arguments() -> None:
    started = time.monotonic()
    code, output = run_chaos(["--help"], timeout=30)
    assert code == 0, output
    for option in ("--store", "--updates", "--workers", "--seed", "--duration-limit",
                   "--no-pg-restart", "--no-payments", "pg_terminate_backend", "SIGSTOP"):
        assert option in output, option
    code, output = run_chaos(["--workers", "0"], timeout=30)
    assert code == 2, output
    assert "--workers must be at least 1" in output, output
    code, output = run_chaos(["--store", "sqlite:///"], timeout=30)
    assert code == 2, output
    assert "sqlite:/// needs a file path" in output, output
    assert time.monotonic() - started < 30
