"""Record batches as bytes on the wire: publish with librdkafka (confluent-kafka) or kafka-python
under a compression codec, hand-made batches a consumer cannot read, and the codec of each batch
a partition holds (read from the batch headers, so a test knows the broker kept them compressed)."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Sequence
from typing import Any

import crc32c
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import TopicPartition
from confluent_kafka import KafkaError, Message, Producer
from kafka import KafkaProducer

from tests.support.workers import Published

CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_FRAME = struct.Struct(">qi")  # base offset, length
_ATTRIBUTES, _LAST_OFFSET_DELTA, _CRC = 21, 23, 17


def _doc_id(line: bytes) -> str:
    return str(json.loads(line)["doc_id"])


def publish_librdkafka(
    bootstrap: str, topic: str, lines: Sequence[bytes], codec: str, partition: int = 0
) -> list[Published]:
    """Send ``lines`` keyed by doc_id to one partition in one compressed batch, with librdkafka
    as most non-Python publishers use it, and wait for every delivery report."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 200}
    )
    reports: list[tuple[KafkaError | None, Message]] = []
    for line in lines:
        producer.produce(
            topic,
            key=_doc_id(line).encode(),
            value=line,
            partition=partition,
            on_delivery=lambda err, msg: reports.append((err, msg)),
        )
    assert producer.flush(60) == 0, "librdkafka did not deliver everything within 60 s"
    assert all(err is None for err, _ in reports), reports
    return [
        Published((msg.key() or b"").decode(), msg.partition() or 0, msg.offset() or 0)
        for _, msg in reports
    ]


def publish_kafka_python(
    bootstrap: str, topic: str, lines: Sequence[bytes], codec: str, partition: int = 0
) -> list[Published]:
    """The same with kafka-python's producer (the library the CLI and the API publish with)."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=200,
        compression_type=None if codec == "none" else codec,
    )
    try:
        futures = [
            (_doc_id(line), producer.send(topic, key=_doc_id(line).encode(), value=line,
                                          partition=partition))
            for line in lines
        ]  # fmt: skip
        producer.flush(timeout=60)
        return [Published(d, f.get(60).partition, f.get(60).offset) for d, f in futures]
    finally:
        producer.close(timeout=10)


def claimed_codec_batch(
    values: Sequence[bytes],
    codec: str | int,
    *,
    base_offset: int = 0,
    bad_crc: bool = False,
    timestamp: int | None = None,
) -> bytes:
    """A v2 batch whose header claims ``codec`` (a name or a codec id) while its records are
    stored plain: a compressed batch that does not decompress. Its CRC is right, so only
    decoding fails, unless ``bad_crc``. Records are stamped ``timestamp`` (ms), or now."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=timestamp, key=None, value=value, headers=[])
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, base_offset)
    codec_id = CODEC_IDS[codec] if isinstance(codec, str) else codec
    (attributes,) = struct.unpack_from(">h", buf, _ATTRIBUTES)
    struct.pack_into(">h", buf, _ATTRIBUTES, (attributes & ~7) | codec_id)
    crc = crc32c.crc32c(bytes(buf[_ATTRIBUTES:])) ^ int(bad_crc)
    struct.pack_into(">I", buf, _CRC, crc)
    return bytes(buf)


def _ask(bootstrap: str, topic: str, partition: int, request: Any) -> Any:
    """Send one request to the partition's leader and return its response."""

    async def ask() -> Any:
        client = AIOKafkaClient(bootstrap_servers=bootstrap)
        await client.bootstrap()
        try:
            await client.add_topic(topic)
            node = client.cluster.leader_for_partition(TopicPartition(topic, partition))
            return await client.send(node, request)
        finally:
            await client.close()

    return asyncio.run(ask())


def produce_batch(bootstrap: str, topic: str, partition: int, batch: bytes) -> int:
    """Append ``batch`` as it is; returns its base offset."""
    request = ProduceRequest(None, -1, 30_000, [(topic, [(partition, batch)])])
    (_, ((_, error, offset, *_),)) = _ask(bootstrap, topic, partition, request).topics[0]
    assert error == 0, f"the broker refused the batch: error {error}"
    return int(offset)


def batch_codecs(bootstrap: str, topic: str, partition: int) -> list[tuple[int, int, str]]:
    """(first offset, last offset, codec) of every batch in the partition, from its headers."""
    request = FetchRequest(100, 1, 8 << 20, 0, [(topic, [(partition, 0, 8 << 20)])])
    data = bytes(_ask(bootstrap, topic, partition, request).topics[0][1][0][-1])
    pos, found = 0, []
    names = {v: k for k, v in CODEC_IDS.items()}
    while pos + _FRAME.size <= len(data):
        base, length = _FRAME.unpack_from(data, pos)
        if pos + _FRAME.size + length > len(data):
            break
        (attributes,) = struct.unpack_from(">h", data, pos + _ATTRIBUTES)
        (delta,) = struct.unpack_from(">i", data, pos + _LAST_OFFSET_DELTA)
        found.append((base, base + delta, names.get(attributes & 7, "unknown")))
        pos += _FRAME.size + length
    return found
