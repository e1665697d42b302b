"""deploy/prometheus: the alert rules and the scrape configuration are valid for promtool, the
rules' unit tests pass (each alert fires on one series and not on another), and every alert is
documented with a runbook section of docs/operations.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from tests.support.deploy import DOCS, PROMETHEUS, load_yaml, markdown_anchors
from tests.support.tools import require_tool

ALERTS = PROMETHEUS / "alerts.yml"
ALERT_TESTS = PROMETHEUS / "alerts.test.yml"
CONFIG = PROMETHEUS / "prometheus.yml"
KGSTREAM_JOBS = {"kgstream-indexer", "kgstream-communities", "kgstream-query-api"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool")
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, check=False
    )


def _rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def test_promtool_check_rules() -> None:
    result = _promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_promtool_check_config_loads_the_rules() -> None:
    result = _promtool("check", "config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_promtool_test_rules() -> None:
    result = _promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules_fails_when_an_expectation_is_wrong(tmp_path: Path) -> None:
    """The rule tests can fail: a copy whose stalled-indexer expectation is removed (so it
    expects silence where the alert fires) is rejected."""
    text = ALERT_TESTS.read_text(encoding="utf-8")
    marker = "  - name: lag with no events for 15 minutes fires IndexerStalled\n"
    start = text.index(marker)
    block_end = text.index("        exp_alerts:", start)
    next_test = text.index("  - name:", start + len(marker))
    broken = text[:block_end] + text[next_test:]
    (tmp_path / "alerts.yml").write_text(ALERTS.read_text(encoding="utf-8"))
    (tmp_path / "alerts.test.yml").write_text(broken)
    result = _promtool("test", "rules", str(tmp_path / "alerts.test.yml"))
    assert result.returncode != 0
    assert "KgstreamIndexerStalled" in result.stdout + result.stderr


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for case in load_yaml(ALERT_TESTS)["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in _rules()}
    assert names - fired == set(), "alerts no test fires"
    assert names - silent == set(), "alerts no test keeps silent"


def test_every_alert_has_summary_description_and_a_runbook_section() -> None:
    anchors = markdown_anchors((DOCS / "operations.md").read_text(encoding="utf-8"))
    for rule in _rules():
        annotations = rule["annotations"]
        assert annotations.get("summary"), rule["alert"]
        assert annotations.get("description"), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        runbook = annotations["runbook"]
        path, _, anchor = runbook.partition("#")
        assert path == "docs/operations.md", runbook
        assert anchor == rule["alert"].lower(), runbook
        assert anchor in anchors, f"docs/operations.md has no section for {rule['alert']}"


def test_the_scrape_jobs_are_the_ones_the_rules_name() -> None:
    jobs = {job["job_name"] for job in load_yaml(CONFIG)["scrape_configs"]}
    assert jobs >= KGSTREAM_JOBS
    named = set()
    for rule in _rules():
        named |= set(re.findall(r'job="([^"]+)"', rule["expr"]))
        for alternatives in re.findall(r'job=~"([^"]+)"', rule["expr"]):
            named |= set(alternatives.split("|"))
    assert named == KGSTREAM_JOBS


def test_freshness_and_staleness_thresholds_follow_the_design_and_settings() -> None:
    from services.core.settings import Settings

    rules = {rule["alert"]: rule["expr"] for rule in _rules()}
    assert 'since="published"' in rules["KgstreamFreshnessP99OverTarget"]
    assert re.search(r"\)\s*>\s*3\s*$", rules["KgstreamFreshnessP99OverTarget"].strip())
    bound = Settings.model_fields["communities_max_staleness_s"].default
    assert (
        f"kgstream_communities_snapshot_age_seconds > {bound:g}" in (rules["KgstreamSnapshotStale"])
    )
