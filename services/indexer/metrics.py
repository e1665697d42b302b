"""Prometheus metrics of the indexer process."""

from __future__ import annotations

from prometheus_client import Counter

OUTCOMES = Counter(
    "kgstream_indexer_events_total", "Document events handled, by outcome", ["outcome"]
)
