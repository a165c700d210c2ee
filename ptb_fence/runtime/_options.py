"""Validated runtime options shared by UpdateIntake and the PTB processors."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from ptb_fence._durations import Duration, duration_seconds
from ptb_fence.runtime._pacer import OutboxPacing

if TYPE_CHECKING:
    from ptb_fence._values import Exhaustion, OutboxEntry
    from ptb_fence.runtime._attempt import Attempt

__all__ = ["RuntimeOptions"]

RetryFn = Callable[[BaseException, int], Optional[float]]
"""``retry(error, attempt) -> seconds | None``: delay before the next attempt, None to give up."""


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _port_or_none(name: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ValueError(
            f"{name} must be a TCP port (0 to 65535; 0: any free port) or None (no probe "
            f"server), got {value!r}"
        )
    return value


def _host(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(
            f"{name} must be a host name or address to listen on (e.g. '127.0.0.1', or "
            f"'0.0.0.0' for every interface), got {value!r}"
        )
    return value


def _callable_or_none(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {value!r}")
    return value


@dataclass(frozen=True)
class AlarmThresholds:
    """When ptb_fence logs an alarm (a WARNING under the ``ptb_fence.alarms`` logger), given as
    the ``alarms=`` option. ``alarms=None`` turns them off.

    Each condition logs once, then again every ``interval_seconds`` while it holds, and once
    (INFO) when it clears. All durations are seconds.

    Args:
        ingest_failing_seconds (:obj:`float`): Recording updates has failed (store errors) for
            this long. The alarm says how long Telegram still keeps the oldest update not
            recorded (24 h after its ``date``). Defaults to 60.
        oldest_unsettled_seconds (:obj:`float`): The oldest update not settled yet (pending,
            running or failed) was received this long ago. Defaults to 600 (10 minutes).
        chat_held_seconds (:obj:`float`): Under ``strict_chat_order``: a chat's later updates
            wait behind an update received this long ago (a failing update holds its chat).
            Defaults to 300.
        exhaustion_unacknowledged_seconds (:obj:`float`): An exhaustion has waited this long
            for its acknowledgement. Defaults to 3600.
        interval_seconds (:obj:`float`): The quiet time between two alarms of one condition.
            Defaults to 300.
        jobs_late_seconds (:obj:`float`): A durable job due this long ago has not fired yet
            (no process with durable jobs runs, or its store calls fail). It also makes
            ``healthy()`` false. The sweep reads the due jobs at most every 10 s. Defaults
            to 60.
    """

    ingest_failing_seconds: float = 60.0
    oldest_unsettled_seconds: float = 600.0
    chat_held_seconds: float = 300.0
    exhaustion_unacknowledged_seconds: float = 3600.0
    interval_seconds: float = 300.0
    jobs_late_seconds: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "ingest_failing_seconds",
            "oldest_unsettled_seconds",
            "chat_held_seconds",
            "exhaustion_unacknowledged_seconds",
            "interval_seconds",
            "jobs_late_seconds",
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value >= 0
                or value == float("inf")
            ):
                raise ValueError(
                    f"AlarmThresholds.{name} must be a finite number of seconds >= 0, "
                    f"got {value!r}"
                )



@dataclass(frozen=True, init=False)
class RuntimeOptions:
    """The options of the runtime, validated on construction.

    Durations are seconds (:obj:`int` or :obj:`float`) or a :class:`datetime.timedelta`, as
    python-telegram-bot 22's ``TimePeriod``. They are stored as :obj:`float` seconds here, and
    the store sees integer milliseconds.

    Args:
        max_attempts (:obj:`int`): Attempts per update before it is exhausted. Default 5.
        lease_seconds (:obj:`float` | :class:`datetime.timedelta`):
            How long a claim holds an update without renewal. The lease
            keeper renews every ``lease_seconds / 4``. Default 120.
        sweep_every_seconds (:obj:`float` | :class:`datetime.timedelta`):
            Interval of the sweep (retries, lapsed leases,
            exhaustions, pruning). Default 30.
        pending_grace_seconds (:obj:`float` | :class:`datetime.timedelta`):
            A pending row is handed over by a sweep only after
            this long, so the receiving process has the first chance. Default 60.
        retain_seconds (:obj:`float` | :class:`datetime.timedelta`):
            Settled rows are pruned this long after settling.
            Default 86400.
        max_concurrent (:obj:`int`): Updates handled at once (different chats). Default 32.
        retry: ``retry(error, attempt) -> seconds | None``. Default
            :func:`ptb_fence.runtime.default_retry`. Not asked for a misuse of ptb_fence
            (:func:`ptb_fence.is_misuse`): that attempt fails for good at once.
        on_failure: ``on_failure(error, attempt, retrying)`` observer of failed attempts.
        on_exhaustion_failure: ``on_exhaustion_failure(error, exhaustion)`` observer of a
            failing exhaustion handler.
        on_store_error: ``on_store_error(error, step)`` observer of store errors. ``step`` is one
            of ``"claim"``, ``"renew"``, ``"settle"``, ``"sweep"``.
        clock: ``clock() -> float`` seconds since the epoch (default :func:`time.time`). The
            store sees ``int(clock() * 1000)``.
        stop_timeout_seconds (:obj:`float` | :class:`datetime.timedelta`):
            Once stopping began (``Application.stop()``, :meth:`UpdateIntake.close`), how long
            running handlers (and, in a PTB Application, the updates already queued) may still
            finish. Then their attempts are released, not counted as spent. Their fenced
            writes are refused. Their open fenced transactions on the store's PostgreSQL
            connections are rolled back. Their asyncio tasks are cancelled, and their threads
            are abandoned. A PTB stop ends within this + 5 s, also when the database does not
            answer. Default 10. See :doc:`/explanation/recovery`.
        attempt_timeout_seconds (:obj:`float` | :class:`datetime.timedelta` | :obj:`None`):
            How long one attempt's handler may run. Then it fails with
            :exc:`~ptb_fence.AttemptTimeout`, retried by the ``retry`` policy or exhausted. Its
            lease is no longer renewed and its fenced writes are refused. An asyncio handler is
            cancelled. A blocking one is abandoned, and its thread no longer counts against
            ``max_concurrent``. An attempt that completed stays completed. Default
            :obj:`None` (no limit).
        ingest_claim_buffer (:obj:`int`): A fenced store that records and claims in one
            commit claims at ingest at most ``max_concurrent + ingest_claim_buffer`` minus the
            claims this process already holds. The rest of a batch is recorded ``pending``
            (claimable by any process, this one claims them when it gets to them), so a crash
            strands at most that many for a lease. Default 8.
        strict_chat_order (:obj:`bool`): An update of a chat is never started while an
            earlier update of the same chat is unsettled, in this process or any other sharing
            the store. An exhausted or abandoned update releases its chat. It needs a
            :class:`~ptb_fence.BatchStore`, and every process sharing the store
            must use it. A failing update delays its chat by its retry delay. Other chats are
            not held up. Default :obj:`False` (order of first attempts within one process
            only). See :ref:`chat-order`.
        alarms (:class:`~ptb_fence.AlarmThresholds` | :obj:`None`): When to log an alarm (a
            WARNING under ``ptb_fence.alarms``, once per condition per interval): recording
            failing, the oldest unsettled update too old, a chat held too long, exhaustions
            unacknowledged too long, durable jobs late. :obj:`None` turns the alarms off. Default
            ``AlarmThresholds()``.
        outbox_concurrency (:obj:`int`): Outbox calls sent at once by this process (each
            chat's calls one at a time, in order, whatever this is). Default 8.
        outbox_max_age_seconds (:obj:`float` | :class:`datetime.timedelta`): An outbox call
            not sent this long after its commit (Telegram down, a chat held by ``RetryAfter``)
            ends ``failed`` as expired instead. Default 86400 (24 h).
        handle_send_failure: ``handle_send_failure(entry)`` (sync or async), called at least
            once for every outbox call that ended ``failed`` (a permanent refusal, an unknown
            outcome of an ``at_most_once`` call, expiry) with its
            :class:`~ptb_fence.OutboxEntry`. When it returns normally the failure is
            acknowledged, when it raises it is delivered again. Without it a failure is
            logged (WARNING) and acknowledged. Default :obj:`None`.
        probe_port (:obj:`int` | :obj:`None`): Serve this process's probes over HTTP on this
            port while it runs: ``/healthz`` (200 while its loops tick: a liveness probe),
            ``/readyz`` (200 while its store answers: a readiness probe) and ``/metrics``
            (Prometheus, with the ``[metrics]`` extra). ``0`` picks a free port. Default
            :obj:`None` (no probe server).
        probe_host (:obj:`str`): The address the probe server listens on. Default
            ``"127.0.0.1"`` (this host only: give ``"0.0.0.0"`` for a probe from outside a
            container).
        outbox_pacing (:class:`~ptb_fence.OutboxPacing` | :obj:`None`): Telegram's limits
            every outbox send is paced by, shared by every process of the bot through the
            store. Pass ``OutboxPacing()`` for Telegram's limits. Default :obj:`None`: sends go
            as fast as the senders go. Broadcasts are paced by it, or by ``OutboxPacing()``
            without it.
        handle_blocked: ``handle_blocked(broadcast_name, chat_id)``, called on a thread of the
            broadcast sender once for each recipient of a broadcast who blocked the bot
            (Telegram answered 403 Forbidden). Use it to stop writing to that user. Default
            :obj:`None`.

    Raises:
        ValueError: A numeric option is not positive (``ingest_claim_buffer``: negative), or a duration is neither a number nor a
            ``timedelta`` (the message names the option), or ``probe_port`` is not a port.
        TypeError: A callback is not callable, ``strict_chat_order`` is not a bool,
            ``alarms`` is not an :class:`~ptb_fence.AlarmThresholds`, or ``probe_host`` is
            not a non-empty string.
    """

    max_attempts: int = 5
    lease_seconds: float = 120.0
    sweep_every_seconds: float = 30.0
    pending_grace_seconds: float = 60.0
    retain_seconds: float = 86400.0
    max_concurrent: int = 32
    retry: Optional[RetryFn] = None
    on_failure: Optional[Callable[[BaseException, "Attempt", bool], Any]] = None
    on_exhaustion_failure: Optional[Callable[[BaseException, "Exhaustion"], Any]] = None
    on_store_error: Optional[Callable[[BaseException, str], Any]] = None
    clock: Callable[[], float] = time.time
    stop_timeout_seconds: float = 10.0
    attempt_timeout_seconds: Optional[float] = None
    ingest_claim_buffer: int = 8
    strict_chat_order: bool = False
    alarms: Optional[AlarmThresholds] = AlarmThresholds()
    outbox_concurrency: int = 8
    outbox_max_age_seconds: float = 86400.0
    handle_send_failure: Optional[Callable[["OutboxEntry"], Any]] = None
    probe_port: Optional[int] = None
    probe_host: str = "127.0.0.1"
    outbox_pacing: Optional[OutboxPacing] = None
    handle_blocked: Optional[Callable[[str, int], Any]] = None

    # The constructor takes durations as ``float | int | timedelta``. The attributes are always
    # float seconds, so code reading them needs no conversion.
    def __init__(
        self,
        max_attempts: int = 5,
        lease_seconds: Duration = 120.0,
        sweep_every_seconds: Duration = 30.0,
        pending_grace_seconds: Duration = 60.0,
        retain_seconds: Duration = 86400.0,
        max_concurrent: int = 32,
        retry: Optional[RetryFn] = None,
        on_failure: Optional[Callable[[BaseException, "Attempt", bool], Any]] = None,
        on_exhaustion_failure: Optional[Callable[[BaseException, "Exhaustion"], Any]] = None,
        on_store_error: Optional[Callable[[BaseException, str], Any]] = None,
        clock: Callable[[], float] = time.time,
        stop_timeout_seconds: Duration = 10.0,
        attempt_timeout_seconds: Optional[Duration] = None,
        ingest_claim_buffer: int = 8,
        strict_chat_order: bool = False,
        alarms: Optional[AlarmThresholds] = AlarmThresholds(),
        outbox_concurrency: int = 8,
        outbox_max_age_seconds: Duration = 86400.0,
        handle_send_failure: Optional[Callable[["OutboxEntry"], Any]] = None,
        probe_port: Optional[int] = None,
        probe_host: str = "127.0.0.1",
        outbox_pacing: Optional[OutboxPacing] = None,
        handle_blocked: Optional[Callable[[str, int], Any]] = None,
    ) -> None:
        values: "dict[str, Any]" = {
            "max_attempts": _positive_int("max_attempts", max_attempts),
            "lease_seconds": duration_seconds("lease_seconds", lease_seconds),
            "sweep_every_seconds": duration_seconds("sweep_every_seconds", sweep_every_seconds),
            "pending_grace_seconds": duration_seconds(
                "pending_grace_seconds", pending_grace_seconds
            ),
            "retain_seconds": duration_seconds("retain_seconds", retain_seconds),
            "max_concurrent": _positive_int("max_concurrent", max_concurrent),
            "retry": _callable_or_none("retry", retry),
            "on_failure": _callable_or_none("on_failure", on_failure),
            "on_exhaustion_failure": _callable_or_none(
                "on_exhaustion_failure", on_exhaustion_failure
            ),
            "on_store_error": _callable_or_none("on_store_error", on_store_error),
            "clock": clock,
            "stop_timeout_seconds": duration_seconds("stop_timeout_seconds", stop_timeout_seconds),
            "attempt_timeout_seconds": (
                None
                if attempt_timeout_seconds is None
                else duration_seconds("attempt_timeout_seconds", attempt_timeout_seconds)
            ),
            "ingest_claim_buffer": _non_negative_int("ingest_claim_buffer", ingest_claim_buffer),
            "strict_chat_order": _bool("strict_chat_order", strict_chat_order),
            "alarms": alarms,
            "outbox_concurrency": _positive_int("outbox_concurrency", outbox_concurrency),
            "outbox_max_age_seconds": duration_seconds(
                "outbox_max_age_seconds", outbox_max_age_seconds
            ),
            "handle_send_failure": _callable_or_none("handle_send_failure", handle_send_failure),
            "probe_port": _port_or_none("probe_port", probe_port),
            "probe_host": _host("probe_host", probe_host),
            "outbox_pacing": outbox_pacing,
            "handle_blocked": _callable_or_none("handle_blocked", handle_blocked),
        }
        if outbox_pacing is not None and not isinstance(outbox_pacing, OutboxPacing):
            raise TypeError(
                "outbox_pacing must be an OutboxPacing (or None to send unpaced), got "
                f"{outbox_pacing!r}"
            )
        if alarms is not None and not isinstance(alarms, AlarmThresholds):
            raise TypeError(
                f"alarms must be an AlarmThresholds (or None to turn them off), got {alarms!r}"
            )
        if not callable(clock):
            raise TypeError(f"clock must be callable, got {clock!r}")
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_options(cls, component: str, options: "dict[str, Any]") -> "RuntimeOptions":
        """Build from keyword options, naming ``component`` and the valid options when one is
        unknown.

        Raises:
            TypeError: An unknown option.
            ValueError: A numeric option is not positive or a duration is not a number or
                ``timedelta``.
        """
        valid = sorted(cls.__dataclass_fields__)
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise TypeError(
                f"{component} got unknown option(s) {', '.join(unknown)}; valid options are "
                f"{', '.join(valid)}"
            )
        return cls(**options)

    def now_ms(self) -> int:
        """The current time in store units (integer epoch milliseconds)."""
        return int(self.clock() * 1000)

    @property
    def lease_ms(self) -> int:
        """The lease length in milliseconds (at least 1)."""
        return max(1, int(self.lease_seconds * 1000))

    def lease_deadline(self, now: Optional[int] = None) -> int:
        """The end of a lease taken or renewed at ``now`` (default: now), in epoch ms.

        The one place a lease deadline (``now + lease_ms``) is computed.
        """
        return (self.now_ms() if now is None else now) + self.lease_ms
