"""The compute phase, batched across events: chunk, embed, extract and prepare entity
resolution, before any transaction; it ends in one write plan per upsert
(services/indexer/write_plan.py), which services/indexer/graph_store/ writes.

A batch's chunks are embedded in the indexer's CPU thread (``deps.executor``) while they are
extracted in the extractor's thread (``deps.extract_executor``), which then embeds the new
entity names (they come from the extraction; onnxruntime serves both threads' calls). No call
to either thread covers more than ``deps.large_document_chunks`` texts: a thread runs calls in
the order they were queued, so a large document computed in the background
(services/indexer/lanes.py) holds it for one slice at a time and the other partitions'
batches take their turns in between (issue 18, finding 14)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from functools import partial
from typing import TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.chunking import Chunk
from services.core.contracts import DocumentEvent
from services.core.db.engine import vector_literal
from services.core.errors import PermanentError, TransientError
from services.core.extraction import ExtractedEntity, Extraction
from services.core.model_meter import embed_metered, extract_metered
from services.indexer.candidates import adjudicate_candidates
from services.indexer.deps import IndexerDeps
from services.indexer.documents import already_processed, existing_chunk_hashes, stored_doc
from services.indexer.observer import timed
from services.indexer.ordering import content_hash, decide_upsert, moves_tenant
from services.indexer.write_plan import UpsertPlan, WritePlan, build_write_plan

R = TypeVar("R")


def document_text(event: DocumentEvent) -> str:
    """The title leads the first chunk: it is the passage's subject and helps both retrievers."""
    return f"{event.title}\n\n{event.text}" if event.title else event.text


def hash_salt(event: DocumentEvent) -> str:
    """What the document's and its chunks' hashes are taken with besides their text: the title,
    and the provided facts when there are any (services/core/facts.py). A chunk's extraction is
    resolved with the document's facts (a provided alias names the same entity in the text), so
    new facts make every chunk new, as a new title does; a v1 event hashes as it always did."""
    facts = event.facts()
    return event.title if facts is None else f"{event.title}\x00{facts}"


async def plan_upsert(deps: IndexerDeps, conn: AsyncConnection, event: DocumentEvent) -> UpsertPlan:
    """Chunk the new version and find what is new; duplicates and stale events plan no work."""
    salt = hash_salt(event)
    doc_hash = content_hash(salt, event.text)
    first = event.facts() is not None  # the facts ride on the first chunk: see _dedupe_chunks
    planned = _dedupe_chunks(salt, deps.chunker.split(document_text(event)), first=first)
    if len(planned) > deps.max_document_chunks:
        raise PermanentError(
            "oversize",
            f"{len(planned)} chunks; the limit is {deps.max_document_chunks}"
            " (KGSTREAM_MAX_DOCUMENT_CHUNKS)",
        )
    if not planned and (event.entities or event.relationships):
        # Provided facts live on the document's first chunk (services/indexer/provided.py).
        detail = "$.entities: a document with neither title nor text carries no facts"
        raise PermanentError("contract_violation", detail)
    if await already_processed(conn, event.event_id):
        return UpsertPlan(event, doc_hash, planned, [], duplicate=True)
    stored = await stored_doc(conn, event.doc_id, lock=False, max_skew_s=deps.max_clock_skew_s)
    decision = decide_upsert(stored, event, doc_hash)
    if decision != "apply":
        return UpsertPlan(event, doc_hash, planned, [])
    if moves_tenant(stored, event):  # every chunk anew, in the new tenant's scope
        return UpsertPlan(event, doc_hash, planned, planned, moved=True)
    existing = await existing_chunk_hashes(conn, event.doc_id)
    return UpsertPlan(event, doc_hash, planned, [(h, c) for h, c in planned if h not in existing])


