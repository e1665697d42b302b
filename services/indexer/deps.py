"""The indexer's dependency bundle and record type (shared by its modules)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.chunking import Chunker
from services.core.embedding import Embedder
from services.core.extraction import Extractor
from services.indexer.resolution import ResolverConfig

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
