"""Prometheus metrics of a processor or an :class:`~ptb_fence.UpdateIntake`.

They need the ``[metrics]`` extra: ``pip install 'ptb_fence[metrics]'``. One call registers
them. Expose the registry as you already do, e.g. ``register(processor)`` then
``prometheus_client.start_http_server(9100)``. The figures are read from ``stats()`` at scrape
time, with no store call. What only the store knows is what the sweep last read.
``prometheus_client`` is imported by :func:`register`, never by ``import ptb_fence``.

See :doc:`/reference/metrics` for every metric, its labels and when it appears.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Mapping, Optional, Union

import functools
import os
import platform

from ptb_fence.runtime._stats import (
    STORE_BUCKETS,
    STORE_ERROR_STEPS,
    STORE_OPERATIONS,
    HistogramSnapshot,
    Stats,
)

__all__ = ["StatsCollector", "alert_rules_path", "grafana_dashboard_path", "register"]

_MONITORING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "monitoring")

# a store operation that has not run yet: its series at 0 (present from the start)
_EMPTY_STORE_HISTOGRAM = HistogramSnapshot(
    tuple((bound, 0) for bound in STORE_BUCKETS + (float("inf"),)), 0.0, 0
)


def alert_rules_path() -> str:
    """The path of the Prometheus alert rules that ship with ptb_fence
    (``ptb_fence/monitoring/alerts.yml``: load it with ``rule_files:``)."""
    return os.path.join(_MONITORING, "alerts.yml")


def grafana_dashboard_path() -> str:
    """The path of the Grafana dashboard that ships with ptb_fence
    (``ptb_fence/monitoring/grafana.json``: import it, choosing your Prometheus data
    source)."""
    return os.path.join(_MONITORING, "grafana.json")


@functools.lru_cache(maxsize=1)
def _build() -> "tuple[str, str, str]":
    """ptb_fence's, python-telegram-bot's and Python's versions (read once)."""
    from ptb_fence import __version__

    try:
        from telegram import __version__ as ptb_version
    except ImportError:  # pragma: no cover - a dependency
        ptb_version = "none"
    return __version__, str(ptb_version), platform.python_version()

StatsSource = Union[Callable[[], Stats], Any]
"""A processor or an :class:`~ptb_fence.UpdateIntake` (anything with ``stats()``), or a
callable returning :class:`~ptb_fence.Stats`."""

_EXTRA = "ptb_fence.metrics needs prometheus_client: pip install 'ptb_fence[metrics]'"


