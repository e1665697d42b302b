"""Replaying the whole topic (the same events again, and a new consumer group reading from the
beginning) changes nothing: exactly-once effect on top of at-least-once delivery."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services.core.settings import Settings
from tests.support.graph import canonical_graph, graph_diff, scalar, wait_processed
from tests.support.workers import (
    end_offsets,
    publish_lines,
    sample_lines,
    start_worker,
    stop_workers,
    wait_committed,
)

pytestmark = pytest.mark.integration


def test_replayed_topic_leaves_graph_unchanged(settings: Settings, tmp_path: Path) -> None:
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    topic, lines = settings.documents_topic, sample_lines()
    assert len(lines) == 48
    first = start_worker(settings, tmp_path / "indexer-1.log")
    workers = [first]
    try:
        published = publish_lines(bootstrap, topic, lines)
        assert wait_processed(url, 48) == 48, first.output()[-3000:]
        before = canonical_graph(url)
        changes_before = scalar(url, "SELECT count(*) FROM graph_changes")
        assert len(before["documents"]) == 48

        # The same 48 events again (same event ids), to the group that has seen them ...
        published += publish_lines(bootstrap, topic, lines)
        ends = end_offsets(published)
        assert sum(ends.values()) == 96
        # ... and the whole topic from the beginning, to a group that has seen nothing.
        fresh_group = f"replay-{uuid.uuid4().hex[:8]}"
        second = start_worker(settings, tmp_path / "indexer-2.log", consumer_group=fresh_group)
        workers.append(second)
        for group in (settings.consumer_group, fresh_group):
            committed = wait_committed(bootstrap, group, topic, ends, timeout=120)
            assert all(committed.get(p, -1) >= e for p, e in ends.items()), (group, committed)
        assert first.alive()
        assert second.alive()
    finally:
        stop_workers(workers)

    after = canonical_graph(url)
    assert after == before, graph_diff(before, after)
    assert scalar(url, "SELECT count(*) FROM processed_events") == 48
    assert scalar(url, "SELECT count(DISTINCT event_id) FROM processed_events") == 48
    assert scalar(url, "SELECT count(*) FROM processed_events WHERE outcome <> 'applied'") == 0
    # Duplicates touch nothing, so they log no graph changes either.
    assert scalar(url, "SELECT count(*) FROM graph_changes") == changes_before
    assert scalar(url, "SELECT count(*) FROM dead_letters") == 0
