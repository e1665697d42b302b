"""An indexer killed mid-stream (SIGKILL: no shutdown, no final offset commit) loses nothing
and applies nothing twice: its successor in the same consumer group redelivers from the last
committed offset and the graph ends exactly as a clean run builds it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from tests.support.graph import (
    canonical_graph,
    clean_graph,
    graph_diff,
    processed_count,
    scalar,
    wait_processed,
)
from tests.support.workers import (
    end_offsets,
    publish_lines,
    sample_lines,
    start_worker,
    stop_workers,
    wait_committed,
)

pytestmark = pytest.mark.integration


def test_killed_worker_is_replaced_without_loss_or_double_apply(
    settings: Settings,
    tmp_path: Path,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    topic, lines = settings.documents_topic, sample_lines()
    first = start_worker(settings, tmp_path / "indexer-1.log")
    workers = [first]
    try:
        published = publish_lines(bootstrap, topic, lines)
        assert wait_processed(url, 10, timeout=120, poll=0.05) >= 10, first.output()[-3000:]
        first.kill()
        at_kill = processed_count(url)
        assert 10 <= at_kill < 48, f"killed after {at_kill} events: kill earlier"

        # Same group: it resumes from the committed offsets once the dead member's session
        # expires (~13 s on tansu: docs/architecture.md, "The embedded broker (tansu)").
        second = start_worker(settings, tmp_path / "indexer-2.log")
        workers.append(second)
        assert wait_processed(url, 48, timeout=180) == 48, second.output()[-3000:]
        ends = end_offsets(published)
        committed = wait_committed(bootstrap, settings.consumer_group, topic, ends)
        assert all(committed.get(p, -1) >= e for p, e in ends.items()), committed
        assert second.alive()
    finally:
        stop_workers(workers)

    assert scalar(url, "SELECT count(*) FROM processed_events") == 48
    assert scalar(url, "SELECT count(*) FROM processed_events WHERE outcome <> 'applied'") == 0
    assert scalar(url, "SELECT count(*) FROM dead_letters") == 0
    got = canonical_graph(url)
    want = clean_graph(
        url, lines, embedder=embedder, extractor=extractor, executor=cpu_pool, settings=settings
    )
    assert len(got["documents"]) == 48
    assert got == want, graph_diff(got, want)
