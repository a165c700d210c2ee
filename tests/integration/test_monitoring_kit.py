"""The monitoring kit that ships in the package: Prometheus alert rules
(``ptb_fence/monitoring/alerts.yml``) and a Grafana dashboard (``grafana.json``).

Every metric a rule or a panel queries is one a real ``UpdateIntake`` exports; the rules pass
``promtool check rules`` and fire in ``promtool test rules`` on the series ptb_fence exports
(when ``promtool`` is installed: Debian's ``prometheus`` package); every counter is there at 0
from the first scrape; ``ptb_fence_build_info`` names the versions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
from typing import Any, Dict, List, Set

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import ptb_fence
from ptb_fence import MemoryUpdateStore, UpdateIntake
from ptb_fence.metrics import alert_rules_path, grafana_dashboard_path, register
from runtime_support import FakeClock, body

METRIC = re.compile(r"\bptb_fence_[a-z_]+\b")


def exported_samples() -> Dict[str, List[Any]]:
    """The samples of a scrape of a real intake, by sample name (every family present: a
    sweep read the store's figures and the outbox, the lease keeper ticked)."""
    clock = FakeClock()
    store = MemoryUpdateStore()
    store.add(1, body(1), clock.ms() - 5_000)
    intake = UpdateIntake(store, handle_attempt=lambda update, attempt: None, clock=clock)
    try:
        intake.runtime.sweep_done(0)
        intake.runtime.sweep_page(include_fresh=False)
        intake.runtime.keeper.tick()
        registry = CollectorRegistry()
        register(intake, registry)
        text = generate_latest(registry).decode()
    finally:
        intake.close()
    samples: Dict[str, List[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def rule_exprs(text: str) -> List[str]:
    """The ``expr:`` of every rule: with PyYAML when it is installed (not a dependency), else
    a minimal reader of the file's shape (one ``expr:`` line per rule)."""
    try:
        import yaml
    except ImportError:
        return [line.split("expr:", 1)[1].strip() for line in text.splitlines()
                if line.strip().startswith("expr:")]
    document = yaml.safe_load(text)
    return [rule["expr"] for group in document["groups"] for rule in group["rules"]]


def alert_names(text: str) -> List[str]:
    return re.findall(r"^\s*- alert: (\w+)$", text, re.M)


def test_the_kit_ships_beside_the_package() -> None:
    root = os.path.dirname(os.path.abspath(ptb_fence.__file__))
    assert alert_rules_path() == os.path.join(root, "monitoring", "alerts.yml")
    assert grafana_dashboard_path() == os.path.join(root, "monitoring", "grafana.json")
    assert os.path.isfile(alert_rules_path()) and os.path.isfile(grafana_dashboard_path())


def test_every_rule_queries_metrics_ptb_fence_exports() -> None:
    with open(alert_rules_path(), encoding="utf-8") as file:
        text = file.read()
    exprs = rule_exprs(text)
    assert len(exprs) == len(alert_names(text)) >= 8
    exported = set(exported_samples())
    for expr in exprs:
        named = set(METRIC.findall(expr))
        assert named, expr
        assert named <= exported, (expr, named - exported)
    wanted = {"PtbFenceUpdatesStuck", "PtbFenceExhaustionsUnacknowledged", "PtbFenceOutboxBacklog",
              "PtbFenceOutboxFailures", "PtbFenceStoreErrors", "PtbFenceNotTicking",
              "PtbFenceJobsLate"}
    assert wanted <= set(alert_names(text))
    # the store-wide gauges are aggregated with max(), never summed over the processes
    for expr in exprs:
        for gauge in ("unsettled_updates", "oldest_unsettled", "exhaustions_waiting",
                      "outbox_calls", "jobs_due", "jobs_late"):
            if gauge in expr:
                assert expr.lstrip().startswith("max ") and 'scope="store"' in expr, expr


def test_every_panel_queries_metrics_ptb_fence_exports() -> None:
    with open(grafana_dashboard_path(), encoding="utf-8") as file:
        dashboard = json.load(file)
    exported = set(exported_samples())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 15
    queried: Set[str] = set()
    for expr in exprs:
        named = set(METRIC.findall(expr))
        assert named <= exported, (expr, named - exported)
        queried |= named
        if 'scope="store"' in expr:
            assert expr.startswith("max"), expr
    # every family of the scrape has a panel (histograms by their buckets)
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in exported}
    shown = {re.sub(r"_(bucket|sum|count)$", "", name) for name in queried}
    assert families <= shown, families - shown
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_every_counter_is_there_at_zero_from_the_start_with_build_info() -> None:
    intake = UpdateIntake(MemoryUpdateStore(), handle=lambda update: None)
    registry = CollectorRegistry()
    register(intake, registry)
    text = generate_latest(registry).decode()
    intake.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    steps = {s.labels["step"]: s.value for s in families["ptb_fence_store_errors"].samples
             if s.name.endswith("_total")}
    assert steps == dict.fromkeys(["claim", "ingest", "outbox", "renew", "settle", "sweep"], 0)
    for family in families.values():
        if family.type == "counter":
            assert [s for s in family.samples if s.name.endswith("_total")], family.name
    operations = {s.labels["operation"]
                  for s in families["ptb_fence_store_call_duration_seconds"].samples}
    assert {"record", "claim", "renew", "settle", "sweep", "outbox"} <= operations
    (info,) = families["ptb_fence_build_info"].samples
    assert info.value == 1 and info.labels["version"] == ptb_fence.__version__
    import telegram

    assert info.labels["python_telegram_bot"] == telegram.__version__


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: prometheus)")
def test_promtool_checks_the_rules() -> None:
    result = subprocess.run([PROMTOOL, "check", "rules", alert_rules_path()],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: prometheus)")
def test_the_rules_fire_on_what_two_processes_export(tmp_path: Any) -> None:
    """Two processes of one bot export the same store gauges: the stuck-updates alert fires once
    with the store's figure (not twice it); a store error on a counter that was at 0 fires after
    its 5 minutes; a lease keeper that stopped fires; a process that ticks does not."""
    tests = tmp_path / "rules_test.yml"
    tests.write_text(textwrap.dedent(f"""\
        rule_files:
          - {alert_rules_path()}
        evaluation_interval: 1m
        tests:
          - interval: 1m
            input_series:
              - series: 'ptb_fence_oldest_unsettled_update_age_seconds{{scope="store", job="bot", bot="shop", instance="a"}}'
                values: '700+60x20'
              - series: 'ptb_fence_oldest_unsettled_update_age_seconds{{scope="store", job="bot", bot="shop", instance="b"}}'
                values: '700+60x20'
              - series: 'ptb_fence_store_errors_total{{step="sweep", job="bot", bot="shop", instance="a"}}'
                values: '0 0 0 5+5x15'
              - series: 'ptb_fence_last_lease_tick_timestamp_seconds{{job="bot", bot="shop", instance="a"}}'
                values: '0+60x20'
              - series: 'ptb_fence_last_lease_tick_timestamp_seconds{{job="bot", bot="shop", instance="b"}}'
                values: '0+60x5 300x15'
            alert_rule_test:
              - eval_time: 10m
                alertname: PtbFenceUpdatesStuck
                exp_alerts:
                  - exp_labels: {{severity: warning, job: bot, bot: shop}}
                    exp_annotations:
                      summary: "An update has waited more than 10 minutes to be handled"
                      description: "The oldest unsettled update of bot shop was received 21m 40s ago: updates pile up, or one keeps failing. See `ptb-fence status` and `ptb-fence list`."
              - eval_time: 6m
                alertname: PtbFenceStoreErrors
                exp_alerts: []
              - eval_time: 12m
                alertname: PtbFenceStoreErrors
                exp_alerts:
                  - exp_labels: {{severity: critical, job: bot, bot: shop, instance: a}}
                    exp_annotations:
                      summary: "The store has failed for 5 minutes"
                      description: "a (bot shop) meets 0.08 store errors a second: is the database up? Updates are not acknowledged to Telegram meanwhile (it keeps them 24 h)."
              - eval_time: 15m
                alertname: PtbFenceNotTicking
                exp_alerts:
                  - exp_labels: {{severity: critical, job: bot, bot: shop, instance: b}}
                    exp_annotations:
                      summary: "A process's lease keeper stopped"
                      description: "The lease keeper of b last ran 10m 0s ago (it runs every lease_seconds / 4): the process hangs; its /healthz answers 503."
        """))
    result = subprocess.run([PROMTOOL, "test", "rules", str(tests)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
