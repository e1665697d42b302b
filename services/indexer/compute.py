"""The CPU side of indexing, batched across events: chunk, embed, extract, and prepare
entity resolution. Runs before any transaction, in the indexer's worker thread.

No call to the worker thread covers more than ``deps.large_document_chunks`` texts: the thread
runs calls in the order they were queued, so a large document computed in the background
(services/indexer/lanes.py) holds it for one slice at a time and the other partitions' batches
take their turns in between (issue 18, finding 14)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.chunking import Chunk
from services.core.contracts import DocumentEvent
from services.core.errors import PermanentError, TransientError
from services.core.extraction import ExtractedEntity, Extraction
from services.core.model_meter import embed_metered, extract_metered
from services.indexer.deps import IndexerDeps
from services.indexer.documents import already_processed, existing_chunk_hashes, stored_doc
from services.indexer.observer import timed
from services.indexer.ordering import content_hash, decide_upsert
from services.indexer.resolution import (
    Resolution,
    Surface,
    adjudicate_candidates,
    document_surfaces,
    local_canonical,
    with_title,
)

R = TypeVar("R")


@dataclass(frozen=True)
class UpsertPlan:
    """What an upsert would change, decided before the transaction (and checked again in it)."""

    event: DocumentEvent
    doc_hash: str
    planned: list[tuple[str, Chunk]]  # every chunk of the new version: (diff hash, chunk)
    fresh: list[tuple[str, Chunk]]  # the ones the database lacks: to embed and extract
    duplicate: bool = False


@dataclass(frozen=True)
class Computed:
    """Embeddings and extractions of a plan's fresh chunks, and its resolution inputs."""

    chunks: dict[str, tuple[Sequence[float], Extraction]]
    resolution: Resolution


def document_text(event: DocumentEvent) -> str:
    """The title leads the first chunk: it is the passage's subject and helps both retrievers."""
    return f"{event.title}\n\n{event.text}" if event.title else event.text


async def plan_upsert(deps: IndexerDeps, conn: AsyncConnection, event: DocumentEvent) -> UpsertPlan:
    """Chunk the new version and find what is new; duplicates and stale events plan no work."""
    doc_hash = content_hash(event.title, event.text)
    planned = _dedupe_chunks(event.title, deps.chunker.split(document_text(event)))
    if len(planned) > deps.max_document_chunks:
        raise PermanentError(
            "oversize",
            f"{len(planned)} chunks; the limit is {deps.max_document_chunks}"
            " (KGSTREAM_MAX_DOCUMENT_CHUNKS)",
        )
    if await already_processed(conn, event.event_id):
        return UpsertPlan(event, doc_hash, planned, [], duplicate=True)
    stored = await stored_doc(conn, event.doc_id, lock=False, max_skew_s=deps.max_clock_skew_s)
    decision = decide_upsert(stored, event, doc_hash)
    if decision != "apply":
        return UpsertPlan(event, doc_hash, planned, [])
    existing = await existing_chunk_hashes(conn, event.doc_id)
    return UpsertPlan(event, doc_hash, planned, [(h, c) for h, c in planned if h not in existing])


async def compute(deps: IndexerDeps, plans: Sequence[UpsertPlan]) -> list[Computed]:
    """One embedding pass and one extraction pass over all fresh chunks of all plans (in
    slices: see the module docstring), then one more embedding pass for entity names the
    database does not know yet."""
    texts: list[str] = []
    embed_inputs: list[str] = []
    for plan in plans:
        for _, chunk in plan.fresh:
            texts.append(chunk.text)
            # Later chunks do not contain the title; prefix it so their vectors know the subject.
            embed_inputs.append(
                chunk.text if chunk.ord == 0 else f"{plan.event.title}\n{chunk.text}"
            )
    embeddings: list[list[float]] = []
    extractions: list[Extraction] = []
    meter = deps.observer
    if texts:
        with timed(meter, "embed"):
            embed = partial(embed_metered, deps.embedder, meter, "embed_chunks")
            embeddings = await _embed_in_slices(deps, embed, embed_inputs)
        try:
            with timed(meter, "extract"):
                extract = partial(extract_metered, deps.extractor, meter)
                extractions = await in_slices(deps, extract, texts)
        except (TransientError, PermanentError):
            # Transient: the LLM client already retried; the caller keeps retrying with backoff
            # and the offset stays uncommitted, so an outage delays events but loses none.
            raise
        except Exception as exc:  # a broken extractor must not stop the stream
            raise PermanentError("extraction_failed", f"{type(exc).__name__}: {exc}") from exc
    per_plan: list[dict[str, tuple[Sequence[float], Extraction]]] = []
    at = 0
    for plan in plans:
        n = len(plan.fresh)
        per_plan.append(
            {h: (embeddings[at + i], extractions[at + i]) for i, (h, _) in enumerate(plan.fresh)}
        )
        at += n
    with timed(meter, "resolve"):
        resolutions = await _prepare_resolutions(deps, plans, per_plan)
    return [Computed(c, r) for c, r in zip(per_plan, resolutions, strict=True)]


