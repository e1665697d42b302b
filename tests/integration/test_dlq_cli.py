"""`kgstream dlq list|replay` against the real database and broker."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from kafka import KafkaConsumer, TopicPartition

from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, RawRecord, handle_record
from tests.support.cli import kgstream

pytestmark = pytest.mark.integration


async def test_list_and_replay(deps: IndexerDeps, settings: Settings) -> None:
    raw = json.dumps(
        {
            "event_id": "big-1",
            "type": "upsert",
            "doc_id": "big",
            "text": "x" * 300,
            "occurred_at": "2024-01-01T00:00:00Z",
        }
    ).encode()
    small = replace(deps, max_document_bytes=100)
    outcome = await handle_record(small, RawRecord(settings.documents_topic, 0, 7, b"big", raw))
    assert outcome == "dead_lettered"

    listed = kgstream(settings, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (letter,) = json.loads(listed.stdout)
    assert letter["reason"] == "oversize"
    assert letter["offset"] == 7
    assert letter["key"] == "big"

    missing = kgstream(settings, "dlq", "replay", "--id", "999")
    assert missing.returncode == 2
    assert "no unreplayed dead letter with id [999]" in missing.stderr

    replayed = kgstream(settings, "dlq", "replay", "--id", str(letter["id"]))
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1 dead letter(s)" in replayed.stdout
    consumer = KafkaConsumer(
        bootstrap_servers=str(settings.kafka_bootstrap_servers), consumer_timeout_ms=5000
    )
    parts = [TopicPartition(settings.documents_topic, p) for p in (0, 1)]
    consumer.assign(parts)
    consumer.seek_to_beginning()
    values = [m.value for m in consumer]
    consumer.close()
    assert values == [raw]
    after = json.loads(kgstream(settings, "dlq", "list", "--json").stdout)
    assert after == []
