"""Every metric the Grafana dashboards, the built-in dashboard and the alert rules use is listed
in docs/metrics.md (whose tables another test checks against the code's registries), and the
Grafana dashboard's queries are valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy import (
    GRAFANA,
    PROMETHEUS,
    ROOT,
    load_yaml,
    metric_catalogue,
    metric_names,
)
from tests.support.tools import require_tool

DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
BUILTIN_DASHBOARD = sorted((ROOT / "services" / "query_api" / "static").glob("dashboard*.js"))
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _dashboard_expressions(path: Path) -> list[str]:
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    return [
        target["expr"]
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
        if "expr" in target
    ]


def _alert_expressions() -> list[str]:
    groups = load_yaml(PROMETHEUS / "alerts.yml")["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def _unlisted(expressions: list[str]) -> set[str]:
    catalogue = metric_catalogue()
    used = set().union(*(metric_names(e, catalogue) for e in expressions))
    return used - set(catalogue)


def test_the_catalogue_parses() -> None:
    catalogue = metric_catalogue()
    assert catalogue["kgstream_indexer_events_total"] == "counter"
    assert catalogue["kgstream_indexer_freshness_seconds"] == "histogram"
    assert catalogue["process_start_time_seconds"] == "gauge"
    assert len(catalogue) >= 30


def test_names_are_extracted_with_histogram_suffixes_stripped() -> None:
    catalogue = {"kgstream_a_seconds": "histogram", "kgstream_b_count": "gauge"}
    expr = (
        'histogram_quantile(0.9, rate(kgstream_a_seconds_bucket{job="kgstream-indexer"}[5m]))'
        " + kgstream_b_count + kgstream_c_total + process_start_time_seconds"
    )
    assert metric_names(expr, catalogue) == {
        "kgstream_a_seconds",
        "kgstream_b_count",  # a gauge that ends in _count keeps its name
        "kgstream_c_total",
        "process_start_time_seconds",
    }
    # against the real catalogue none of them is listed (and _bucket stays: not a histogram there)
    unlisted = {"kgstream_a_seconds_bucket", "kgstream_b_count", "kgstream_c_total"}
    assert _unlisted([expr]) == unlisted


def test_alert_rules_use_only_catalogued_metrics() -> None:
    expressions = _alert_expressions()
    assert len(expressions) >= 7
    assert _unlisted(expressions) == set()


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_grafana_dashboard_uses_only_catalogued_metrics(path: Path) -> None:
    expressions = _dashboard_expressions(path)
    assert len(expressions) >= 20
    assert _unlisted(expressions) == set()


def test_builtin_dashboard_uses_only_catalogued_metrics() -> None:
    """The built-in /dashboard (services/query_api/static/dashboard*.js), when present."""
    if not BUILTIN_DASHBOARD:
        pytest.skip("no services/query_api/static/dashboard*.js in this tree yet")
    text = "\n".join(p.read_text(encoding="utf-8") for p in BUILTIN_DASHBOARD)
    assert _unlisted([text]) == set()


def test_grafana_dashboard_covers_what_an_operator_watches() -> None:
    (path,) = DASHBOARDS
    catalogue = metric_catalogue()
    used = set().union(*(metric_names(e, catalogue) for e in _dashboard_expressions(path)))
    assert {
        "kgstream_indexer_events_total",
        "kgstream_indexer_freshness_seconds",
        "kgstream_indexer_consumer_lag",
        "kgstream_indexer_dead_letters_total",
        "kgstream_communities_change_ratio",
        "kgstream_communities_change_threshold",
        "kgstream_communities_snapshot_age_seconds",
        "kgstream_communities_recompute_seconds",
        "kgstream_query_requests_total",
        "kgstream_query_seconds",
        "kgstream_model_tokens_total",
        "kgstream_db_pool_connections",
    } <= used


def test_grafana_dashboard_panels_use_the_provisioned_datasource() -> None:
    uid = load_yaml(DATASOURCES)["datasources"][0]["uid"]
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        panels = list(_panels(dashboard["panels"]))
        ids = [panel["id"] for panel in panels]
        assert len(ids) == len(set(ids)), path.name
        for panel in panels:
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == uid, panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == uid, panel["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_grafana_queries_are_valid_promql(path: Path, tmp_path: Path) -> None:
    """promtool parses each query as a recording rule (Grafana's $__rate_interval → 5m)."""
    promtool = require_tool("promtool")
    rules = [
        {"record": f"kgstream:dashboard_query_{i}", "expr": re.sub(r"\$__\w+", "5m", expr)}
        for i, expr in enumerate(_dashboard_expressions(path))
    ]
    rules_file = tmp_path / "dashboard-rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(rules_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
