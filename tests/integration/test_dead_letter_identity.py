"""A dead letter is one record, not one broker offset (issue 18, finding 3): a broker that
starts its partitions at offset 0 again (tansu memory storage after a restart, or a topic
deleted and created again) hands out offsets that old dead letters already hold. Each new bad
record must still get its own row and its own publish to the dead-letter topic, while the same
record delivered twice (at-least-once) stays one dead letter."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from alembic import command
from services.core.db.migrations import alembic_config
from services.core.settings import Settings
from services.indexer.handlers import IndexerDeps, RawRecord, handle_record
from tests.conftest import Infra
from tests.support.faults import create_topics, moved, own_broker
from tests.support.graph import scalar
from tests.support.records import dlq_messages, rows
from tests.support.workers import (
    Published,
    assert_all_committed,
    publish_lines,
    start_worker,
    stop_workers,
)

pytestmark = pytest.mark.integration

BAD_RECORDS = 15  # the probe's figure: 15 dead-lettered, 8 of them lost


async def test_a_reused_offset_is_a_new_dead_letter(
    deps: IndexerDeps, infra: Infra, settings: Settings
) -> None:
    first = RawRecord("docs", 0, 5, b"k", b"{not json", timestamp=1_700_000_000.123)
    other_bytes = replace(first, value=b"{not json either")
    same_bytes_later = replace(first, timestamp=1_700_000_600.5)  # the same bad line, re-sent
    for rec in (first, first, other_bytes, same_bytes_later, other_bytes):
        assert await handle_record(deps, rec) == "dead_lettered"

    stored = await rows(
        deps,
        'SELECT raw, extract(epoch FROM record_timestamp), "offset" FROM dead_letters ORDER BY id',
    )
    assert [(bytes(r[0]), float(r[1]), r[2]) for r in stored] == [
        (b"{not json", 1_700_000_000.123, 5),
        (b"{not json either", 1_700_000_000.123, 5),
        (b"{not json", 1_700_000_600.5, 5),
    ]
    published = [json.loads(m) for m in dlq_messages(infra.bootstrap, settings.dlq_topic)]
    assert len(published) == 3  # the redeliveries were not published again
    assert [m["source"]["timestamp"] for m in published] == [
        "2023-11-14T22:13:20.123000+00:00",
        "2023-11-14T22:13:20.123000+00:00",
        "2023-11-14T22:23:20.500000+00:00",
    ]
    unpublished = await rows(deps, "SELECT count(*) FROM dead_letters WHERE published_at IS NULL")
    assert unpublished[0][0] == 0


def bad_lines(run: str) -> list[str]:
    """Records that fail the contract (no text, no occurred_at), keyed as the same documents in
    every run so that they land on the same partitions and so at the same offsets."""
    return [
        json.dumps({"event_id": f"{run}-{i}", "type": "upsert", "doc_id": f"bad-{i}", "run": run})
        for i in range(BAD_RECORDS)
    ]


def index_through_worker(settings: Settings, lines: list[str], log: Path) -> list[Published]:
    """Publish ``lines`` to a running indexer process and wait until it has committed them."""
    bootstrap = str(settings.kafka_bootstrap_servers)
    worker = start_worker(settings, log)
    try:
        published = publish_lines(bootstrap, settings.documents_topic, lines)
        assert_all_committed(worker, settings, published)
    finally:
        stop_workers([worker])
    return published


def test_dead_letters_after_a_broker_restart_are_all_kept(
    settings: Settings, tmp_path: Path
) -> None:
    url = str(settings.database_url)
    with own_broker(tmp_path / "broker", settings) as broker:
        own = moved(settings, kafka_bootstrap_servers=broker.bootstrap)
        before = index_through_worker(own, bad_lines("before"), tmp_path / "indexer-1.log")
        assert scalar(url, "SELECT count(*) FROM dead_letters") == BAD_RECORDS

        broker.stop()  # returns once tansu has exited; start() takes a free port if its own is not
        own = moved(settings, kafka_bootstrap_servers=broker.start())
        create_topics(broker.bootstrap, own)  # memory storage: every partition is empty again
        after = index_through_worker(own, bad_lines("after"), tmp_path / "indexer-2.log")
        reused = {(p.partition, p.offset) for p in before} & {
            (p.partition, p.offset) for p in after
        }
        assert len(reused) == BAD_RECORDS  # the test means what it says: every offset came back

        runs = scalar(
            url,
            "SELECT array_agg(convert_from(raw, 'UTF8')::json->>'run' ORDER BY id)"
            " FROM dead_letters",
        )
        assert sorted(runs) == ["after"] * BAD_RECORDS + ["before"] * BAD_RECORDS
        assert scalar(url, "SELECT count(*) FROM dead_letters WHERE published_at IS NULL") == 0
        # The restarted broker's dead-letter topic holds every new letter, once.
        letters = [json.loads(m) for m in dlq_messages(broker.bootstrap, own.dlq_topic)]
        assert sorted(
            json.loads(base64.b64decode(m["raw_base64"]))["event_id"] for m in letters
        ) == sorted(f"after-{i}" for i in range(BAD_RECORDS))


def test_migration_0011_backfills_the_identity(database_url: str) -> None:
    cfg = alembic_config(database_url, 384)
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    command.downgrade(cfg, "0010")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            'INSERT INTO dead_letters (topic, partition, "offset", raw, reason, detail)'
            " VALUES ('docs', 0, 5, '{old', 'invalid_json', 'x')"
        )
        command.upgrade(cfg, "head")
        row = conn.execute(
            "SELECT raw_sha256 = sha256(raw), record_timestamp FROM dead_letters"
        ).fetchone()
        assert row == (True, None)
        # A new record at the old letter's offset is a row of its own.
        conn.execute(
            'INSERT INTO dead_letters (topic, partition, "offset", raw, reason, detail)'
            " VALUES ('docs', 0, 5, '{new', 'invalid_json', 'x')"
        )
        assert conn.execute("SELECT count(*) FROM dead_letters").fetchone() == (2,)
