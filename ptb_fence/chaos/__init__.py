"""Chaos runner: drive updates through killed, paused and disconnected bot processes.

Usage::

    python -m ptb_fence.chaos [--store URL] [--updates N] [--workers N] [--seed N] [--keep]

Worker processes of the real ``UpdateIntake`` make fenced writes and charge a fake payment API
in a step (unless ``--no-payments``). The runner injects faults: SIGKILL, SIGSTOP past the lease,
on PostgreSQL ``pg_terminate_backend`` and a server restart. It checks that no update was lost,
written or charged twice. It exits 0 when all holds, 1 otherwise and 2 on bad arguments.
"""

from ptb_fence.chaos._runner import ChaosConfig, ChaosRunner, main

__all__ = ["ChaosConfig", "ChaosRunner", "main"]
