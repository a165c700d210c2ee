"""Chaos runner: drive updates through killed, paused and disconnected bot processes.

Usage::

    python -m ptb_fence.chaos [--store URL] [--updates N] [--workers N] [--seed N]
                              [--duration-limit SECONDS] [--no-pg-restart] [--rate N]
                              [--fault-every SECONDS] [--keep]

``--store`` is ``sqlite:///absolute/path`` or a PostgreSQL DSN (``postgresql://…``); the default
is a SQLite file in a new temporary directory. ``--updates`` defaults to 5000 on PostgreSQL and
2000 on SQLite, ``--workers`` to 4.

What a run does:

- It starts ``--workers`` worker processes. Each builds the store and a real
  ``UpdateIntake`` (lease 1 s, sweep every 0.2 s, ``max_attempts`` 5, durable exhaustions)
  and records the updates the runner delivers to it with ``accept()``; about 10 % of the
  updates are recorded by the runner itself, so only the workers' sweeps hand them over.
- Every handler first logs its run in ``chaos_<run>_runs``, then writes one row to the domain
  table ``chaos_<run>_domain`` (same database, no unique key, so a double write is visible):
  most in ``attempt.transaction(complete=True)``, about 20 % in a plain ``attempt.transaction()``
  (an idempotent write) followed by the runtime's own settle. About 10 % fail once on attempt 1
  (before the transaction, or inside it after the write, which must roll back), and about 0.5 %
  always fail, so they are exhausted; the exhaustion handler records each delivery (and fails on
  purpose now and then, so it must be delivered again).
- While updates flow it injects faults, each kind at least once: SIGKILL of a random worker
  (restarted at once), SIGSTOP of a busy worker for longer than its lease (then SIGCONT: its
  attempts must be fenced out and their transactions rolled back), and on PostgreSQL
  ``pg_terminate_backend`` of every worker connection (``application_name`` is
  ``ptb_fence_chaos_<run>``) and one restart of the server
  (``pg_ctlcluster --skip-systemctl-redirect <version> main restart``; only as root on the
  machine of the DSN, otherwise skipped with the reason printed; ``--no-pg-restart`` disables it).
- It prints a progress line every 2 s, stops the workers once every update is final, and checks
  from the database: no update lost (every update completed with its domain row, or exhausted),
  no duplicate domain row, every always-failing update exhausted after exactly ``max_attempts``
  attempts and handler runs, every exhaustion delivered with its exact identity and acknowledged,
  no rolled-back or fenced-out write visible, no worker crashed.
- A trigger logs every claim of the store's table in the claim's own transaction
  (``chaos_<run>_claims``). The attempt numbers in the claim log must be exactly 1 to the
  ``attempts`` counter, and every handler run must belong to a logged claim. An attempt given
  back (released at a stop, or taken over from a SIGKILLed worker whose handlers did not run
  alone) is claimed again with the same number; each earlier claim of a repeated number must lie
  at most ``lease`` + 1.5 s before a fault, otherwise the run fails. A claim may legitimately never reach its handler when its
  worker is SIGKILLed right after it, or when the connection breaks while the claim commits (the
  runtime cannot know that it landed; the lease lapses and the next attempt takes over): such a
  claim counts as an attempt without a run, is shown in the table, and must lie at most
  ``lease`` + 1.5 s before a SIGKILL, a backend termination or the restart, otherwise the run
  fails. For an always-failing update, the attempt numbers that ran plus those of such claims
  must be exactly 1 to ``max_attempts``. Every fault is also logged to ``faults.jsonl`` in the work directory.
- It prints the table of results and exits 0 when all of these hold, 1 otherwise (naming the
  failed criterion), 2 on bad arguments.

The tables (``chaos_<run>_*``) and the work directory are removed after a pass unless ``--keep``
is given, and kept (their location printed) after a failure.
"""

from ptb_fence.chaos._runner import ChaosConfig, ChaosRunner, main

__all__ = ["ChaosConfig", "ChaosRunner", "main"]
