"""Records that used to stop the indexer for good (issue 8, findings 1 and 2) go through a real
worker process on the real broker: each poison record is dead-lettered or applied, the good
records around it land, the offsets reach the end of the topic and the worker stays up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka import KafkaProducer

from services.core.settings import Settings
from tests.support.graph import scalar, wait_processed
from tests.support.workers import (
    Published,
    assert_all_committed,
    sample_lines,
    start_worker,
    stop_workers,
)

pytestmark = pytest.mark.integration

PLAIN = {  # no title, no named entity (finding 1)
    "event_id": "ne-1",
    "type": "upsert",
    "doc_id": "plain-1",
    "text": "hello world",
    "occurred_at": "2024-01-01T00:00:00Z",
}
NUL_IDS = {**PLAIN, "event_id": "nul\u0000event", "doc_id": "nul\u0000doc"}  # finding 2b
OVERSIZE = {**PLAIN, "event_id": "big-1", "doc_id": "big-1", "text": "x" * 300_000}


def publish_raw(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> list[Published]:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        futures = [(k, producer.send(topic, key=k, value=v)) for k, v in records]
        producer.flush(timeout=60)
        return [
            Published(k.decode("utf-8", "replace"), f.get(60).partition, f.get(60).offset)
            for k, f in futures
        ]
    finally:
        producer.close(timeout=10)


def test_poison_records_never_stall_the_stream(settings: Settings, tmp_path: Path) -> None:
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    good = [line.encode() for line in sample_lines()[:8]]
    poison = [
        (b"plain-1", json.dumps(PLAIN).encode()),
        (b"nul\x00doc", json.dumps(NUL_IDS).encode()),
        (b"big-1", json.dumps(OVERSIZE).encode()),
        (b"junk", b"{not json"),
    ]
    records = [(str(json.loads(g)["doc_id"]).encode(), g) for g in good[:4]]
    records += poison + [(str(json.loads(g)["doc_id"]).encode(), g) for g in good[4:]]
    worker = start_worker(
        settings.model_copy(update={"max_document_bytes": 200_000}), tmp_path / "indexer.log"
    )
    try:
        assert_all_committed(
            worker, settings, publish_raw(bootstrap, settings.documents_topic, records)
        )
    finally:
        stop_workers([worker])
    assert wait_processed(url, 9, timeout=5) >= 9  # 8 good + the plain document
    applied = scalar(url, "SELECT count(*) FROM processed_events WHERE outcome = 'applied'")
    assert applied == 9
    reasons = scalar(url, "SELECT array_agg(reason ORDER BY reason) FROM dead_letters")
    assert len(reasons) == 3
    assert {"invalid_json", "oversize"} <= set(reasons)
    assert scalar(url, "SELECT count(*) FROM dead_letters WHERE published_at IS NULL") == 0
