"""Two indexers in one consumer group share the 2-partition topic: every document lands once,
no event is applied twice, both do part of the work, and the graph their concurrent writes
leave equals a clean single-process build."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from tests.support.graph import canonical_graph, clean_graph, graph_diff, scalar, wait_processed
from tests.support.workers import (
    end_offsets,
    publish_lines,
    sample_lines,
    start_worker,
    stop_workers,
    wait_committed,
    wait_ready,
)

pytestmark = pytest.mark.integration

# CPU seconds an indexer spends on its share of the sample (chunk, embed, extract, merge); an
# idle member spends well under 0.5 s on heartbeats over the same time.
BUSY_CPU_S = 1.0


def test_two_indexers_share_the_topic(
    settings: Settings,
    tmp_path: Path,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    topic, lines = settings.documents_topic, sample_lines()
    workers = [start_worker(settings, tmp_path / f"indexer-{i}.log") for i in (1, 2)]
    try:
        # Both members in the group before anything is published, so each owns a partition.
        assert wait_ready(workers), [w.output()[-2000:] for w in workers]
        idle = [w.cpu_seconds() for w in workers]
        published = publish_lines(bootstrap, topic, lines)
        assert {p.partition for p in published} == {0, 1}
        assert wait_processed(url, 48, timeout=180) == 48, [w.output()[-2000:] for w in workers]
        ends = end_offsets(published)
        committed = wait_committed(bootstrap, settings.consumer_group, topic, ends)
        assert all(committed.get(p, -1) >= e for p, e in ends.items()), committed
        busy = [w.cpu_seconds() - before for w, before in zip(workers, idle, strict=True)]
        assert all(w.alive() for w in workers)
    finally:
        stop_workers(workers)

    # Both did some of the work.
    assert min(busy) > BUSY_CPU_S, f"CPU seconds per worker while indexing: {busy}"
    # No lost document, no double work.
    assert scalar(url, "SELECT count(*) FROM documents WHERE NOT deleted") == 48
    assert scalar(url, "SELECT count(*) FROM processed_events") == 48
    assert scalar(url, "SELECT count(DISTINCT event_id) FROM processed_events") == 48
    assert scalar(url, "SELECT count(*) FROM processed_events WHERE outcome <> 'applied'") == 0
    assert scalar(url, "SELECT count(*) FROM dead_letters") == 0
    # Every node and edge was added once: no event's changes were logged twice.
    assert (
        scalar(
            url,
            "SELECT count(*) FROM (SELECT kind, ref_id FROM graph_changes WHERE op = 'add'"
            " GROUP BY kind, ref_id HAVING count(*) > 1) d",
        )
        == 0
    )
    got = canonical_graph(url)
    want = clean_graph(
        url, lines, embedder=embedder, extractor=extractor, executor=cpu_pool, settings=settings
    )
    assert got == want, graph_diff(got, want)
