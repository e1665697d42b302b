"""A broker that forgot its log (memory storage, restarted) is noticed by the topic's id, what it
lost is recorded, and the group reads the new log from its start (issue 30, the chaos test's
stall): on 79715af a consumer kept its old position, and skipped the new log's first records
whenever publishers had refilled it past that position before its next fetch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from services.core.db.engine import make_engine
from services.core.settings import Settings
from services.indexer.topic_identity import TopicWatch, read_topic_id, reconcile, remember_ends
from tests.support.faults import create_topics, moved, own_broker
from tests.support.graph import scalar
from tests.support.workers import publish_lines

pytestmark = pytest.mark.integration


def lines(tag: str, n: int) -> list[str]:
    return [
        json.dumps({"event_id": f"{tag}-{i}", "doc_id": f"doc-{i}", "type": "delete",
                    "occurred_at": "2024-01-01T00:00:00Z"})
        for i in range(n)
    ]  # fmt: skip


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        parts = sorted(consumer.partitions_for_topic(topic) or ())
        return {p: consumer.committed(TopicPartition(topic, p)) for p in parts}
    finally:
        consumer.close()


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        consumer.commit(
            {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        )
    finally:
        consumer.close()


async def test_a_replaced_topic_is_reported_and_read_from_its_start(
    settings: Settings, tmp_path: Path
) -> None:
    url, group = str(settings.database_url), settings.consumer_group
    with own_broker(tmp_path, settings) as broker:
        own = moved(settings, kafka_bootstrap_servers=broker.bootstrap)
        bootstrap, topic = broker.bootstrap, own.documents_topic
        publish_lines(bootstrap, topic, lines("old", 12))
        first = read_topic_id(bootstrap, topic)
        assert first is not None
        engine = make_engine(url)
        try:
            assert await reconcile(engine, bootstrap, group, topic, first) is None
            # The indexer applied offsets 0-2 of each partition and saw the ends at 6.
            async with engine.begin() as conn:
                for p in (0, 1):
                    await conn.exec_driver_sql(
                        "INSERT INTO indexer_progress (consumer_group, topic, partition,"
                        f" next_offset) VALUES ('{group}', '{topic}', {p}, 3)"
                    )
                await remember_ends(conn, group, topic, {0: 6, 1: 6})
            commit(bootstrap, group, topic, {0: 3, 1: 3})
            assert await reconcile(engine, bootstrap, group, topic, first) is None  # same log

            broker.stop()
            broker.start()
            create_topics(bootstrap, own)
            publish_lines(bootstrap, topic, lines("new", 12))  # refilled past position 3
            # A consumer that kept its position committed it in the new log (the race).
            commit(bootstrap, group, topic, {0: 3, 1: 3})
            second = read_topic_id(bootstrap, topic)
            assert second is not None
            assert second != first
            reason = TopicWatch(bootstrap, topic, first).replaced()
            assert reason is not None
            assert "replaced topic" in reason
            assert TopicWatch(bootstrap, topic, second).replaced() is None

            loss = await reconcile(engine, bootstrap, group, topic, second)
            assert loss is not None
            assert loss.ranges == {0: (3, 6), 1: (3, 6)}
            assert loss.records == 6
            assert "at least 6 records" in loss.describe()
            assert committed(bootstrap, group, topic) == {0: 0, 1: 0}
            assert scalar(url, "SELECT count(*) FROM indexer_progress") == 0
            row = scalar(url, "SELECT row(records, ranges::text) FROM broker_losses")
            assert "6" in str(row)
            # Started again on the same log: nothing more to do.
            assert await reconcile(engine, bootstrap, group, topic, second) is None
            assert scalar(url, "SELECT count(*) FROM broker_losses") == 1
        finally:
            await engine.dispose()
