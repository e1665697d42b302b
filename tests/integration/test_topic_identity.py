"""A broker that forgot its log (memory storage, restarted) is noticed by the topic's id, what it
lost is recorded, the group reads the new log from its start and the events accepted over HTTP
and not handled yet are published again (issue 30: the chaos test's stall, and 202s lost with
the embedded broker). On 79715af a consumer kept its old position, and skipped the new log's
first records whenever publishers had refilled it past that position before its next fetch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core import accepted_events
from services.core.db.engine import make_engine
from services.core.producer import make_producer, send_all
from services.core.settings import Settings
from services.indexer.topic_identity import (
    Described,
    Loss,
    TopicWatch,
    describe_topic,
    reconcile,
    remember_ends,
    resume_at,
)
from tests.support.faults import create_topics, moved, own_broker
from tests.support.graph import scalar
from tests.support.records import event_ids_on
from tests.support.workers import publish_lines

pytestmark = pytest.mark.integration


def events(tag: str, n: int) -> list[dict[str, str]]:
    return [
        {"event_id": f"{tag}-{i}", "doc_id": f"doc-{i}", "type": "delete",
         "occurred_at": "2024-01-01T00:00:00Z"}
        for i in range(n)
    ]  # fmt: skip


def lines(tag: str, n: int) -> list[str]:
    return [json.dumps(e) for e in events(tag, n)]


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


async def seed_old_log_state(engine: AsyncEngine, group: str, topic: str) -> None:
    """The indexer applied offsets 0-2 of each partition and saw the ends at 6; the query API
    accepted three events (202), of which the indexer handled one."""
    async with engine.begin() as conn:
        for p in (0, 1):
            await conn.execute(
                text(
                    "INSERT INTO indexer_progress (consumer_group, topic, partition,"
                    " next_offset) VALUES (:g, :t, :p, 3)"
                ),
                {"g": group, "t": topic, "p": p},
            )
        await remember_ends(conn, group, topic, {0: 6, 1: 6})
        await accepted_events.keep(conn, events("http", 3))
        await conn.execute(
            text(
                "INSERT INTO processed_events (event_id, doc_id, outcome)"
                " VALUES ('http-0', 'doc-0', 'deleted')"
            )
        )


def watched(bootstrap: str, topic: str, started_with: str) -> str:
    """What a running indexer's watch says now ("" for nothing)."""
    watch = TopicWatch(bootstrap, topic, started_with)
    try:
        return watch.replaced() or ""
    finally:
        watch.close()


async def test_a_replaced_topic_is_reported_and_read_from_its_start(
    settings: Settings, tmp_path: Path
) -> None:
    url, group = str(settings.database_url), settings.consumer_group
    with own_broker(tmp_path, settings) as broker:
        own = moved(settings, kafka_bootstrap_servers=broker.bootstrap)
        bootstrap, topic = broker.bootstrap, own.documents_topic
        publish_lines(bootstrap, topic, lines("old", 12))
        first = describe_topic(bootstrap, topic)
        assert first is not None
        engine = make_engine(url)

        def republish(records: list[tuple[bytes, bytes]]) -> int:
            producer = make_producer(bootstrap, own, timeout_s=10)
            try:
                return send_all(producer, topic, records, timeout_s=30)
            finally:
                producer.close(timeout=5)

        async def again(described: Described) -> object:
            return await reconcile(engine, group, topic, described, republish=republish)

        try:
            assert await again(first) is None
            await seed_old_log_state(engine, group, topic)
            commit(bootstrap, group, topic, {0: 3, 1: 3})
            assert await again(first) is None  # same log

            broker.stop()
            broker.start()
            create_topics(bootstrap, own)
            publish_lines(bootstrap, topic, lines("new", 12))  # refilled past position 3
            # A consumer that kept its position committed it in the new log (the race).
            commit(bootstrap, group, topic, {0: 3, 1: 3})
            second = describe_topic(bootstrap, topic)
            assert second is not None
            assert second != first
            assert "replaced topic" in watched(bootstrap, topic, first.topic_id)
            assert watched(bootstrap, topic, second.topic_id) == ""

            loss = await again(second)
            assert isinstance(loss, Loss)
            assert loss.ranges == {0: (3, 6), 1: (3, 6)}
            assert loss.records == 6
            assert loss.republished == 2
            assert "at least 6 records" in loss.describe()
            on_topic = event_ids_on(bootstrap, topic)
            assert [e for e in on_topic if e.startswith("http")] == ["http-1", "http-2"]
            # The broker's committed offsets (3) belong to the old log: the partitions resume
            # at the group's own record, 0.
            assert committed(bootstrap, group, topic) == {0: 3, 1: 3}
            async with engine.connect() as conn:
                assert await resume_at(conn, group, topic, {0: 3, 1: 3}) == {0: 0, 1: 0}
                assert await resume_at(conn, group, topic, {0: None, 1: 0}) == {}
            row = scalar(url, "SELECT records || '/' || republished FROM broker_losses")
            assert row == "6/2"
            # Started again on the same log: nothing more to do.
            assert await again(second) is None
            assert scalar(url, "SELECT count(*) FROM broker_losses") == 1
        finally:
            await engine.dispose()
