"""Record batches the consumer cannot read: a codec it has no library for or does not know, a
compressed batch that does not decompress, a failed CRC. aiokafka raises from its fetcher when
the stream reaches such a batch, the worker stopped, and its successor fetched the same batch:
the partition stopped for good.

Here each batch of a fetch is decoded on its own (aiokafka's own code, one batch at a time).
One that fails is logged, skipped, and handed on as stand-in records, one per offset it covers,
so that acking them commits the partition past it. The stand-in at the batch's last offset
carries the batch's bytes and the reason, and becomes a dead letter (``undecodable_batch``);
the others are empty and only acked. A batch that cannot even be delimited (its length field is
broken) still stops the partition, with a log line that names its offset: aiokafka takes a batch
running past the fetched bytes for one cut off at the end of the fetch (if it is the first,
for one larger than the fetch size: RecordTooLargeError).

A batch in a codec Kafka has but this install has no library for is not bad data: the
partition stops (ConfigurationError) rather than skip valid documents. The patch reaches into
aiokafka's private fetcher, so ``install`` refuses any aiokafka but the pinned one."""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Iterator
from typing import Any, Self

import aiokafka
from aiokafka.consumer import fetcher
from aiokafka.errors import UnsupportedCodecError
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, TopicPartition

from services.core.errors import ConfigurationError

log = logging.getLogger(__name__)

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
MAX_SKIPPED_OFFSETS = 1_000_000
"""More offsets than a batch can hold: its header is not to be trusted, so it is not skipped."""

_FRAME = struct.Struct(">qi")  # base offset, length of the rest: the same in every format

AIOKAFKA_VERSION = "0.14.0"
"""The aiokafka this patch was written and tested against (pinned in pyproject.toml)."""
_PATCHED = {
    # what the patch replaces or overrides, and what it reads of aiokafka's objects
    "fetcher": ("MemoryRecords", "PartitionRecords"),
    "PartitionRecords": ("_unpack_records", "_tp", "_records", "next_fetch_offset"),
    "MemoryRecords": ("size_in_bytes", "has_next", "next_batch"),
}


class UnreadableBatch(bytes):
    """The value of a stand-in record for one offset of a batch the consumer could not read:
    the batch's bytes at its last offset, empty at the others. A type, not a header, so that no
    publisher can make a record look like one."""

    first_offset: int
    last_offset: int
    reason: str

    def __new__(cls, raw: bytes, *, first_offset: int, last_offset: int, reason: str) -> Self:
        """The stand-in value; ``reason`` says what failed and which offsets were skipped."""
        value = super().__new__(cls, raw)
        value.first_offset = first_offset
        value.last_offset = last_offset
        value.reason = reason
        return value


class KeptRecords:
    """aiokafka's MemoryRecords over a fetched buffer, which also knows where each batch it
    hands out lies in the buffer (aiokafka's compiled batches do not expose their bytes)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._records: Any = MemoryRecords(data)
        self._pos = 0
        self.span = (0, 0)
        if not self.has_next() and len(data) >= _FRAME.size:
            # The first batch runs past the buffer. Brokers send a whole first batch even when
            # it exceeds the fetch size, so its length field is likely broken; aiokafka raises
            # RecordTooLargeError (which names the partition) and does not move past it.
            base_offset, length = _FRAME.unpack_from(data)
            log.error(
                "the record batch at offset %d claims %d bytes, the fetch holds %d: its length "
                "field is broken (or the broker cut the batch), the partition cannot move past it",
                base_offset,
                _FRAME.size + length,
                len(data),
            )

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        _, length = _FRAME.unpack_from(self._data, self._pos)
        end = self._pos + _FRAME.size + length
        self.span = (self._pos, end)
        self._pos = end
        return self._records.next_batch()

    def raw(self) -> bytes:
        """The bytes of the batch last handed out."""
        start, end = self.span
        return bytes(self._data[start:end])


class _OneBatch:
    """A record source holding one batch, for aiokafka's unpacking loop."""

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def has_next(self) -> bool:
        return self._batch is not None

    def next_batch(self) -> Any:
        batch, self._batch = self._batch, None
        return batch


