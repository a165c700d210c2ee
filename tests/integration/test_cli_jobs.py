"""``ptb-fence jobs list|show|run-now|cancel`` on the jobs a store keeps.

The subcommands run on a :class:`MemoryUpdateStore` through ``run_jobs`` with the real parser.
The command line opens SQLite and PostgreSQL only, and those run through ``main([...])``
when their store keeps jobs.
"""

from __future__ import annotations

import json
import logging
from typing import Any, List, Optional, Tuple

import pytest

from ptb_fence import MemoryUpdateStore
from ptb_fence._values import JobWrite
from ptb_fence.cli import build_parser, main
from ptb_fence.cli._errors import Refused
from ptb_fence.cli._jobs import run_jobs
from ptb_fence.cli._rows import UpdateRow
from ptb_fence.runtime._durable_jobs import DurableJobs, run_update_id
from ptb_fence.runtime._job_schedule import JobSchedule

NOW = 1_700_000_000_000


def write(name: str, next_run_at: Optional[int], *, kind: str = "once", keyed: bool = False,
          data: str = '"payload"', chat_id: Optional[int] = 7) -> JobWrite:
    spec: Any = {"at": next_run_at} if kind == "once" else {"every": 60_000, "start": NOW}
    return JobWrite(name=name, callback="bot:remind", data=data, chat_id=chat_id, user_id=3,
                    schedule=json.dumps({"kind": kind, **spec}, sort_keys=True),
                    next_run_at=next_run_at, keyed=keyed)


def run(store: Any, *argv: str, now: int = NOW, rows: Any = None) -> Tuple[int, str]:
    lines: List[str] = []
    args = build_parser().parse_args(["jobs", *argv])
    status = run_jobs(args, store, now=now, out=lines.append, rows_after=rows)
    return status, "\n".join(lines)


def rows_of(store: MemoryUpdateStore) -> Any:
    def after(update_id: int, limit: int) -> List[UpdateRow]:
        found = []
        for uid in sorted(store._rows):
            if uid > update_id:
                row = store._rows[uid]
                found.append(UpdateRow(uid, row.state, row.attempts, row.due_at,
                                       row.received_at, row.settled_at, row.error, None))
        return found[:limit]

    return after


@pytest.fixture()
def store() -> Any:
    store = MemoryUpdateStore()
    store.schedule_jobs([
        write("late-reminder", NOW - 30_000),
        write("tomorrow", NOW + 86_400_000, keyed=True),
        write("digest", NOW + 60_000, kind="interval", data='"' + "x" * 998 + '"'),
    ], NOW - 60_000)
    return store


def test_list_shows_the_live_jobs_with_their_next_run_and_lateness(store: Any) -> None:
    status, text = run(store, "list")
    assert status == 0
    assert "late-reminder" in text and "tomorrow" in text and "digest" in text
    assert "(late 30 s)" in text
    assert "3 job(s), 1 due now" in text
    status, text = run(store, "list", "--json")
    data = json.loads(text)
    assert [job["name"] for job in data["jobs"]] == ["late-reminder", "tomorrow", "digest"]
    late = data["jobs"][0]
    assert late["next_run_in_seconds"] == -30.0
    assert late["next_run_at_utc"].endswith("Z") and late["state"] == "scheduled"
    assert data["next_after"] is None


def test_list_filters_by_name_pages_and_includes_ended_with_all(store: Any) -> None:
    _, text = run(store, "list", "--name", "digest", "--json")
    assert [job["name"] for job in json.loads(text)["jobs"]] == ["digest"]
    _, text = run(store, "list", "--limit", "2", "--json")
    page = json.loads(text)
    assert len(page["jobs"]) == 2 and page["next_after"] == page["jobs"][1]["job_id"]
    _, text = run(store, "list", "--after", str(page["next_after"]), "--json")
    assert [job["name"] for job in json.loads(text)["jobs"]] == ["digest"]
    first = json.loads(run(store, "list", "--json")[1])["jobs"][0]["job_id"]
    run(store, "cancel", str(first))
    _, text = run(store, "list", "--json")
    assert first not in [job["job_id"] for job in json.loads(text)["jobs"]]
    _, text = run(store, "list", "--all", "--json")
    states = {job["job_id"]: job["state"] for job in json.loads(text)["jobs"]}
    assert states[first] == "cancelled"
    status, text = run(store, "list", "--name", "nothing")
    assert status == 0 and "no live jobs named 'nothing'" in text


def test_show_gives_every_field_the_schedule_the_data_size_and_the_runs(store: Any) -> None:
    jobs = DurableJobs(store, lambda: NOW)
    fired = jobs.fire_due()
    assert len(fired) == 1
    job_id = json.loads(run(store, "list", "--all", "--json")[1])["jobs"][0]["job_id"]
    status, text = run(store, "show", str(job_id), "--json", rows=rows_of(store))
    assert status == 0
    data = json.loads(text)
    assert data["name"] == "late-reminder" and data["state"] == "ended"
    assert data["schedule"] == {"at": NOW - 30_000, "kind": "once"}
    assert data["data_bytes"] == len('"payload"') and data["runs"] == 1
    assert data["next_run_at"] is None and data["next_run_in_seconds"] is None
    (only,) = data["run_rows"]
    assert only["run"] == 1 and only["update_id"] == run_update_id(job_id, 1)
    assert only["state"] == "pending"
    status, text = run(store, "show", str(job_id), rows=rows_of(store))
    assert "runs (the latest 1 still in the table)" in text
    assert str(run_update_id(job_id, 1)) in text and "no more runs" in text
    digest = json.loads(run(store, "list", "--name", "digest", "--json")[1])["jobs"][0]
    status, text = run(store, "show", str(digest["job_id"]))
    assert "data        1000 bytes (encoded)" in text
    assert "(in 1m 00s)" in text and '"every": 60000' in text
    assert f"run it now: ptb-fence jobs run-now {digest['job_id']}" in text
    data = json.loads(run(store, "show", str(digest["job_id"]), "--json")[1])
    assert data["next_run_in_seconds"] == 60.0 and data["run_rows"] is None