async def compute(deps: IndexerDeps, plans: Sequence[UpsertPlan]) -> list[WritePlan]:
    """One embedding pass and one extraction pass over all fresh chunks of all plans (in
    slices: see the module docstring), then one more embedding pass for entity names the
    database does not know yet; one write plan per upsert plan."""
    texts: list[str] = []
    embed_inputs: list[str] = []
    for plan in plans:
        for _, chunk in plan.fresh:
            if extracts(plan):
                texts.append(chunk.text)
            # Later chunks do not contain the title; prefix it so their vectors know the subject.
            embed_inputs.append(
                chunk.text if chunk.ord == 0 else f"{plan.event.title}\n{chunk.text}"
            )
    embeddings: list[list[float]] = []
    extractions: list[Extraction] = []
    meter = deps.observer
    if embed_inputs:
        # Side by side: onnxruntime releases the GIL while it embeds, so the extractor's thread
        # (deps.extract_executor) works meanwhile; the batch waits for the slower of the two.
        embedding = asyncio.create_task(_embed_chunks(deps, embed_inputs))
        try:
            extractions = await _extract(deps, texts) if texts else []
        except BaseException:
            embedding.cancel()  # no further slices; one already running ends on its own
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await embedding
            raise
        embeddings = await embedding
    per_plan: list[dict[str, tuple[Sequence[float], Extraction]]] = []
    vectors, extracted = iter(embeddings), iter(extractions)
    for plan in plans:
        per_plan.append(
            {
                h: (next(vectors), next(extracted) if extracts(plan) else NOTHING)
                for h, _ in plan.fresh
            }
        )
    with timed(meter, "resolve"):
        return await _write_plans(deps, plans, per_plan)


async def recompute(
    deps: IndexerDeps, plan: UpsertPlan, embeddings: Mapping[str, Sequence[float]]
) -> WritePlan:
    """A stored document's write plan under the curations in force (services/indexer/
    curation_apply.py): every chunk of ``plan`` (all ``fresh``) extracted again from its stored
    text, as an ingest would (an LLM extractor is asked again), with its stored embedding."""
    texts = [c.text for _, c in plan.fresh] if extracts(plan) else []
    extractions = await _extract(deps, texts) if texts else [NOTHING] * len(plan.fresh)
    computed = {h: (embeddings[h], x) for (h, _), x in zip(plan.fresh, extractions, strict=True)}
    with timed(deps.observer, "resolve"):
        return (await _write_plans(deps, [plan], [computed]))[0]


NOTHING = Extraction(entities=[], relations=[])


def extracts(plan: UpsertPlan) -> bool:
    """Does the extractor read this document? Not when its publisher said its facts are all
    provided (``extraction: "provided"``): no model call, no tokens."""
    return plan.event.extraction == "auto"


async def _embed_chunks(deps: IndexerDeps, inputs: list[str]) -> list[list[float]]:
    with timed(deps.observer, "embed"):
        embed = partial(embed_metered, deps.embedder, deps.observer, "embed_chunks")
        return await _embed_in_slices(deps, embed, inputs)


async def _extract(deps: IndexerDeps, texts: list[str]) -> list[Extraction]:
    try:
        with timed(deps.observer, "extract"):
            extract = partial(extract_metered, deps.extractor, deps.observer)
            return await in_slices(deps, extract, texts, executor=deps.extract_executor)
    except (TransientError, PermanentError):
        # Transient: the LLM client already retried; the caller keeps retrying with backoff
        # and the offset stays uncommitted, so an outage delays events but loses none.
        raise
    except Exception as exc:  # a broken extractor must not stop the stream
        raise PermanentError("extraction_failed", f"{type(exc).__name__}: {exc}") from exc