async def _prepare_resolutions(
    deps: IndexerDeps,
    plans: Sequence[UpsertPlan],
    per_plan: Sequence[dict[str, tuple[Sequence[float], Extraction]]],
) -> list[Resolution]:
    canonicals = []
    surfaces: list[dict[str, Surface]] = []
    wanted: dict[str, Surface] = {}
    kept = await _kept_mentions(deps, plans)
    for plan, chunks, old in zip(plans, per_plan, kept, strict=True):
        title = plan.event.title
        mentioned = [e for _, x in chunks.values() for e in with_title(title, x).entities]
        # Short forms resolve against the whole document, kept chunks included, exactly as a
        # rebuild from scratch would see it.
        canonical = local_canonical([*mentioned, *old])
        canonicals.append(canonical)
        surfaces.append(document_surfaces(mentioned, canonical))
        for key, surface in surfaces[-1].items():
            wanted.setdefault(key, surface)
    vectors: dict[str, Sequence[float]] = {}
    if wanted:
        async with deps.engine.connect() as conn:
            known = await conn.execute(
                text("SELECT DISTINCT key FROM entities WHERE key = ANY(:k)"), {"k": sorted(wanted)}
            )
            missing = sorted(set(wanted) - {r[0] for r in known.all()})
        if missing:
            names = [wanted[k].name for k in missing]
            embed = partial(embed_metered, deps.embedder, deps.observer, "embed_names")
            found = await _embed_in_slices(deps, embed, names)
            vectors = dict(zip(missing, found, strict=True))
    out = []
    for canonical, doc_surfaces in zip(canonicals, surfaces, strict=True):
        decisions: dict[tuple[str, int], bool] = {}
        if deps.resolver.adjudicate is not None and vectors:
            asked = {k: s for k, s in doc_surfaces.items() if k in vectors}
            async with deps.engine.connect() as conn:
                decisions = await adjudicate_candidates(conn, asked, vectors, deps.resolver)
        out.append(Resolution(canonical, vectors, deps.resolver, decisions))
    return out


async def _kept_mentions(
    deps: IndexerDeps, plans: Sequence[UpsertPlan]
) -> list[list[ExtractedEntity]]:
    out: list[list[ExtractedEntity]] = []
    async with deps.engine.connect() as conn:
        for plan in plans:
            fresh = {h for h, _ in plan.fresh}
            kept = [h for h, _ in plan.planned if h not in fresh]
            if not kept or not plan.fresh:
                out.append([])
                continue
            rows = await conn.execute(
                text(
                    "SELECT m.surface, m.type FROM mentions m JOIN chunks c ON c.id = m.chunk_id"
                    " WHERE c.doc_id = :d AND c.content_hash = ANY(:h) AND m.start_char >= 0"
                ),
                {"d": plan.event.doc_id, "h": kept},
            )
            out.append(
                [ExtractedEntity(r.surface, r.type, 0, len(r.surface), "") for r in rows.all()]
            )
    return out


async def in_slices(
    deps: IndexerDeps, work: Callable[[list[str]], list[R]], texts: list[str]
) -> list[R]:
    """``work(texts)`` in the worker thread, at most ``deps.large_document_chunks`` texts per
    call, results in input order."""
    loop = asyncio.get_running_loop()
    size = deps.large_document_chunks
    out: list[R] = []
    for at in range(0, len(texts), size):
        out += await loop.run_in_executor(deps.executor, work, texts[at : at + size])
    return out


async def _embed_in_slices(
    deps: IndexerDeps, embed: Callable[[list[str]], list[list[float]]], texts: list[str]
) -> list[list[float]]:
    # Slices of similar lengths: the embedder pads each of its batches to the longest text, so
    # slicing in arrival order would mix short and long texts that one call would have sorted.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    vectors = await in_slices(deps, embed, [texts[i] for i in order])
    out: list[list[float]] = [[] for _ in texts]
    for i, vector in zip(order, vectors, strict=True):
        out[i] = vector
    return out


def _dedupe_chunks(title: str, chunks: Sequence[Chunk]) -> list[tuple[str, Chunk]]:
    out: list[tuple[str, Chunk]] = []
    seen: set[str] = set()
    for c in chunks:
        h = content_hash(title, c.text)
        if h not in seen:
            seen.add(h)
            out.append((h, c))
    return out