def test_run_now_makes_a_job_due_and_cancel_ends_it(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = json.loads(run(store, "list", "--name", "tomorrow", "--json")[1])["jobs"][0]
    caplog.set_level(logging.INFO, logger="ptb_fence.cli")
    status, text = run(store, "run-now", str(job["job_id"]), now=NOW + 5)
    assert status == 0 and "due now" in text
    assert store.get_job(job["job_id"]).next_run_at == NOW + 5
    assert [j.name for j in store.due_jobs(NOW + 5, 10)] == ["late-reminder", "tomorrow"]
    status, text = run(store, "cancel", str(job["job_id"]), "--json")
    assert status == 0
    data = json.loads(text)
    assert data["cancelled"] == job["job_id"] and data["before"]["state"] == "scheduled"
    assert store.get_job(job["job_id"]).state == "cancelled"
    records = [r for r in caplog.records if r.name == "ptb_fence.cli"]
    assert [getattr(r, "job_id", None) for r in records] == [job["job_id"]] * 2
    # a cancelled job is neither run nor cancelled again: exit 2, nothing changed
    for action in ("run-now", "cancel"):
        with pytest.raises(Refused, match="it is cancelled, not live"):
            run(store, action, str(job["job_id"]))
    assert store.get_job(job["job_id"]).state == "cancelled"


def test_an_unknown_job_and_a_store_without_jobs_are_refused(store: Any) -> None:
    for action in ("show", "run-now", "cancel"):
        with pytest.raises(Refused, match="no job 999 in the store"):
            run(store, action, "999")

    class NoJobs:
        features = None

    with pytest.raises(Refused, match=r"keeps no durable jobs .*StoreFeatures\(jobs=True\)"):
        run(NoJobs(), "list")


def test_bad_job_ids_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-1", "x", str(1 << 38)):
        assert main(["--store", "sqlite:///nowhere.db", "jobs", "show", bad]) == 2
        assert "invalid job id" in capsys.readouterr().err


# -- the command line on SQLite and PostgreSQL ---------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres"])
def real(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """A SQLite or PostgreSQL store with jobs, and the ``--store``/``--table`` arguments."""
    from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore

    if request.param == "sqlite":
        path = str(tmp_path / "bot.db")
        store: Any = SQLiteUpdateStore(path, "updates")
        argv = ["--store", f"sqlite:///{path}", "--table", "updates"]
    else:
        dsn = request.getfixturevalue("pg_dsn")
        table = request.getfixturevalue("pg_table")
        store = PostgresUpdateStore(dsn, table)
        argv = ["--store", dsn, "--table", table]
    yield store, argv
    store.close()


def cli(capsys: pytest.CaptureFixture[str], argv: List[str], *command: str
        ) -> Tuple[int, str, str]:
    code = main([*argv, "jobs", *command])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_line_lists_shows_runs_now_and_cancels_jobs(
    real: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    store, argv = real
    now = int(time.time() * 1000)
    late, later = store.schedule_jobs(
        [write("late", now - 120_000), write("later", now + 3_600_000, kind="interval")],
        now - 200_000)
    code, out, err = cli(capsys, argv, "list")
    assert code == 0, err
    assert "late" in out and "later" in out and "2 job(s), 1 due now" in out
    assert "(late 2m" in out
    # a fired run shows in show with its update row
    fired = DurableJobs(store, lambda: now).fire_due()
    assert [update_id for update_id, _ in fired] == [run_update_id(late.job_id, 1)]
    code, out, err = cli(capsys, argv, "show", str(late.job_id), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["state"] == "ended" and data["runs"] == 1 and data["data_bytes"] == 9
    assert data["schedule"]["kind"] == "once"
    assert [(r["run"], r["update_id"], r["state"]) for r in data["run_rows"]] == [
        (1, run_update_id(late.job_id, 1), "pending")]
    code, out, err = cli(capsys, argv, "show", str(later.job_id))
    assert code == 0, err
    assert "runs: none in the table" in out and "(in 59m" in out
    # run-now makes it due, cancel ends it; the second cancel is refused with exit 2
    code, out, err = cli(capsys, argv, "run-now", str(later.job_id), "--json")
    assert code == 0, err
    assert json.loads(out)["run_now"] == later.job_id
    again = store.get_job(later.job_id)
    assert again.next_run_at is not None and again.next_run_at <= int(time.time() * 1000)
    code, out, err = cli(capsys, argv, "cancel", str(later.job_id))
    assert code == 0, err
    assert f"cancelled job {later.job_id} (later)" in out
    assert store.get_job(later.job_id).state == "cancelled"
    code, out, err = cli(capsys, argv, "cancel", str(later.job_id))
    assert code == 2 and "it is cancelled, not live" in err and out == ""
    code, out, err = cli(capsys, argv, "run-now", "424242")
    assert code == 2 and "no job 424242 in the store" in err
    code, out, err = cli(capsys, argv, "list", "--all", "--json")
    assert [(j["name"], j["state"]) for j in json.loads(out)["jobs"]] == [
        ("late", "ended"), ("later", "cancelled")]


def test_an_unreachable_store_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--store", "postgresql://nobody@127.0.0.1:1/none", "jobs", "list"])
    assert code == 3
    assert "ptb-fence: error:" in capsys.readouterr().err
