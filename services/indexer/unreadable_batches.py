"""Record batches the consumer cannot read: a codec it has no library for or does not know, a
compressed batch that does not decompress, a failed CRC. aiokafka raises from its fetcher when
the stream reaches such a batch, the worker stopped, and its successor fetched the same batch:
the partition stopped for good.

Here each batch of a fetch is decoded on its own (aiokafka's own code, one batch at a time).
One that fails is logged, skipped, and handed on as stand-in records, one per offset it covers,
so that acking them commits the partition past it. The stand-in at the batch's last offset
carries the batch's bytes and the reason, and becomes a dead letter (``undecodable_batch``);
the others are empty and only acked. A batch that cannot even be delimited (its length field is
broken) still stops the partition, with a log line that names it."""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterator
from typing import Any, Self

from aiokafka.consumer import fetcher
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord

log = logging.getLogger(__name__)

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
MAX_SKIPPED_OFFSETS = 1_000_000
"""More offsets than a batch can hold: its header is not to be trusted, so it is not skipped."""

_FRAME = struct.Struct(">qi")  # base offset, length of the rest: the same in every format


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
            except Exception as exc:  # noqa: BLE001 - whatever fails, this batch is unreadable
                yield from self._stand_ins(source, batch, start, exc)
                continue
            finally:
                self._records = source
            for record in records:
                self.next_fetch_offset = record.offset + 1
                yield record
            self.next_fetch_offset = batch.next_offset

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
        timestamp = getattr(batch, "max_timestamp", None) or int(time.time() * 1000)
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


def install() -> None:
    """Make every aiokafka consumer in this process decode fetched batches one by one (the
    indexer has one consumer, faust's). aiokafka's fetcher names both classes at module level."""
    fetcher.MemoryRecords = KeptRecords
    fetcher.PartitionRecords = PartitionRecords