def _import_core() -> Any:
    try:
        import prometheus_client.core as core
    except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
        raise ImportError(_EXTRA) from exc
    return core


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class StatsCollector:
    """A ``prometheus_client`` collector of one source's :class:`~ptb_fence.Stats`.

    :func:`register` makes it. Unregister it with ``registry.unregister(collector)``.

    Args:
        source: A processor or an :class:`~ptb_fence.UpdateIntake`, or a callable returning
            :class:`~ptb_fence.Stats`.
        labels: Constant labels on every metric (e.g. ``{"bot": "shop"}``: several bots in one
            registry).
    """

    __slots__ = ("_core", "_labels", "_read")

    def __init__(self, source: StatsSource, labels: Optional[Mapping[str, str]] = None) -> None:
        stats = getattr(source, "stats", None)
        read: Callable[[], Stats]
        if callable(stats):
            read = stats
        elif callable(source):
            read = source
        else:
            raise TypeError(
                "register() needs a processor, an UpdateIntake (anything with stats()) or a "
                f"callable returning ptb_fence.Stats, got {source!r}"
            )
        self._read = read
        self._labels = dict(labels or {})
        self._core = _import_core()

    def describe(self) -> List[Any]:
        """The metric families as of now (``prometheus_client`` reads their names at
        registration, so a second registration of the same names is refused)."""
        return list(self.collect())

    def collect(self) -> Iterator[Any]:
        """The metric families of one scrape (``prometheus_client`` calls this)."""
        stats = self._read()
        core = self._core
        names = sorted(self._labels)
        values = [self._labels[name] for name in names]

        def counter(name: str, doc: str, value: float) -> Any:
            family = core.CounterMetricFamily(f"ptb_fence_{name}", doc, labels=names)
            family.add_metric(values, value)
            return family

        def gauge(name: str, doc: str, value: float) -> Any:
            family = core.GaugeMetricFamily(f"ptb_fence_{name}", doc, labels=names)
            family.add_metric(values, value)
            return family

        def by(kind: Any, name: str, doc: str, label: str, pairs: Mapping[str, float]) -> Any:
            family = kind(f"ptb_fence_{name}", doc, labels=names + [label])
            for key, value in sorted(pairs.items()):
                family.add_metric(values + [key], value)
            return family

        def histogram(
            name: str, doc: str, label: Optional[str], series: Mapping[str, HistogramSnapshot]
        ) -> Any:
            family = core.HistogramMetricFamily(
                f"ptb_fence_{name}", doc, labels=names + ([label] if label else [])
            )
            for key, snap in sorted(series.items()):
                family.add_metric(
                    values + ([key] if label else []),
                    [(_le(bound), count) for bound, count in snap.buckets],
                    snap.sum,
                )
            return family

        yield counter("updates_recorded", "Updates recorded by this process.",
                      stats.updates_recorded)
        yield counter("updates_duplicate", "Redeliveries not recorded again (id known).",
                      stats.updates_duplicate)
        yield counter("updates_invalid", "Bodies refused as not a Telegram update.",
                      stats.updates_invalid)
        yield counter("ingest_errors", "Recordings that failed with a store error.",
                      stats.ingest_errors)
        yield counter("attempts_started", "Attempts claimed by this process.",
                      stats.attempts_started)
        yield by(core.CounterMetricFamily, "attempts_ended", "Ended attempts by outcome.",
                 "outcome", stats.attempts_ended)
        yield gauge("attempts_running", "Handlers running now.", stats.attempts_running)
        yield gauge("claims_held", "Claims held and renewed by this process now.",
                    stats.claims_held)
        yield gauge("handlers_left_running",
                    "Handlers let go after their attempt ended (timeout, stop) that still run.",
                    stats.handlers_left_running)
        yield counter("lease_renewal_failures", "Lease renewals that failed or were refused.",
                      stats.lease_renewal_failures)
        # every step from the start, at 0: rate() and increase() need the series before the
        # first error, and an alert on it must not wait for one
        yield by(core.CounterMetricFamily, "store_errors", "Store errors by step.", "step",
                 {**dict.fromkeys(STORE_ERROR_STEPS, 0), **stats.store_errors})
        yield histogram("handler_duration_seconds", "Handler durations.", None,
                        {"": stats.handler_seconds})
        yield histogram("store_call_duration_seconds", "Store call durations by operation.",
                        "operation",
                        {**dict.fromkeys(STORE_OPERATIONS, _EMPTY_STORE_HISTOGRAM),
                         **stats.store_seconds})

        # what the store holds, the same in every process sharing it: labelled scope="store",
        # to be aggregated with max() (a sum() over the processes would count it once per
        # process)
        def store_gauge(name: str, doc: str, value: float) -> Any:
            family = core.GaugeMetricFamily(f"ptb_fence_{name}", doc, labels=names + ["scope"])
            family.add_metric(values + ["store"], value)
            return family

        def store_states(name: str, doc: str, counts: Mapping[str, float]) -> Any:
            family = core.GaugeMetricFamily(f"ptb_fence_{name}", doc,
                                            labels=names + ["scope", "state"])
            for state, count in sorted(counts.items()):
                family.add_metric(values + ["store", state], count)
            return family

        if stats.unsettled is not None:
            yield store_gauge("unsettled_updates",
                              "Updates pending, running or failed in the store (max() across "
                              "processes).", stats.unsettled)
        if stats.oldest_unsettled_age_seconds is not None:
            yield store_gauge("oldest_unsettled_update_age_seconds",
                              "Age of the oldest unsettled update in the store (max() across "
                              "processes).", stats.oldest_unsettled_age_seconds)
        if stats.exhaustions_waiting is not None:
            yield store_gauge("exhaustions_waiting",
                              "Unacknowledged exhaustions in the store (max() across processes).",
                              stats.exhaustions_waiting)
        yield by(core.CounterMetricFamily, "outbox_sends",
                 "Outbox calls sent, failed or retried by this process.", "result",
                 {"sent": stats.calls_sent, "failed": stats.calls_failed,
                  "retried": stats.calls_retried})
        if stats.outbox is not None:
            yield store_states("outbox_calls", "Outbox calls in the store by state (max() "
                               "across processes).", stats.outbox)
        yield by(core.CounterMetricFamily, "broadcast_sends",
                 "Broadcast recipients this process recorded, by result (retried: put back "
                 "for a later try).", "result", dict(stats.broadcast_sends))
        if stats.broadcast_recipients is not None:
            yield store_states("broadcast_recipients", "Broadcast recipients in the store by "
                               "state (max() across processes).", stats.broadcast_recipients)
        yield gauge("job_runs_running",
                    "Runs of durable jobs this process holds claims on now.",
                    stats.job_runs_running)
        yield counter("job_runs_failed",
                      "Attempts at durable job runs that failed in this process, a retry "
                      "scheduled.", stats.job_runs_failed)
        yield counter("job_runs_exhausted",
                      "Durable job runs whose last attempt failed in this process.",
                      stats.job_runs_exhausted)
        if stats.jobs_due is not None:
            yield store_gauge("jobs_due",
                              "Durable jobs due and not yet fired (max() across processes).",
                              stats.jobs_due)
        if stats.jobs_late_seconds is not None:
            yield store_gauge("jobs_late_seconds",
                              "How late the most overdue due durable job is, 0 when none is "
                              "due (max() across processes).", stats.jobs_late_seconds)
        if stats.last_sweep_at is not None:
            yield gauge("last_sweep_timestamp_seconds",
                        "When a sweep of this process last read the store (epoch seconds).",
                        stats.last_sweep_at)
        if stats.last_renewal_tick_at is not None:
            yield gauge("last_lease_tick_timestamp_seconds",
                        "When this process's lease keeper last ran (epoch seconds).",
                        stats.last_renewal_tick_at)
        info = core.GaugeMetricFamily(
            "ptb_fence_build_info",
            "The versions this process runs (always 1).",
            labels=names + ["version", "python_telegram_bot", "python"],
        )
        info.add_metric(values + list(_build()), 1)
        yield info


def register(
    source: StatsSource,
    registry: Any = None,
    *,
    labels: Optional[Mapping[str, str]] = None,
) -> StatsCollector:
    """Register the metrics of ``source`` on ``registry`` and return the collector.

    Args:
        source: A processor (``FencedUpdateProcessor``, ``DurableUpdateProcessor``) or an
            :class:`~ptb_fence.UpdateIntake`, or a callable returning
            :class:`~ptb_fence.Stats`.
        registry: A ``prometheus_client.CollectorRegistry`` (default: the global
            ``prometheus_client.REGISTRY``).
        labels: Constant labels on every metric, to tell several bots apart in one registry
            (registering two sources with the same labels is refused by ``prometheus_client``).

    Raises:
        ImportError: ``prometheus_client`` is not installed (install ``ptb_fence[metrics]``).
        TypeError: ``source`` has no ``stats()`` and is not callable.
    """
    collector = StatsCollector(source, labels)
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    registry.register(collector)
    return collector
