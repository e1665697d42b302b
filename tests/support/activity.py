"""A database with an operating history for status and dashboard tests: sample documents
published to the real broker and applied through the indexer's handler (records carry their
Kafka timestamps, so freshness since publication is real), two of them extracted by the
OpenAI-compatible stub (token use), one poison record (a dead letter), one record left on the
topic (lag), and one real community recompute (a snapshot with its duration)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from services.communities.app import leiden_config
from services.communities.recompute import RecomputeDeps, recompute
from services.communities.reports import ExtractiveWriter
from services.core.db.engine import make_engine
from services.core.embedding import Embedder
from services.core.llm import OpenAIExtractor, make_openai_client
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, RawRecord, handle_batch
from tests.support.openai_stub import OpenAIStub

SAMPLE = Path(__file__).resolve().parents[2] / "services" / "cli" / "sample" / "events.jsonl"
DOCUMENTS = 8  # applied with spaCy; 2 more with the LLM stub; 1 poison; 1 left waiting
POISON = b"{not json"


@dataclasses.dataclass(frozen=True)
class History:
    applied: int
    dead_letters: int
    lag: int
    snapshot_id: int


def _events(n: int, occurred_ago_s: float) -> list[dict[str, Any]]:
    """``n`` sample events with fresh ids, occurred ``occurred_ago_s`` seconds ago."""
    at = (datetime.now(UTC) - timedelta(seconds=occurred_ago_s)).isoformat()
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:n]
    return [
        {**json.loads(line), "event_id": f"ops-{uuid.uuid4().hex[:10]}", "occurred_at": at}
        for line in lines
    ]


def _publish(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for value in values:
            producer.send(topic, value=value, partition=0).get(30)
    finally:
        producer.close()


def _read(bootstrap: str, topic: str, n: int) -> list[RawRecord]:
    """The first ``n`` records of partition 0, as the indexer's agent hands them over."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    records: list[RawRecord] = []
    try:
        for _ in range(100):
            for batch in consumer.poll(timeout_ms=500).values():
                records += [
                    RawRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp / 1000)
                    for r in batch
                ]
            if len(records) >= n:
                break
    finally:
        consumer.close()
    return sorted(records, key=lambda r: r.offset)[:n]


async def build_history(
    deps: IndexerDeps, settings: Settings, embedder: Embedder, stub: OpenAIStub
) -> History:
    """Everything in the module docstring, on ``deps``' database and ``settings``' topic."""
    bootstrap, topic = str(settings.kafka_bootstrap_servers), settings.documents_topic
    spacy_events = _events(DOCUMENTS, occurred_ago_s=20)
    llm_events = [
        {**e, "doc_id": f"llm-{e['doc_id']}"} for e in _events(DOCUMENTS + 2, 20)[DOCUMENTS:]
    ]
    waiting = _events(1, 5)[0] | {"doc_id": "still-waiting"}
    values = [json.dumps(e).encode() for e in spacy_events] + [POISON]
    values += [json.dumps(e).encode() for e in [*llm_events, waiting]]
    _publish(bootstrap, topic, values)
    records = _read(bootstrap, topic, len(values) - 1)  # the last one stays on the topic
    outcomes = await handle_batch(deps, records[: DOCUMENTS + 1])
    llm = OpenAIExtractor(make_openai_client(Settings(openai_base_url=stub.base_url)), "stub-llm")
    outcomes += await handle_batch(
        dataclasses.replace(deps, extractor=llm), records[DOCUMENTS + 1 :]
    )
    assert outcomes.count("applied") == DOCUMENTS + 2, outcomes
    assert outcomes.count("dead_lettered") == 1, outcomes
    assert settings.database_url is not None
    community = RecomputeDeps(
        engine=make_engine(settings.database_url),
        database_url=settings.database_url,
        leiden=leiden_config(settings),
        writer=ExtractiveWriter(),
        embedder=embedder,
    )
    try:
        result = await recompute(community, "test")
    finally:
        await community.engine.dispose()
    return History(DOCUMENTS + 2, 1, 1, result.snapshot.id)
