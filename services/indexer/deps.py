"""The indexer's dependency bundle and record type (shared by its modules)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Literal, Self

from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.chunking import Chunker
from services.core.cloudevents import DEFAULT_MAPPING, TypeMapping
from services.core.curations import RulesCache
from services.core.embedding import Embedder
from services.core.extraction import Extractor
from services.core.settings import Settings
from services.indexer.observer import NO_OBSERVER, IndexerObserver
from services.indexer.positions import Positions
from services.indexer.resolution import Adjudicator, ResolverConfig

Outcome = Literal["applied", "deleted", "duplicate", "stale", "unchanged", "dead_lettered"]
DeadLetterPublisher = Callable[[bytes | None, bytes], Awaitable[None]]


@dataclass(frozen=True)
class RawRecord:
    """A record exactly as it came off the topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float | None = None  # the Kafka record's timestamp, seconds since the epoch
    received_at: float | None = None  # when the consumer handed it over, seconds since the epoch
    # Set: the consumer could not read the batch this record ends, whose bytes are the value
    # (services/indexer/unreadable_batches.py); this says why and which offsets it skipped.
    unreadable: str | None = None
    # The record's headers as (key, value) pairs, in order: CloudEvents in binary mode carry
    # their attributes here (services/core/cloudevents.py); dead letters keep them.
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True)
class IndexerDeps:
    """Everything a handler needs, built once by the composition root."""

    engine: AsyncEngine
    chunker: Chunker
    embedder: Embedder
    extractor: Extractor
    executor: Executor
    publish_dead_letter: DeadLetterPublisher
    max_document_bytes: int
    resolver: ResolverConfig
    max_document_chunks: int = 1000
    max_clock_skew_s: float = 300.0  # how far occurred_at may lead its record (ordering.py)
    history_days: float = 7.0  # what as_of can read (graph_store/history.py); 0: none kept
    large_document_chunks: int = 16  # background lane and compute slice (services/indexer/lanes.py)
    max_refusals: int = 10  # retries of an event the database refuses (handlers.py, _settle)
    consumer_group: str | None = None  # set: progress is recorded in indexer_progress
    observer: IndexerObserver = NO_OBSERVER  # metrics (services/indexer/observer.py)
    positions: Positions = field(default_factory=Positions)  # progress.py's epochs
    # The extractor's thread, so a batch's embedding and extraction run side by side
    # (services/indexer/compute.py); None: extraction runs in ``executor`` too.
    extract_executor: Executor | None = None
    # The curations in force, read again when they change (services/core/curations.py).
    curations: RulesCache = field(default_factory=RulesCache)
    # KGSTREAM_CLOUDEVENTS_TYPES: which CloudEvent types are upserts, which deletes.
    cloudevent_types: TypeMapping = DEFAULT_MAPPING

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        engine: AsyncEngine,
        embedder: Embedder,
        extractor: Extractor,
        executor: Executor,
        publish_dead_letter: DeadLetterPublisher,
        extract_executor: Executor | None = None,
        adjudicate: Adjudicator | None = None,
        chunker: Chunker | None = None,
        observer: IndexerObserver = NO_OBSERVER,
    ) -> Self:
        """The bundle with chunking, limits and resolution thresholds as configured."""
        return cls(
            engine=engine,
            chunker=chunker or Chunker(settings.chunk_tokens, settings.chunk_overlap),
            embedder=embedder,
            extractor=extractor,
            executor=executor,
            extract_executor=extract_executor,
            publish_dead_letter=publish_dead_letter,
            max_document_bytes=settings.max_document_bytes,
            max_document_chunks=settings.max_document_chunks,
            max_clock_skew_s=settings.max_clock_skew_s,
            history_days=settings.history_days,
            large_document_chunks=settings.indexer_large_document_chunks,
            max_refusals=settings.indexer_max_refusals,
            consumer_group=settings.consumer_group,
            resolver=ResolverConfig.from_settings(settings, adjudicate),
            observer=observer,
            cloudevent_types=settings.cloudevent_types,
        )
