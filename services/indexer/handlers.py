"""Document event handlers: plain async functions that receive their dependencies.
No faust here: the agent in app.py decodes, calls ``handle_record`` and moves on."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.chunking import Chunk, Chunker
from services.core.contracts import DocumentEvent, parse_document_event
from services.core.embedding import Embedder
from services.core.errors import PermanentError, TransientError
from services.core.extraction import Extraction, Extractor
from services.indexer import graph_writer as gw
from services.indexer.ordering import StoredDoc, content_hash, decide_delete, decide_upsert
from services.indexer.resolution import ResolverConfig, document_surfaces, local_canonical

log = logging.getLogger(__name__)

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


async def handle_record(deps: IndexerDeps, record: RawRecord) -> Outcome:
    """Apply one record, or dead-letter it with a reason. Transient failures keep retrying
    (the offset is not committed meanwhile, so nothing is lost)."""
    try:
        event = parse_document_event(record.value or b"", deps.max_document_bytes)
    except PermanentError as exc:
        await dead_letter(deps, record, exc, event=None)
        return "dead_lettered"
    delay = 0.5
    while True:
        try:
            return await apply_event(deps, event)
        except PermanentError as exc:
            await dead_letter(deps, record, exc, event=event)
            return "dead_lettered"
        except (TransientError, OperationalError, DBAPIError) as exc:
            if isinstance(exc, DBAPIError) and not _transient_db(exc):
                await dead_letter(
                    deps, record, PermanentError("processing_failed", str(exc.orig)), event=event
                )
                return "dead_lettered"
            log.warning(
                "transient failure on %s, retrying in %.1fs: %s", event.event_id, delay, exc
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)


async def apply_event(deps: IndexerDeps, event: DocumentEvent) -> Outcome:
    """Apply a validated event in one transaction (dedupe, order, diff, merge, change log)."""
    if event.type == "delete":
        return await _apply_delete(deps, event)
    return await _apply_upsert(deps, event)


async def _apply_upsert(deps: IndexerDeps, event: DocumentEvent) -> Outcome:
    doc_hash = content_hash(event.title, event.text)
    planned = _dedupe_chunks(event.title, deps.chunker.split(_document_text(event)))
    # Cheap pre-check outside the transaction, so duplicates and stale events cost no CPU.
    async with deps.engine.connect() as conn:
        if await _already_processed(conn, event.event_id):
            return "duplicate"
        worth_it = decide_upsert(await _stored_doc(conn, event.doc_id, lock=False), event, doc_hash)
        existing = await gw.existing_chunk_hashes(conn, event.doc_id)
    fresh = [(h, c) for h, c in planned if h not in existing] if worth_it == "apply" else []
    embeddings, extractions = await _embed_and_extract(deps, event, [c for _, c in fresh])
    computed = {h: (e, x) for (h, _), e, x in zip(fresh, embeddings, extractions, strict=True)}
    resolution = await _prepare_resolution(deps, event.title, extractions)

    async with deps.engine.begin() as conn:
        if not await _mark_processed(conn, event, "pending"):
            return "duplicate"
        stored = await _stored_doc(conn, event.doc_id, lock=True)
        decision = decide_upsert(stored, event, doc_hash)
        if decision != "apply":
            await _set_outcome(conn, event.event_id, decision)
            return decision
        current = await gw.existing_chunk_hashes(conn, event.doc_id)
        if any(h not in current and h not in computed for h, _ in planned):
            # Another writer changed the document between the pre-check and the lock.
            raise TransientError(f"{event.doc_id} changed under us; recomputing")
        await _write_document(conn, event, doc_hash, deleted=False)
        wanted = {h for h, _ in planned}
        changes = gw.ChangeSet()
        ents, rels = await gw.remove_chunks(
            conn, [i for h, i in current.items() if h not in wanted]
        )
        await gw.reorder_chunks(conn, {current[h]: c.ord for h, c in planned if h in current})
        new_chunks = [
            gw.NewChunk(
                ord=c.ord,
                diff_hash=h,
                text=c.text,
                token_count=c.token_count,
                start_char=c.start_char,
                end_char=c.end_char,
                embedding=computed[h][0],
                extraction=computed[h][1],
            )
            for h, c in planned
            if h not in current
        ]
        e2, r2 = await gw.add_chunks(
            conn,
            doc_id=event.doc_id,
            title=event.title,
            chunks=new_chunks,
            resolution=resolution,
            changes=changes,
        )
        await gw.rebuild(conn, ents | e2, rels | r2, changes)
        await _record_token_usage(conn, event.doc_id, [c.extraction for c in new_chunks])
        await gw.log_changes(conn, changes, event.doc_id, event.event_id)
        await _set_outcome(conn, event.event_id, "applied")
    return "applied"


async def _apply_delete(deps: IndexerDeps, event: DocumentEvent) -> Outcome:
    async with deps.engine.begin() as conn:
        if not await _mark_processed(conn, event, "pending"):
            return "duplicate"
        stored = await _stored_doc(conn, event.doc_id, lock=True)
        decision = decide_delete(stored, event)
        if decision != "apply":
            await _set_outcome(conn, event.event_id, decision)
            return decision
        changes = gw.ChangeSet()
        current = await gw.existing_chunk_hashes(conn, event.doc_id)
        ents, rels = await gw.remove_chunks(conn, list(current.values()))
        await gw.rebuild(conn, ents, rels, changes)
        await _write_document(conn, event, None, deleted=True)
        await gw.log_changes(conn, changes, event.doc_id, event.event_id)
        await _set_outcome(conn, event.event_id, "deleted")
    return "deleted"


async def _prepare_resolution(
    deps: IndexerDeps, title: str, extractions: Sequence[Extraction]
) -> gw.Resolution:
    """Short forms within the document, and name embeddings for keys the database lacks
    (embedded once here, outside the transaction)."""
    mentioned = [e for x in extractions for e in gw.with_title(title, x).entities]
    canonical = local_canonical(mentioned)
    surfaces = document_surfaces(mentioned, canonical)
    async with deps.engine.connect() as conn:
        known = await conn.execute(
            text("SELECT DISTINCT key FROM entities WHERE key = ANY(:k)"), {"k": sorted(surfaces)}
        )
        missing = sorted(set(surfaces) - {r[0] for r in known.all()})
    vectors: list[list[float]] = []
    if missing:
        names = [surfaces[k].name for k in missing]
        loop = asyncio.get_running_loop()
        vectors = await loop.run_in_executor(deps.executor, deps.embedder.embed, names)
    return gw.Resolution(canonical, dict(zip(missing, vectors, strict=True)), deps.resolver)


async def _embed_and_extract(
    deps: IndexerDeps, event: DocumentEvent, chunks: Sequence[Chunk]
) -> tuple[list[list[float]], list[Extraction]]:
    if not chunks:
        return [], []
    texts = [c.text for c in chunks]
    loop = asyncio.get_running_loop()
    embed_inputs = [t if i == 0 else f"{event.title}\n{t}" for i, t in enumerate(texts)]
    embeddings = await loop.run_in_executor(deps.executor, deps.embedder.embed, embed_inputs)
    try:
        extractions = await loop.run_in_executor(deps.executor, deps.extractor.extract, texts)
    except (TransientError, PermanentError):
        # Transient: the LLM client already retried; handle_record keeps retrying with backoff
        # and the offset stays uncommitted, so an outage delays events but loses none.
        raise
    except Exception as exc:  # a broken extractor must not stop the stream
        raise PermanentError("extraction_failed", f"{type(exc).__name__}: {exc}") from exc
    return embeddings, extractions


async def dead_letter(
    deps: IndexerDeps, record: RawRecord, exc: PermanentError, event: DocumentEvent | None
) -> None:
    """Keep the raw record with its reason in the table and on the dead-letter topic."""
    raw = record.value or b""
    key = record.key.decode("utf-8", "replace") if record.key is not None else None
    event_id = event.event_id if event else None
    doc_id = event.doc_id if event else key
    async with deps.engine.begin() as conn:
        await conn.execute(
            text(
                'INSERT INTO dead_letters (event_id, doc_id, topic, partition, "offset", key, raw,'
                " reason, detail) VALUES (:e, :d, :t, :p, :o, :k, :r, :why, :detail)"
                ' ON CONFLICT (topic, partition, "offset") DO NOTHING'
            ),
            {
                "e": event_id,
                "d": doc_id,
                "t": record.topic,
                "p": record.partition,
                "o": record.offset,
                "k": key,
                "r": raw,
                "why": exc.reason,
                "detail": exc.detail[:4000],
            },
        )
        if event is not None:
            await _mark_processed(conn, event, "dead_lettered")
    payload = {
        "schema_version": 1,
        "reason": exc.reason,
        "detail": exc.detail[:4000],
        "event_id": event_id,
        "doc_id": doc_id,
        "source": {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "key": key,
        },
        "raw_base64": base64.b64encode(raw).decode("ascii"),
        "failed_at": datetime.now(UTC).isoformat(),
    }
    await deps.publish_dead_letter(record.key, json.dumps(payload).encode("utf-8"))
    log.warning("dead-lettered %s/%s@%s: %s", record.topic, record.partition, record.offset, exc)


def _document_text(event: DocumentEvent) -> str:
    # The title leads the first chunk: it is the passage's subject and helps both retrievers.
    return f"{event.title}\n\n{event.text}" if event.title else event.text


def _dedupe_chunks(title: str, chunks: Sequence[Chunk]) -> list[tuple[str, Chunk]]:
    out: list[tuple[str, Chunk]] = []
    seen: set[str] = set()
    for c in chunks:
        h = content_hash(title, c.text)
        if h not in seen:
            seen.add(h)
            out.append((h, c))
    return out


async def _already_processed(conn: AsyncConnection, event_id: str) -> bool:
    found = await conn.scalar(
        text("SELECT 1 FROM processed_events WHERE event_id = :e"), {"e": event_id}
    )
    return found is not None


async def _mark_processed(conn: AsyncConnection, event: DocumentEvent, outcome: str) -> bool:
    inserted = await conn.scalar(
        text(
            "INSERT INTO processed_events (event_id, doc_id, outcome) VALUES (:e, :d, :o)"
            " ON CONFLICT (event_id) DO NOTHING RETURNING 1"
        ),
        {"e": event.event_id, "d": event.doc_id, "o": outcome},
    )
    return inserted is not None


async def _set_outcome(conn: AsyncConnection, event_id: str, outcome: str) -> None:
    await conn.execute(
        text("UPDATE processed_events SET outcome = :o WHERE event_id = :e"),
        {"o": outcome, "e": event_id},
    )


async def _stored_doc(conn: AsyncConnection, doc_id: str, *, lock: bool) -> StoredDoc | None:
    sql = "SELECT version, content_hash, occurred_at, deleted FROM documents WHERE doc_id = :d"
    row = (await conn.execute(text(sql + (" FOR UPDATE" if lock else "")), {"d": doc_id})).first()
    if row is None:
        return None
    return StoredDoc(row.version, row.content_hash, row.occurred_at, row.deleted)


async def _write_document(
    conn: AsyncConnection, event: DocumentEvent, doc_hash: str | None, *, deleted: bool
) -> None:
    await conn.execute(
        text(
            "INSERT INTO documents (doc_id, tenant, title, version, content_hash, metadata, acl,"
            " occurred_at, deleted, last_event_id) VALUES (:d, :tn, :t, :v, :h,"
            " CAST(:m AS jsonb), :acl, :at, :del, :e)"
            " ON CONFLICT (doc_id) DO UPDATE SET tenant = EXCLUDED.tenant,"
            " title = CASE WHEN EXCLUDED.deleted THEN documents.title ELSE EXCLUDED.title END,"
            " version = EXCLUDED.version, content_hash = EXCLUDED.content_hash,"
            " metadata = CASE WHEN EXCLUDED.deleted THEN documents.metadata"
            "  ELSE EXCLUDED.metadata END,"
            " acl = EXCLUDED.acl, occurred_at = EXCLUDED.occurred_at, deleted = EXCLUDED.deleted,"
            " last_event_id = EXCLUDED.last_event_id, updated_at = now()"
        ),
        {
            "d": event.doc_id,
            "tn": event.tenant,
            "t": event.title,
            "v": event.version,
            "h": doc_hash,
            "m": json.dumps(event.metadata),
            "acl": event.acl,
            "at": event.occurred_at,
            "del": deleted,
            "e": event.event_id,
        },
    )


def _transient_db(exc: DBAPIError) -> bool:
    if exc.connection_invalidated or isinstance(exc, OperationalError):
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None) or ""
    # 40001 serialization failure, 40P01 deadlock, 08xxx connection, 53xxx resources, 57P0x shutdown
    return sqlstate.startswith(("40", "08", "53", "57P"))


async def _record_token_usage(
    conn: AsyncConnection, doc_id: str, extractions: Sequence[Extraction]
) -> None:
    # One row per document and model, in the event's transaction: a redelivered event that
    # turns out a duplicate records nothing, so tokens are counted once per applied version.
    totals: dict[str, tuple[int, int]] = {}
    for x in extractions:
        if x.usage is not None:
            prompt, completion = totals.get(x.usage.model, (0, 0))
            totals[x.usage.model] = (
                prompt + x.usage.prompt_tokens,
                completion + x.usage.completion_tokens,
            )
    if not totals:
        return
    await conn.execute(
        text(
            "INSERT INTO token_usage (doc_id, purpose, model, prompt_tokens, completion_tokens)"
            " VALUES (:d, 'extraction', :m, :p, :c)"
        ),
        [{"d": doc_id, "m": m, "p": p, "c": c} for m, (p, c) in sorted(totals.items())],
    )
