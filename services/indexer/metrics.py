"""Prometheus metrics of the indexer process (docs/metrics.md, "Indexer") and the observer that
feeds them; the composition root (app.py) hands ``PrometheusIndexerObserver`` to the handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.indexer_health import OffsetReader, read_progress
from services.core.telemetry.models import PrometheusModelMeter
from services.indexer.deps import Outcome
from services.indexer.observer import IndexerObserver, Since, Stage

OUTCOMES = Counter(
    "kgstream_indexer_events_total", "Document events handled, by outcome", ["outcome"]
)
DEAD_LETTERS = Counter(
    "kgstream_indexer_dead_letters_total", "Records dead-lettered, by reason", ["reason"]
)
BATCH_SIZE = Histogram(
    "kgstream_indexer_batch_size",
    "Records per batch handed to the handler",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
STAGE_SECONDS = Histogram(
    "kgstream_indexer_stage_seconds",
    "Time per batch in each indexing stage",
    ["stage"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
FRESHNESS_SECONDS = Histogram(
    "kgstream_indexer_freshness_seconds",
    "Commit time minus the event's occurred_at (since=occurred) or its Kafka record timestamp"
    " (since=published)",
    ["since"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400),
)
CONSUMER_LAG = Gauge(
    "kgstream_indexer_consumer_lag",
    "End offset minus the next offset to apply, per assigned partition (approximate on the"
    " embedded broker)",
    ["topic", "partition"],
)
CHUNKS = Counter(
    "kgstream_indexer_chunks_total",
    "Chunks of new document versions: kept from the stored version or embedded anew",
    ["result"],
)
TRANSIENT_RETRIES = Counter(
    "kgstream_indexer_transient_retries_total", "Retries of a batch held by a transient failure"
)

# The handlers' Outcome literals as the catalogue names them.
OUTCOME_LABELS: dict[str, str] = {
    "applied": "applied",
    "deleted": "deleted",
    "duplicate": "skipped_duplicate",
    "stale": "skipped_stale",
    "unchanged": "skipped_unchanged",
    "dead_lettered": "dead_lettered",
}


class PrometheusIndexerObserver(PrometheusModelMeter, IndexerObserver):
    """The IndexerObserver (services/indexer/observer.py) behind the metrics above."""

    def batch(self, size: int) -> None:
        """Observe the batch size."""
        BATCH_SIZE.observe(size)

    def outcome(self, outcome: Outcome) -> None:
        """Count the outcome under its catalogue label."""
        OUTCOMES.labels(outcome=OUTCOME_LABELS[outcome]).inc()

    def dead_letter(self, reason: str) -> None:
        """Count the dead letter by reason."""
        DEAD_LETTERS.labels(reason=reason).inc()

    def stage(self, stage: Stage, seconds: float) -> None:
        """Observe the stage's time."""
        STAGE_SECONDS.labels(stage=stage).observe(seconds)

    def freshness(self, since: Since, seconds: float) -> None:
        """Observe the event's freshness."""
        FRESHNESS_SECONDS.labels(since=since).observe(seconds)

    def chunks(self, reused: int, embedded: int) -> None:
        """Count reused and embedded chunks."""
        CHUNKS.labels(result="reused").inc(reused)
        CHUNKS.labels(result="embedded").inc(embedded)

    def transient_retry(self) -> None:
        """Count the retry."""
        TRANSIENT_RETRIES.inc()


for _label in OUTCOME_LABELS.values():  # every outcome is exported from the start, at 0
    OUTCOMES.labels(outcome=_label)
for _result in ("reused", "embedded"):
    CHUNKS.labels(result=_result)


class LagGauge:
    """Keeps ``kgstream_indexer_consumer_lag`` to the partitions this process owns."""

    def __init__(self, engine: AsyncEngine, offsets: OffsetReader, consumer_group: str) -> None:
        self.engine, self.offsets, self.group = engine, offsets, consumer_group
        self._shown: set[tuple[str, int]] = set()

    async def refresh(self, assigned: Iterable[tuple[str, int]]) -> None:
        """Lag of each assigned partition: the broker's end offset minus the group's next
        offset (indexer_progress; 0 before the first batch). Partitions no longer assigned
        are dropped; one whose end offset the broker does not give is left out."""
        owned = set(assigned)
        async with self.engine.connect() as conn:
            progress = await read_progress(conn)
        nexts = {
            (p.topic, p.partition): p.next_offset
            for p in progress
            if p.consumer_group == self.group
        }
        ends = await asyncio.to_thread(self.offsets.read, owned) if owned else {}
        shown = set()
        for topic, partition in sorted(owned):
            end = ends.get((topic, partition))
            if end is None:
                continue
            lag = max(0, end - nexts.get((topic, partition), 0))
            CONSUMER_LAG.labels(topic=topic, partition=str(partition)).set(lag)
            shown.add((topic, partition))
        for topic, partition in self._shown - shown:
            CONSUMER_LAG.remove(topic, str(partition))
        self._shown = shown