async def _write_plans(
    deps: IndexerDeps,
    plans: Sequence[UpsertPlan],
    per_plan: Sequence[dict[str, tuple[Sequence[float], Extraction]]],
) -> list[WritePlan]:
    """The write plans, with the resolution inputs only the compute phase can give: the
    document's short forms, embeddings of the names the database does not know, and the
    adjudicator's answers."""
    kept = await _kept_mentions(deps, plans)
    async with deps.engine.connect() as conn:
        rules = await deps.curations.current(conn)
    drafts = [
        build_write_plan(plan, chunks, kept_mentions=old, resolver=deps.resolver, rules=rules)
        for plan, chunks, old in zip(plans, per_plan, kept, strict=True)
    ]
    # (tenant, key) -> the name of its first surface in the batch: entities are per tenant
    # (services/indexer/scope.py), so a name another tenant knows is still new to this one.
    wanted: dict[Named, str] = {}
    for draft in drafts:
        for key, surface in draft.surfaces.items():
            wanted.setdefault((draft.event.tenant, key), surface.name)
    vectors: dict[Named, str] = {}
    if wanted:
        async with deps.engine.connect() as conn:
            missing = await _unknown(conn, sorted(wanted, key=_named_order))
        if missing:
            # In the extractor's thread: the chunks' embedding may still hold the CPU thread.
            # The vectors as pgvector text there too: the transaction binds each one twice.
            embed = partial(embed_metered, deps.embedder, deps.observer, "embed_names")
            names = sorted({wanted[n] for n in missing})
            found = await _embed_in_slices(deps, embed, names, executor=deps.extract_executor)
            loop = asyncio.get_running_loop()
            literals = await loop.run_in_executor(
                deps.extract_executor or deps.executor, _vector_literals, found
            )
            by_name = dict(zip(names, literals, strict=True))
            vectors = {n: by_name[wanted[n]] for n in missing}
    out = []
    for draft in drafts:
        tenant = draft.event.tenant
        own = {k: vectors[(tenant, k)] for k in draft.surfaces if (tenant, k) in vectors}
        decisions: dict[tuple[str, int], bool] = {}
        if deps.resolver.adjudicate is not None and own:
            asked = {k: s for k, s in draft.surfaces.items() if k in own}
            async with deps.engine.connect() as conn:
                decisions = await adjudicate_candidates(
                    conn, asked, own, deps.resolver, rules, tenant=tenant
                )
        out.append(replace(draft, name_vectors=own, decisions=decisions))
    return out


def _vector_literals(vectors: list[list[float]]) -> list[str]:
    return [vector_literal(v) for v in vectors]


Named = tuple[str | None, str]  # (tenant, name key)
_KNOWN = text(
    "SELECT q.t AS tenant, q.k AS key"
    " FROM unnest(CAST(:t AS text[]), CAST(:k AS text[])) AS q(t, k)"
    " WHERE EXISTS (SELECT 1 FROM entities e WHERE e.key = q.k"
    "  AND e.tenant IS NOT DISTINCT FROM q.t)"
)


def _named_order(named: Named) -> tuple[bool, str, str]:
    return named[0] is not None, named[0] or "", named[1]


async def _unknown(conn: AsyncConnection, wanted: Sequence[Named]) -> list[Named]:
    """Those of ``wanted`` that no entity of the tenant's scope has as its key, in order."""
    rows = await conn.execute(_KNOWN, {"t": [t for t, _ in wanted], "k": [k for _, k in wanted]})
    known: set[Named] = {(r.tenant, str(r.key)) for r in rows.all()}
    return [n for n in wanted if n not in known]


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
    deps: IndexerDeps,
    work: Callable[[list[str]], list[R]],
    texts: list[str],
    *,
    executor: Executor | None = None,
) -> list[R]:
    """``work(texts)`` in ``executor`` (the embedding thread unless given), at most
    ``deps.large_document_chunks`` texts per call, results in input order."""
    loop = asyncio.get_running_loop()
    size = deps.large_document_chunks
    out: list[R] = []
    for at in range(0, len(texts), size):
        out += await loop.run_in_executor(executor or deps.executor, work, texts[at : at + size])
    return out


async def _embed_in_slices(
    deps: IndexerDeps,
    embed: Callable[[list[str]], list[list[float]]],
    texts: list[str],
    *,
    executor: Executor | None = None,
) -> list[list[float]]:
    # Slices of similar lengths: the embedder pads each of its batches to the longest text, so
    # slicing in arrival order would mix short and long texts that one call would have sorted.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    vectors = await in_slices(deps, embed, [texts[i] for i in order], executor=executor)
    out: list[list[float]] = [[] for _ in texts]
    for i, vector in zip(order, vectors, strict=True):
        out[i] = vector
    return out


def _dedupe_chunks(
    salt: str, chunks: Sequence[Chunk], *, first: bool = False
) -> list[tuple[str, Chunk]]:
    """(hash, chunk) of each distinct chunk. With ``first`` (a document with facts, which its
    first chunk carries), the first chunk's hash also says it is first: a chunk that becomes
    or stops being first is a new chunk, so the facts move with it (a title-less document's
    first chunk can be an old later one when a lead-in is cut)."""
    out: list[tuple[str, Chunk]] = []
    seen: set[str] = set()
    for index, c in enumerate(chunks):
        h = content_hash(f"{salt}\x00first" if first and index == 0 else salt, c.text)
        if h not in seen:
            seen.add(h)
            out.append((h, c))
    return out