class PartitionRecords(fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's records of one partition from one fetch, decoded batch by batch."""

    _tp: Any  # set by aiokafka's __init__, like the two below
    _records: Any
    next_fetch_offset: int

    def _unpack_records(self) -> Iterator[ConsumerRecord[Any, Any]]:
        source = self._records
        while source.has_next():
            start = self.next_fetch_offset
            try:
                batch = source.next_batch()
            except Exception:
                log.exception(
                    "%s: cannot delimit the record batch at offset %d or later; the partition "
                    "cannot move past it",
                    self._tp,
                    start,
                )
                raise
            self._records = _OneBatch(batch)
            try:
                # aiokafka's own unpacking (CRC, transactions, control batches), this batch only
                records = list(super()._unpack_records())
            except UnsupportedCodecError as exc:
                if batch.compression_type in CODECS:  # a codec we should read: our fault
                    raise self._missing_codec(batch, start) from exc
                yield from self._stand_ins(source, batch, start, exc)  # a codec Kafka lacks
                continue
            except Exception as exc:  # noqa: BLE001 - whatever else fails, the batch is bad
                yield from self._stand_ins(source, batch, start, exc)
                continue
            finally:
                self._records = source
            for record in records:
                self.next_fetch_offset = record.offset + 1
                yield record
            self.next_fetch_offset = batch.next_offset

    def _missing_codec(self, batch: Any, start: int) -> ConfigurationError:
        codec = CODECS[batch.compression_type]
        message = (
            f"{self._tp}: the record batch at offset {start} is {codec}-compressed and this "
            f"install has no {codec} library; install kgstream's pinned dependencies. The "
            "partition stops here rather than skip documents that are fine"
        )
        log.critical(message)
        return ConfigurationError(message)

    def _stand_ins(
        self, source: Any, batch: Any, start: int, exc: Exception
    ) -> Iterator[ConsumerRecord[Any, Any]]:
        first = max(getattr(batch, "base_offset", start), start)  # v0/v1: no base offset
        last = batch.next_offset - 1
        if last < first:  # wholly before the fetch position: nothing of it is due
            self.next_fetch_offset = max(start, batch.next_offset)
            return
        if last - first >= MAX_SKIPPED_OFFSETS:
            log.error("%s: unreadable batch at %d claims offsets up to %d", self._tp, first, last)
            raise exc
        raw = source.raw() if isinstance(source, KeptRecords) else b""
        codec = CODECS.get(getattr(batch, "compression_type", -1), "unknown codec")
        reason = (
            f"record batch at offsets {first}..{last} ({codec}, {len(raw)} bytes) could not be "
            f"read: {type(exc).__name__}: {exc}; the consumer skipped it"
        )
        log.error("%s: %s", self._tp, reason)
        timestamp = _batch_timestamp(batch)
        for offset in range(first, last + 1):
            value = UnreadableBatch(
                raw if offset == last else b"",
                first_offset=first,
                last_offset=last,
                reason=reason,
            )
            self.next_fetch_offset = offset + 1
            yield ConsumerRecord(
                self._tp.topic,
                self._tp.partition,
                offset,
                timestamp,
                0,  # create time
                None,
                value,
                None,
                -1,
                len(value),
                (),
            )
        self.next_fetch_offset = batch.next_offset


def _batch_timestamp(batch: Any) -> int:
    """The stand-ins' timestamp (ms), read from the batch's header so that every redelivery
    of the batch gives its dead letter the same identity: its greatest timestamp, else its
    first (v2), else its one (v0/v1), else 0."""
    for name in ("max_timestamp", "first_timestamp", "timestamp"):
        value = getattr(batch, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def check_aiokafka() -> None:
    """Raise ConfigurationError unless aiokafka is the version this patch was tested against
    and still has every private name the patch uses: another one could drop the protection
    silently or break every fetch."""
    if aiokafka.__version__ != AIOKAFKA_VERSION:
        raise ConfigurationError(
            f"aiokafka {aiokafka.__version__} is installed; the indexer's unreadable-batch "
            f"patch (services/indexer/unreadable_batches.py) is for aiokafka "
            f"{AIOKAFKA_VERSION} only: install the pinned version, or check and re-pin the patch"
        )
    records = MemoryRecords(b"")
    owners = {"fetcher": fetcher, "MemoryRecords": records, "PartitionRecords": None}
    # An empty instance, as its __init__ sets the attributes the patch reads; a missing class
    # or another signature leaves None, whose names are reported missing below.
    with contextlib.suppress(AttributeError, TypeError):
        owners["PartitionRecords"] = fetcher.PartitionRecords(
            TopicPartition("", 0), records, None, 0, None, None, True, 0
        )
    missing = [
        f"{owner}.{name}"
        for owner, names in _PATCHED.items()
        for name in names
        if not hasattr(owners[owner], name)
    ]
    if missing:
        raise ConfigurationError(
            f"aiokafka {aiokafka.__version__} lacks {', '.join(missing)}, which the "
            "indexer's unreadable-batch patch (services/indexer/unreadable_batches.py) uses"
        )


def install() -> None:
    """Make every aiokafka consumer in this process decode fetched batches one by one (the
    indexer has one consumer, faust's). aiokafka's fetcher names both classes at module level.
    Raises ConfigurationError when aiokafka is not the one the patch was written for."""
    check_aiokafka()
    fetcher.MemoryRecords = KeptRecords
    fetcher.PartitionRecords = PartitionRecords
