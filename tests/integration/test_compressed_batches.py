"""Issue 18, finding 1: a compressed batch from a standard producer stopped indexing for good
(aiokafka had no codec libraries: UnsupportedCodecError, the worker crashed, and its successor
fetched the same batch). A real indexer worker on the real broker reads batches of every codec,
from librdkafka (confluent-kafka) and from kafka-python; a batch it still cannot read is
dead-lettered with its offsets and the partition moves past it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from services.core.settings import Settings
from tests.support.graph import scalar
from tests.support.raw_batches import (
    batch_codecs,
    claimed_codec_batch,
    produce_batch,
    publish_kafka_python,
    publish_librdkafka,
)
from tests.support.workers import (
    Published,
    Worker,
    committed_offsets,
    end_offsets,
    sample_lines,
    start_worker,
    stop_workers,
)

pytestmark = pytest.mark.integration

Publish = Callable[[str, str, Sequence[bytes], str, int], list[Published]]
PRODUCERS: list[tuple[str, Publish, str]] = [
    *[("librdkafka", publish_librdkafka, c) for c in ("none", "gzip", "snappy", "lz4", "zstd")],
    *[("kafka-python", publish_kafka_python, c) for c in ("gzip", "snappy", "lz4", "zstd")],
]


def wait_committed_or_dead(
    worker: Worker, settings: Settings, ends: dict[int, int], timeout: float = 180
) -> dict[int, int]:
    """The group's committed offsets once they reach ``ends``, or when the worker died, or at
    the timeout: whichever comes first."""
    bootstrap = str(settings.kafka_bootstrap_servers)
    deadline = time.monotonic() + timeout
    while True:
        committed = committed_offsets(
            bootstrap, settings.consumer_group, settings.documents_topic, ends
        )
        done = all(committed.get(p, -1) >= end for p, end in ends.items())
        if done or not worker.alive() or time.monotonic() > deadline:
            return committed
        time.sleep(0.5)


def test_batches_of_every_codec_are_indexed(settings: Settings, tmp_path: Path) -> None:
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    topic = settings.documents_topic
    lines = [line.encode() for line in sample_lines()[: 2 * len(PRODUCERS)]]
    worker = start_worker(settings, tmp_path / "indexer.log")
    try:
        published: list[Published] = []
        for i, (_, publish, codec) in enumerate(PRODUCERS):
            published += publish(bootstrap, topic, lines[2 * i : 2 * i + 2], codec, i % 2)
        ends = end_offsets(published)
        committed = wait_committed_or_dead(worker, settings, ends)
        assert worker.alive(), worker.output()[-3000:]
        assert all(committed.get(p, -1) >= e for p, e in ends.items()), worker.output()[-3000:]
    finally:
        stop_workers([worker])
    # The broker kept what each producer sent, as sent: each record under its producer's codec.
    codec_at = {
        (partition, offset): codec
        for partition in (0, 1)
        for first, last, codec in batch_codecs(bootstrap, topic, partition)
        for offset in range(first, last + 1)
    }
    for i, (_, _, codec) in enumerate(PRODUCERS):
        for p in published[2 * i : 2 * i + 2]:
            assert codec_at[(p.partition, p.offset)] == codec
    doc_ids = {p.doc_id for p in published}
    indexed = scalar(url, "SELECT array_agg(doc_id) FROM documents WHERE NOT deleted")
    assert set(indexed) == doc_ids
    assert scalar(url, "SELECT count(*) FROM dead_letters") == 0


def test_an_unreadable_batch_is_dead_lettered_and_the_partition_moves_on(
    settings: Settings, tmp_path: Path
) -> None:
    """A compressed batch that does not decompress (real Kafka validates batches on produce;
    the embedded broker stores them as sent, and a disk or a broker bug can corrupt one)."""
    url, bootstrap = str(settings.database_url), str(settings.kafka_bootstrap_servers)
    topic = settings.documents_topic
    before, after = ([line.encode() for line in sample_lines()[i : i + 2]] for i in (0, 2))
    bad = claimed_codec_batch([b'{"event_id": "x"}'] * 3, "lz4")
    worker = start_worker(settings, tmp_path / "indexer.log")
    try:
        published = publish_kafka_python(bootstrap, topic, before, "none", 0)
        first = produce_batch(bootstrap, topic, 0, bad)
        published += publish_kafka_python(bootstrap, topic, after, "none", 0)
        ends = end_offsets(published)
        assert ends[0] == first + 3 + 2  # the bad batch took three offsets
        committed = wait_committed_or_dead(worker, settings, ends)
        assert worker.alive(), worker.output()[-3000:]
        assert committed.get(0, -1) >= ends[0], worker.output()[-3000:]
    finally:
        stop_workers([worker])
    indexed = scalar(url, "SELECT array_agg(doc_id) FROM documents WHERE NOT deleted")
    assert set(indexed) == {p.doc_id for p in published}
    rows = scalar(
        url,
        # the bytes the CRC covers (the broker sets the base offset and the leader epoch)
        'SELECT array_agg(ARRAY[reason, "offset"::text, detail,'
        " (substring(raw FROM 22) = substring(:raw FROM 22))::text,"
        " (published_at IS NOT NULL)::text]) FROM dead_letters",
        raw=bad,
    )
    assert len(rows) == 1, rows
    reason, offset, detail, same_bytes, sent_to_topic = rows[0]
    assert (reason, int(offset), same_bytes, sent_to_topic) == (
        "undecodable_batch",
        first + 2,
        "true",
        "true",
    )
    assert f"offsets {first}..{first + 2} (lz4" in detail
    assert f"offsets {first}..{first + 2} (lz4" in worker.output()  # and logged as an error
