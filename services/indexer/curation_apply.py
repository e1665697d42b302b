"""Curations reach the documents already stored: every document a new (or undone) rule may
resolve differently is resolved again under the rules in force, through the ingest's own write
plan (services/indexer/compute.py ``recompute``, graph_store ``write_reresolve``). The graph then
equals what ingesting the surviving documents under the same rules would build: the rule is
applied the one way an ingest applies it.

Run by the indexer every ``KGSTREAM_CURATION_APPLY_INTERVAL_S`` and by ``kgstream curate apply``.
One applier at a time (a session advisory lock); a crash leaves the curations pending, and the
next run resolves their documents again (it is idempotent), so nothing is lost or half done
for long. Cost: the documents that mention either name are extracted again (an LLM extractor is
asked again for each of their chunks)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from sqlalchemy import text

from services.core.chunking import Chunk
from services.core.contracts import DocumentEvent
from services.core.curations import affected_documents, mark_applied, pending
from services.core.errors import PermanentError, StaleComputeError
from services.indexer.compute import recompute
from services.indexer.deps import IndexerDeps
from services.indexer.graph_store.transaction import write_reresolve
from services.indexer.write_plan import UpsertPlan

log = logging.getLogger(__name__)

# pg_advisory_lock key: "kgcurat" in ASCII, one applier per database.
APPLIER_LOCK = 0x6B6763757261
_TRY_LOCK = text("SELECT pg_try_advisory_lock(:k)")
_UNLOCK = text("SELECT pg_advisory_unlock(:k)")
_DOCUMENT = text("SELECT title, content_hash, deleted FROM documents WHERE doc_id = :d")
_CHUNKS = text(
    "SELECT content_hash, ord, text, start_char, end_char, token_count FROM chunks"
    " WHERE doc_id = :d ORDER BY ord"
)
# A document that keeps moving under the applier is left for its next run.
MAX_ATTEMPTS = 5

Progress = Callable[[int, int], None]  # (documents done, documents in all)


@dataclass(frozen=True)
class ApplyReport:
    """What one run did."""

    curations: int  # rule changes applied (made or undone)
    documents: int  # documents resolved again
    gone: int  # affected documents deleted meanwhile
    failed: list[str]  # documents that could not be resolved again (logged), by id
    busy: bool = False  # another applier holds the lock; nothing done


async def apply_pending(deps: IndexerDeps, progress: Progress | None = None) -> ApplyReport:
    """Resolve again every document the pending rule changes may affect, then mark them
    applied. Transient failures propagate (the curations stay pending for the next run)."""
    async with deps.engine.connect() as lock_conn:
        if not await lock_conn.scalar(_TRY_LOCK, {"k": APPLIER_LOCK}):
            return ApplyReport(0, 0, 0, [], busy=True)
        try:
            todo = await pending(lock_conn)
            docs = await affected_documents(lock_conn, todo.keys)
            await lock_conn.commit()  # end the read; the session lock stays
            if not todo.made and not todo.undone:
                return ApplyReport(0, 0, 0, [])
            done = gone = 0
            failed: list[str] = []
            for i, doc_id in enumerate(docs):
                try:
                    if await resolve_again(deps, doc_id, frozenset(docs[i:]), frozenset(todo.keys)):
                        done += 1
                    else:
                        gone += 1
                except PermanentError:
                    log.exception("curation apply: %s cannot be resolved again", doc_id)
                    failed.append(doc_id)
                if progress is not None:
                    progress(i + 1, len(docs))
            await mark_applied(deps.engine, todo)
            log.info(
                "curations applied: %d rule change(s), %d document(s) resolved again,"
                " %d gone, %d failed",
                len(todo.made) + len(todo.undone),
                done,
                gone,
                len(failed),
            )
            return ApplyReport(len(todo.made) + len(todo.undone), done, gone, failed)
        finally:
            await lock_conn.execute(_UNLOCK, {"k": APPLIER_LOCK})
            await lock_conn.commit()


async def resolve_again(
    deps: IndexerDeps,
    doc_id: str,
    unsettled: frozenset[str] = frozenset(),
    ruled_keys: frozenset[str] = frozenset(),
) -> bool:
    """Resolve one stored document again under the rules in force; False when it is gone.
    ``unsettled``: the documents still to be resolved again (this one among them);
    ``ruled_keys``: the names the applied rules are about. An alias of one of those names that
    only unsettled documents support was made under the old rules, so it does not count: for
    those names the result is what ingesting the affected documents again, after the others
    and in order, gives. Other aliases count as they are (a rule about "Mao" leaves how "Patel"
    resolves alone). StaleComputeError when it kept changing under MAX_ATTEMPTS plans."""
    for _ in range(MAX_ATTEMPTS):
        async with deps.engine.connect() as conn:
            doc = (await conn.execute(_DOCUMENT, {"d": doc_id})).one_or_none()
            if doc is None or doc.deleted:
                return False
            rows = (await conn.execute(_CHUNKS, {"d": doc_id})).all()
        chunks = [
            (
                str(r.content_hash),
                Chunk(r.ord, r.text, r.start_char, r.end_char, r.token_count, str(r.content_hash)),
            )
            for r in rows
        ]
        event = DocumentEvent(
            event_id=f"curation-apply:{doc_id}",
            type="upsert",
            doc_id=doc_id,
            title=str(doc.title),
            occurred_at=datetime.now(UTC),
        )
        plan = UpsertPlan(event, str(doc.content_hash), chunks, chunks)
        # The write keeps the chunks and their vectors: no embedding is needed.
        write = replace(
            await recompute(deps, plan, {h: () for h, _ in chunks}),
            unsettled=unsettled,
            ruled_keys=ruled_keys,
        )
        try:
            return await write_reresolve(deps, write)
        except StaleComputeError:
            continue
    raise StaleComputeError(f"{doc_id} kept changing while its curations were applied")
