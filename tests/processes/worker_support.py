"""What the bot worker processes share (tests/processes/ptb_bot_worker.py,
tests/processes/intake_worker.py).

Imports nothing of python-telegram-bot, so the blocking worker stays free of asyncio.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import time
from typing import Any, Dict


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line both recovery workers (PTB and ``UpdateIntake``) take."""
    parser.add_argument("base_url")
    parser.add_argument("token")
    parser.add_argument("store")
    parser.add_argument("table")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--domain", required=True)
    parser.add_argument("--poll", action="store_true")
    parser.add_argument("--hang", default="", help="text of messages whose handler never ends")
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--sweep", type=float, default=0.1)
    parser.add_argument("--grace", type=float, default=0.2)
    parser.add_argument("--max-concurrent", type=int, default=8)
    parser.add_argument("--max-life", type=float, default=40.0)
    parser.add_argument("--retry", type=float, default=0.1, help="retry delay in seconds")
    parser.add_argument("--slow", default="", help="text of messages whose handler is slow")
    parser.add_argument("--slow-seconds", type=float, default=3.0)
    parser.add_argument("--fail-once", default="", help="text of messages whose first attempt fails")
    parser.add_argument("--fail-always", default="", help="text of messages whose every attempt fails")
    parser.add_argument(
        "--exhaustions",
        action="store_true",
        help="pass handle_exhaustion (it logs each one): a final failure becomes an exhaustion",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="expose ptb_fence.metrics on 127.0.0.1:PORT (prometheus_client.start_http_server)",
    )
    parser.add_argument("--txn", default="", help="text of messages whose fenced transaction is slow")
    parser.add_argument("--txn-seconds", type=float, default=3.0,
                        help="how long the --txn messages' fenced transaction stays open")
    parser.add_argument("--probe-port", type=int, default=None,
                        help="serve /healthz, /readyz and /metrics on 127.0.0.1 (probe_port=)")
    parser.add_argument("--stop-timeout", type=float, default=None)
    parser.add_argument("--attempt-timeout", type=float, default=None)
    parser.add_argument("--max-attempts", type=int, default=None)
    parser.add_argument("--strict-chat-order", action="store_true")
    parser.add_argument(
        "--unary",
        action="store_true",
        help="unary handling (DurableUpdateProcessor, UpdateIntake(handle=...)): the handler "
        "gets no attempt and writes no domain row",
    )
    parser.add_argument(
        "--fork-child",
        action="store_true",
        help="once ready, fork a long-lived child (multiprocessing, fork start method); its "
        "pid is written to DIR/child.<pid>",
    )
    parser.add_argument(
        "--fork-in-txn",
        action="store_true",
        help="the --txn messages fork that child inside their open fenced transaction",
    )
    parser.add_argument(
        "--crash", default="", help="text of messages whose handler SIGKILLs its own process"
    )


def fail_if(args: argparse.Namespace, text: object, attempt: int) -> None:
    """``--fail-once``/``--fail-always``: make this attempt's handler fail."""
    if args.fail_once and text == args.fail_once and attempt == 1:
        raise RuntimeError("failing the first attempt (--fail-once)")
    if args.fail_always and text == args.fail_always:
        raise RuntimeError("failing every attempt (--fail-always)")


def serve_metrics(args: argparse.Namespace, source: Any) -> None:
    """``--metrics-port``: register ``source``'s metrics and serve them on 127.0.0.1."""
    if not args.metrics_port:
        return
    from prometheus_client import CollectorRegistry, start_http_server

    from ptb_fence.metrics import register

    registry = CollectorRegistry()
    register(source, registry)
    start_http_server(args.metrics_port, addr="127.0.0.1", registry=registry)


def make_store(url: str, table: str) -> Any:
    """The store of ``url``: ``sqlite:///absolute/path`` or a PostgreSQL DSN."""
    if url.startswith("sqlite:///"):
        from ptb_fence import SQLiteUpdateStore

        return SQLiteUpdateStore(url[len("sqlite:///") - 1 :], table)
    from ptb_fence import PostgresUpdateStore

    return PostgresUpdateStore(url, table)


def dump_stacks_on_sigusr1() -> None:
    """On SIGUSR1, write every thread's stack to stderr (the process's ``out.N`` file): a
    harness that finds the process still running past a bound asks it what it waits for. Works
    even when the main thread is stuck (the dump is done by faulthandler's C handler)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def touch(path: str) -> None:
    """Create ``path`` holding the time (the tests watch for these files)."""
    with open(path, "w", encoding="utf-8") as file:
        file.write(str(time.time()))


def crash_if(args: argparse.Namespace, text: object) -> None:
    """With ``--crash`` matching ``text``: die at once, as a segfault or the OOM killer would
    (no cleanup, no release, the liveness signal dropped by the kernel)."""
    if args.crash and text == args.crash:
        os.kill(os.getpid(), signal.SIGKILL)


def extra_options(args: argparse.Namespace) -> Dict[str, Any]:
    """Recovery options, passed only when given (so the library defaults apply otherwise)."""
    options: Dict[str, Any] = {}
    if args.stop_timeout is not None:
        options["stop_timeout_seconds"] = args.stop_timeout
    if args.attempt_timeout is not None:
        options["attempt_timeout_seconds"] = args.attempt_timeout
    if args.max_attempts is not None:
        options["max_attempts"] = args.max_attempts
    if args.strict_chat_order:
        options["strict_chat_order"] = True
    if args.probe_port is not None:
        options["probe_port"] = args.probe_port
    if args.exhaustions:
        import logging

        def handle_exhaustion(exhaustion: Any) -> None:
            logging.getLogger("worker").info("exhaustion of update %s", exhaustion.update_id)

        options["handle_exhaustion"] = handle_exhaustion
    return options


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def fork_child(directory: str, pid: int) -> None:
    """Start a child with the ``fork`` start method (it inherits every descriptor of this
    process, as a ``multiprocessing`` helper or a ``ProcessPoolExecutor`` worker does) that
    sleeps until killed; write its pid to ``child.<pid>``. A daemon: it is ended when this
    process exits normally, not when it is SIGKILLed."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=_sleep_forever, daemon=True)
    child.start()
    with open(os.path.join(directory, f"child.{pid}"), "w", encoding="utf-8") as file:
        file.write(str(child.pid))


def announce_ready(directory: str, pid: int, store: Any) -> None:
    """Write ``instance.<pid>`` (the store's liveness instance, when it holds one: claims record
    it, so a harness can count each process's claims), then ``ready.<pid>``."""
    instance = getattr(store, "instance", None)
    if instance:
        with open(os.path.join(directory, f"instance.{pid}"), "w", encoding="utf-8") as file:
            file.write(instance)
    touch(os.path.join(directory, f"ready.{pid}"))
