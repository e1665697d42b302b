"""A fetched batch the consumer cannot read (unknown codec, corrupt compressed data, bad CRC)
is skipped and stood in for, one record per offset, and the batches around it are read as
usual (services/indexer/unreadable_batches.py). Also: every codec Kafka has can be read."""

from __future__ import annotations

from typing import Any

import aiokafka
import aiokafka.codec
import kafka.codec
import pytest
from aiokafka.consumer import fetcher
from aiokafka.structs import TopicPartition

from services.core.errors import ConfigurationError
from services.indexer.unreadable_batches import (
    KeptRecords,
    PartitionRecords,
    UnreadableBatch,
    install,
)
from tests.support.raw_batches import claimed_codec_batch

TP = TopicPartition("docs", 0)
GZIP, LZ4, UNKNOWN = 1, 3, 6


def batch(base_offset: int, values: list[bytes], codec: int = 0, *, bad_crc: bool = False) -> bytes:
    """A v2 record batch at ``base_offset``; a codec other than none is only claimed in the
    header (the records stay plain), so the batch cannot be decompressed."""
    return claimed_codec_batch(values, codec, base_offset=base_offset, bad_crc=bad_crc)


def unpack(data: bytes, fetch_offset: int = 0) -> tuple[PartitionRecords, list[Any]]:
    records = PartitionRecords(TP, KeptRecords(data), None, fetch_offset, None, None, True, 0)
    return records, list(records)


def test_unreadable_batches_are_stood_in_for_offset_by_offset() -> None:
    unknown = batch(2, [b"c", b"d", b"e"], UNKNOWN)
    data = (
        batch(0, [b"a", b"b"])
        + unknown
        + batch(5, [b"f", b"g"], LZ4)
        + batch(7, [b"h"], bad_crc=True)
        + batch(8, [b"i"])
    )
    records, out = unpack(data)
    assert [r.offset for r in out] == list(range(9))
    assert [r.value for r in out if not isinstance(r.value, UnreadableBatch)] == [b"a", b"b", b"i"]
    stand_ins = {r.offset: r.value for r in out if isinstance(r.value, UnreadableBatch)}
    assert sorted(stand_ins) == [2, 3, 4, 5, 6, 7]
    # The last offset of each unreadable batch carries its bytes; the others are empty.
    assert bytes(stand_ins[4]) == unknown
    assert stand_ins[2] == stand_ins[3] == b""
    assert (stand_ins[2].first_offset, stand_ins[2].last_offset) == (2, 4)
    assert "offsets 2..4 (unknown codec" in stand_ins[4].reason
    assert "Unknown compression codec" in stand_ins[4].reason
    assert "offsets 5..6 (lz4" in stand_ins[6].reason
    assert "offsets 7..7 (none" in stand_ins[7].reason
    assert "CRC" in stand_ins[7].reason
    assert records.next_fetch_offset == 9


def test_a_fetch_inside_an_unreadable_batch_stands_in_for_the_rest_only() -> None:
    records, out = unpack(batch(2, [b"c", b"d", b"e"], UNKNOWN) + batch(5, [b"f"]), 3)
    assert [r.offset for r in out] == [3, 4, 5]
    assert out[0].value.first_offset == 3
    assert out[2].value == b"f"
    assert records.next_fetch_offset == 6


def test_position_follows_each_record_handed_out() -> None:
    """aiokafka takes records a few at a time and sets the position from next_fetch_offset:
    it must point after the last record taken, stand-ins included."""
    records = PartitionRecords(
        TP,
        KeptRecords(batch(0, [b"a"]) + batch(1, [b"b", b"c"], LZ4)),
        None,
        0,
        None,
        None,
        True,
        0,
    )
    seen = []
    for record in records:
        seen.append(record.offset)
        assert records.next_fetch_offset == record.offset + 1
    assert seen == [0, 1, 2]


@pytest.mark.parametrize("codec", ["snappy", "lz4", "zstd"])
def test_every_kafka_codec_has_its_library(codec: str) -> None:
    """aiokafka (the indexer's consumer) and kafka-python (the CLI, the API's producer, the
    tests) read and write every codec of the protocol: their libraries are dependencies."""
    assert getattr(aiokafka.codec, f"has_{codec}")()
    assert getattr(kafka.codec, f"has_{codec}")()


def test_a_codec_this_install_cannot_read_stops_the_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An lz4 batch read without the lz4 library is valid data and our fault: skipping it
    would lose its documents, so the fetch fails loudly instead."""
    monkeypatch.setattr(aiokafka.codec, "has_lz4", lambda: False)
    with pytest.raises(ConfigurationError, match="lz4-compressed and this install has no lz4"):
        unpack(batch(0, [b"a"]) + batch(1, [b"b"], LZ4))


def test_a_stand_in_keeps_its_timestamp_across_redeliveries() -> None:
    """The dead letter's identity includes the record timestamp: a stand-in takes it from the
    batch, never from the clock, so a redelivered batch finds its letter again."""
    for stamp, expected in ((1_700_000_000_123, 1_700_000_000_123), (0, 0)):
        data = claimed_codec_batch([b"a", b"b"], LZ4, timestamp=stamp)
        assert {r.timestamp for r in unpack(data)[1]} == {expected}


@pytest.fixture
def fetcher_restored(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """aiokafka's fetcher as it was, whatever install() does to it."""
    monkeypatch.setattr(fetcher, "MemoryRecords", fetcher.MemoryRecords)
    monkeypatch.setattr(fetcher, "PartitionRecords", fetcher.PartitionRecords)
    return monkeypatch


def test_install_refuses_an_aiokafka_it_was_not_written_for(
    fetcher_restored: pytest.MonkeyPatch,
) -> None:
    fetcher_restored.setattr(aiokafka, "__version__", "0.15.0")
    as_found = fetcher.PartitionRecords  # already patched when an earlier test installed it
    with pytest.raises(ConfigurationError, match=r"aiokafka 0\.15\.0 is installed.*0\.14\.0"):
        install()
    assert fetcher.PartitionRecords is as_found


class _Renamed(fetcher.PartitionRecords):  # type: ignore[misc]
    """A fetcher whose records keep their position under another name."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.position = self.__dict__.pop("next_fetch_offset")


@pytest.mark.parametrize(
    ("name", "value", "missing"),
    [
        ("MemoryRecords", None, "fetcher.MemoryRecords"),
        ("PartitionRecords", _Renamed, "PartitionRecords.next_fetch_offset"),
    ],
)
def test_install_refuses_an_aiokafka_without_the_names_it_patches(
    fetcher_restored: pytest.MonkeyPatch, name: str, value: Any, missing: str
) -> None:
    if value is None:
        fetcher_restored.delattr(fetcher, name)
    else:
        fetcher_restored.setattr(fetcher, name, value)
    with pytest.raises(ConfigurationError, match=f"lacks {missing}"):
        install()


def test_a_batch_whose_length_runs_past_the_fetch_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiokafka takes such a batch for one cut off by the fetch size and raises
    RecordTooLargeError when it comes first; the log says which offset is broken."""
    broken = bytearray(batch(7, [b"a"]))
    broken[8:12] = (10_000).to_bytes(4, "big")  # the length field
    records = KeptRecords(bytes(broken))
    assert not records.has_next()
    assert "record batch at offset 7 claims 10012 bytes, the fetch holds" in caplog.text
