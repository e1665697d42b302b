"""A large document does not hold up the other partitions (issue 18, finding 14): while the
real indexer process computes a document of ~160 chunks, one-line documents published after it
on the other partition are applied and committed; the events after it on its own partition
wait for it (the same document's update included), its partition's offset is not committed
past it, and a worker killed then loses nothing and applies nothing twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from services.core.chunking import Chunker
from services.core.settings import Settings
from tests.support.faults import wait_until
from tests.support.graph import scalar, wait_processed
from tests.support.workers import (
    sample_lines,
    start_worker,
    stop_workers,
    wait_committed,
    wait_ready,
)

pytestmark = pytest.mark.integration

LARGE_CHUNKS = 160  # ten compute slices at the default 16: seconds of CPU, not minutes
SMALL = 6


def large_text(settings: Settings) -> str:
    """The sample's texts, numbered so that no two chunks are the same, until they chunk into
    at least LARGE_CHUNKS."""
    texts = [json.loads(line)["text"] for line in sample_lines()]
    chunker = Chunker(settings.chunk_tokens, settings.chunk_overlap)
    paragraphs: list[str] = []
    while len(chunker.split("\n\n".join(paragraphs))) < LARGE_CHUNKS:
        paragraphs += [f"Part {len(paragraphs) + i}. {t}" for i, t in enumerate(texts[:12])]
    return "\n\n".join(paragraphs)


def upsert(doc_id: str, body: str, *, event_id: str | None = None, day: int = 1) -> dict[str, Any]:
    return {
        "event_id": event_id or doc_id,
        "type": "upsert",
        "doc_id": doc_id,
        "title": doc_id.replace("-", " ").title(),
        "text": body,
        "occurred_at": f"2024-01-{day:02d}T00:00:00Z",
    }


def send(producer: KafkaProducer, topic: str, event: dict[str, Any], partition: int) -> int:
    """Publish to that partition (keyed by doc_id, as publishers do); returns the offset."""
    key, value = event["doc_id"].encode(), json.dumps(event).encode()
    return int(producer.send(topic, key=key, value=value, partition=partition).get(60).offset)


def applied_order(url: str) -> list[str]:
    rows = scalar(
        url,
        "SELECT string_agg(event_id, ',' ORDER BY processed_at) FROM processed_events"
        " WHERE outcome = 'applied'",
    )
    return str(rows or "").split(",")


def test_small_documents_on_other_partitions_pass_a_large_one(
    settings: Settings, tmp_path: Path
) -> None:
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    topic = settings.documents_topic
    small = [
        upsert(f"note-{i}", f"Grace Hopper {i} worked on COBOL in Arlington.") for i in range(SMALL)
    ]
    behind = [  # after the large document on its partition: they must wait for it
        upsert("large", "A short second version.", event_id="large-v2", day=2),
        upsert("note-behind", "Ada Lovelace wrote the first program in London."),
    ]
    worker = start_worker(settings, tmp_path / "indexer-1.log")
    workers = [worker]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        assert wait_ready(workers), worker.output()[-3000:]
        large_at = send(producer, topic, upsert("large", large_text(settings)), 0)
        # Its own batch: the others arrive while its lane computes it.
        lane = "a large document holds"
        assert wait_until(lambda: lane in worker.output(), 60), worker.output()[-3000:]
        ends = {1: 1 + max(send(producer, topic, e, 1) for e in small)}
        for event in behind:
            send(producer, topic, event, 0)

        assert wait_processed(url, SMALL, timeout=180, poll=0.1) >= SMALL, worker.output()[-3000:]
        # The small documents of the other partition were applied before the large one ...
        assert sorted(applied_order(url)) == sorted(e["event_id"] for e in small)
        # ... and committed, while its own partition is not committed past it.
        committed = wait_committed(bootstrap, settings.consumer_group, topic, ends)
        assert committed.get(1, -1) >= ends[1], committed
        assert committed.get(0, -1) <= large_at, committed
        assert scalar(url, "SELECT count(*) FROM processed_events WHERE doc_id = 'large'") == 0

        # Killed while the large document is in its lane: the next worker redelivers it.
        worker.kill()
        second = start_worker(settings, tmp_path / "indexer-2.log")
        workers.append(second)
        total = SMALL + 1 + len(behind)
        assert wait_processed(url, total, timeout=300) == total, second.output()[-3000:]
    finally:
        producer.close(timeout=10)
        stop_workers(workers)

    # Its partition in order: the large document, then its update, then the note behind it.
    order = applied_order(url)
    assert len(order) == total, order
    assert order.index("large") < order.index("large-v2") < order.index("note-behind"), order
    assert scalar(url, "SELECT count(*) FROM chunks WHERE doc_id = 'large'") == 1
    assert scalar(url, "SELECT count(*) FROM dead_letters") == 0
