"""Prometheus metrics of the communities worker (docs/metrics.md, "Communities worker") and the
observer that feeds them; the composition root (app.py) hands it to the worker's tick."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

from services.communities.observer import CommunitiesObserver, Decision, Phase, Result
from services.communities.snapshots import PublishedState
from services.core.telemetry.models import PrometheusModelMeter

CHANGE_RATIO = Gauge(
    "kgstream_communities_change_ratio", "Graph change since the published snapshot (0..1)"
)
CHANGE_THRESHOLD = Gauge(
    "kgstream_communities_change_threshold", "The change ratio past which a recompute runs"
)
WITHHELD = Gauge(
    "kgstream_communities_withheld",
    "Published communities withheld from every caller for a delete since the snapshot",
)
SNAPSHOT_ID = Gauge(
    "kgstream_communities_snapshot_id", "Id of the published community snapshot (0 = none)"
)
SNAPSHOT_PUBLISHED = Gauge(
    "kgstream_communities_snapshot_published_timestamp_seconds",
    "When the published snapshot was published (0 = none)",
)
SNAPSHOT_AGE = Gauge(
    "kgstream_communities_snapshot_age_seconds",
    "Now minus the published snapshot's publication time, computed at scrape (0 = none)",
)
BY_LEVEL = Gauge(
    "kgstream_communities_by_level", "Communities in the published snapshot, by level", ["level"]
)
RECOMPUTE_SECONDS = Histogram(
    "kgstream_communities_recompute_seconds",
    "Duration of each phase of a recompute",
    ["phase"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
)
RECOMPUTES = Counter(
    "kgstream_communities_recomputes_total", "Recomputes run, by result", ["result"]
)
REPORTS = Counter(
    "kgstream_communities_reports_total", "Community reports, reused or generated", ["result"]
)
LOCK_WAIT = Histogram(
    "kgstream_communities_lock_wait_seconds",
    "Time spent asking for the recompute lock",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CHECKS = Counter("kgstream_communities_checks_total", "Scheduler checks, by decision", ["decision"])

for _result in ("published", "failed"):
    RECOMPUTES.labels(result=_result)
for _result in ("reused", "generated"):
    REPORTS.labels(result=_result)
for _decision in ("recompute", "wait", "locked"):
    CHECKS.labels(decision=_decision)

_published_at: list[float | None] = [None]
SNAPSHOT_AGE.set_function(
    lambda: 0.0 if _published_at[0] is None else time.time() - _published_at[0]
)


def show_snapshot(state: PublishedState | None) -> None:
    """Set the snapshot gauges to the published snapshot (None: there is none)."""
    _published_at[0] = None if state is None else state.published_at.timestamp()
    SNAPSHOT_ID.set(0 if state is None else state.id)
    SNAPSHOT_PUBLISHED.set(_published_at[0] or 0.0)
    levels = {} if state is None else state.by_level
    BY_LEVEL.clear()
    for level, count in sorted(levels.items()):
        BY_LEVEL.labels(level=str(level)).set(count)


class PrometheusCommunitiesObserver(PrometheusModelMeter, CommunitiesObserver):
    """The CommunitiesObserver (services/communities/observer.py) behind the metrics above."""

    def check(self, decision: Decision) -> None:
        """Count the check."""
        CHECKS.labels(decision=decision).inc()

    def change(self, ratio: float, threshold: float) -> None:
        """Set the ratio and the threshold."""
        CHANGE_RATIO.set(ratio)
        CHANGE_THRESHOLD.set(threshold)

    def withheld(self, communities: int) -> None:
        """Set the withheld gauge."""
        WITHHELD.set(communities)

    def lock_wait(self, seconds: float) -> None:
        """Observe the wait."""
        LOCK_WAIT.observe(seconds)

    def phase(self, phase: Phase, seconds: float) -> None:
        """Observe the phase."""
        RECOMPUTE_SECONDS.labels(phase=phase).observe(seconds)

    def recompute(self, result: Result) -> None:
        """Count the recompute."""
        RECOMPUTES.labels(result=result).inc()

    def reports(self, reused: int, generated: int) -> None:
        """Count the reports."""
        REPORTS.labels(result="reused").inc(reused)
        REPORTS.labels(result="generated").inc(generated)
