"""Alert rules, their tests, the dashboard and the runbook agree with each other and the code."""

from __future__ import annotations

import json
import re
from typing import Any

import prometheus_client
import pytest
import yaml

import consumer.metrics
import outbox_relay.metrics
from tests.support.services import ROOT

DEPLOY = ROOT / "deploy"
RULES = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())["groups"]
ALERTS = [rule for group in RULES for rule in group["rules"] if "alert" in rule]
# Series Prometheus adds itself for every scrape target.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
KEYWORDS = {
    "by",
    "without",
    "and",
    "or",
    "unless",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
}
IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def exported() -> set[str]:
    """Every sample name the relay's and the consumer's metrics can produce."""
    assert consumer.metrics.CONSUMED is not None  # the modules register on import
    assert outbox_relay.metrics.PUBLISHED is not None
    names: set[str] = set()
    for family in prometheus_client.REGISTRY.collect():
        base = family.name
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"),
        }.get(family.type, ("",))
        names.update(base + s for s in suffixes)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, labels and keywords left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in IDENTIFIER.finditer(text):
        rest = text[match.end() :].lstrip()
        word = match.group()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "inorder.json").read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def test_metric_names_are_found_in_expressions() -> None:
    """The PromQL reader finds metric names and skips functions, labels and grouping."""
    expr = 'sum by (le) (rate(a_bucket{x="y z"}[5m])) / sum(b_total) > 0 and absent(up{job="r"})'
    assert metric_names(expr) == {"a_bucket", "b_total", "up"}


@pytest.mark.parametrize("expr", [a["expr"] for a in ALERTS] + dashboard_exprs())
def test_every_expression_names_an_exported_metric(expr: str) -> None:
    """Each alert and dashboard expression reads only metrics the code exports."""
    unknown = metric_names(expr) - exported() - SYNTHETIC
    assert not unknown, f"{expr!r} reads metrics nobody exports: {sorted(unknown)}"


def test_dashboard_shows_what_sres_watch() -> None:
    """The dashboard covers consumption, staleness, parking, gaps, dead letters, lag, outbox."""
    read = set().union(*(metric_names(e) for e in dashboard_exprs()))
    for metric in (
        "events_consumed_total",
        "events_applied_total",
        "events_stale_total",
        "events_parked_current",
        "event_reorder_distance_bucket",
        "event_gaps_escalated_total",
        "gaps_open",
        "events_dead_lettered_total",
        "consumer_lag",
        "outbox_backlog_rows",
        "outbox_oldest_unpublished_age_seconds",
        "batches_assembled_total",
    ):
        assert metric in read, metric


def _anchors(markdown: str) -> set[str]:
    return {
        re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
        for line in markdown.splitlines()
        if line.startswith("## ")
    }


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a["alert"])
def test_every_alert_has_severity_summary_and_a_runbook_section(alert: dict[str, Any]) -> None:
    """Each alert carries a severity, a summary and a runbook_url to an existing section."""
    assert alert["labels"]["severity"] in ("warning", "critical")
    assert alert["annotations"]["summary"]
    path, _, anchor = alert["annotations"]["runbook_url"].partition("#")
    assert path == "deploy/runbook.md"
    assert anchor in _anchors((ROOT / path).read_text())


def test_runbook_has_a_section_for_each_alert_and_no_other() -> None:
    """The runbook's sections are exactly the alerts."""
    anchors = _anchors((DEPLOY / "runbook.md").read_text())
    assert anchors == {a["alert"].lower() for a in ALERTS}


def test_rule_tests_have_a_firing_and_a_quiet_case_per_alert() -> None:
    """rules.test.yml makes every alert fire once and stay quiet once."""
    cases = yaml.safe_load((DEPLOY / "prometheus" / "rules.test.yml").read_text())["tests"]
    firing, quiet = set(), set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {a["alert"] for a in ALERTS}
    assert firing == names
    assert quiet == names
