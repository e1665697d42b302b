"""Curations reach the documents already stored: every document a new (or undone) rule may
resolve differently is resolved again under the rules in force, through the ingest's own write
plan (services/indexer/compute.py ``recompute``, graph_store ``write_reresolve``). The graph then
equals what ingesting the surviving documents under the same rules would build: the rule is
applied the one way an ingest applies it.

Run by the indexer every ``KGSTREAM_CURATION_APPLY_INTERVAL_S`` and by ``kgstream curate apply``,
one applier at a time (a session advisory lock). The documents to do are queued in
``curation_work`` for the rules' version, and each is marked done in the transaction that
resolves it again, so a run that stops (a crash, a transient failure) goes on where it was:
nothing is lost, and no document is re-extracted twice for the same rules. Documents that
arrive while it runs are queued too before the rules are marked applied. A document that keeps
failing transiently is left for the next run, and the rules stay pending; one whose extraction
fails for good is recorded as failed, logged, and left as it was.

Cost: the documents that mention either name are extracted again (an LLM extractor is asked
again for each of their chunks)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.chunking import Chunk
from services.core.contracts import DocumentEvent
from services.core.curations import (
    add_work,
    failed_documents,
    mark_applied,
    pending,
    rules_version,
    settle,
    todo,
)
from services.core.errors import PermanentError, StaleComputeError, TransientError
from services.core.facts import from_stored
from services.core.failures import is_transient
from services.indexer.compute import recompute
from services.indexer.deps import IndexerDeps
from services.indexer.graph_store.transaction import write_reresolve
from services.indexer.write_plan import UpsertPlan

log = logging.getLogger(__name__)

# pg_advisory_lock key: "kgcurat" in ASCII, one applier per database.
APPLIER_LOCK = 0x6B6763757261
_TRY_LOCK = text("SELECT pg_try_advisory_lock(:k)")
_UNLOCK = text("SELECT pg_advisory_unlock(:k)")
_DOCUMENT = text(
    "SELECT title, tenant, content_hash, deleted, facts::text AS facts FROM documents"
    " WHERE doc_id = :d"
)
_CHUNKS = text(
    "SELECT content_hash, ord, text, start_char, end_char, token_count FROM chunks"
    " WHERE doc_id = :d ORDER BY ord"
)
# A document that keeps moving under the applier is left for its next run.
MAX_ATTEMPTS = 5

Progress = Callable[[int, int], None]  # (documents done, documents seen so far)


@dataclass(frozen=True)
class ApplyReport:
    """What one run did."""

    curations: int  # rule changes applied (made or undone); 0 while documents are left
    documents: int  # documents resolved again by this run
    gone: int  # queued documents deleted meanwhile
    failed: list[str]  # documents whose extraction failed for good (logged), by id
    deferred: int = 0  # documents left for the next run after transient failures
    busy: bool = False  # another applier holds the lock; nothing done


async def apply_pending(deps: IndexerDeps, progress: Progress | None = None) -> ApplyReport:
    """Resolve again every document the pending rule changes may affect, then mark them
    applied (see the module docstring)."""
    async with deps.engine.connect() as conn:
        if not await conn.scalar(_TRY_LOCK, {"k": APPLIER_LOCK}):
            await conn.rollback()
            return ApplyReport(0, 0, 0, [], busy=True)
        try:
            return await _apply(deps, conn, progress)
        finally:
            await _unlock(conn)


async def _unlock(conn: AsyncConnection) -> None:
    """Release the session lock; a connection that cannot is dropped, never pooled with it."""
    try:
        await conn.rollback()
        await conn.execute(_UNLOCK, {"k": APPLIER_LOCK})
        await conn.commit()
    except Exception:  # the connection is broken: closing it releases the lock
        await conn.invalidate()
        raise


async def _apply(
    deps: IndexerDeps, conn: AsyncConnection, progress: Progress | None
) -> ApplyReport:
    rules = await pending(conn)
    if not rules.made and not rules.undone:
        await conn.commit()
        return ApplyReport(0, 0, 0, [])
    version = await rules_version(conn)
    await add_work(conn, version, rules.keys)
    await conn.commit()
    ruled = frozenset(rules.keys)
    done = gone = deferred = 0
    while not deferred:
        batch = await todo(conn, version)
        await conn.commit()
        if not batch:
            # Documents that came to name these keys while the run went on.
            added = await add_work(conn, version, rules.keys)
            await conn.commit()
            if not added:
                break
            continue
        for doc_id in batch:
            outcome = await _one(deps, doc_id, ruled)
            done += outcome == "done"
            gone += outcome == "gone"
            deferred += outcome == "deferred"
            if progress is not None:
                progress(done + gone, done + gone + deferred)
    failed = await failed_documents(conn)
    await conn.commit()
    if deferred:
        return ApplyReport(0, done, gone, failed, deferred)
    await mark_applied(deps.engine, rules)
    changes = len(rules.made) + len(rules.undone)
    log.info(
        "curations applied: %d rule change(s), %d document(s) resolved again, %d gone, %d failed",
        changes,
        done,
        gone,
        len(failed),
    )
    return ApplyReport(changes, done, gone, failed)


async def _one(
    deps: IndexerDeps, doc_id: str, ruled: frozenset[str]
) -> Literal["done", "gone", "failed", "deferred"]:
    """One queued document: resolved again, gone, failed for good (recorded), or left for the
    next run after a transient failure. Anything else is a bug and propagates."""
    try:
        return "done" if await resolve_again(deps, doc_id, ruled) else "gone"
    except PermanentError:
        log.exception("curation apply: %s cannot be resolved again", doc_id)
        async with deps.engine.begin() as write:
            await settle(write, doc_id, "failed")
        return "failed"
    except Exception as exc:
        if not (isinstance(exc, TransientError | OSError) or is_transient(exc)):
            raise
        log.warning("curation apply: %s left for the next run: %s", doc_id, exc)
        return "deferred"


async def resolve_again(
    deps: IndexerDeps, doc_id: str, ruled_keys: frozenset[str] = frozenset()
) -> bool:
    """Resolve one stored document again under the rules in force and mark its work done;
    False when it is gone. ``ruled_keys``: the names the applied rules are about. An alias or
    an entity of one of those names that only documents still to do support was made under
    the old rules, so it does not count: for those names the result is what ingesting the
    affected documents again, after the others and in order, gives. Other names resolve as they
    are (a rule about "Mao" leaves how "Patel" resolves alone). StaleComputeError when the
    document kept changing under MAX_ATTEMPTS plans."""
    for _ in range(MAX_ATTEMPTS):
        async with deps.engine.connect() as conn:
            doc = (await conn.execute(_DOCUMENT, {"d": doc_id})).one_or_none()
            rows = [] if doc is None else (await conn.execute(_CHUNKS, {"d": doc_id})).all()
        if doc is None or doc.deleted:
            async with deps.engine.begin() as conn:
                await settle(conn, doc_id)
            return False
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
            tenant=doc.tenant,  # resolved again in its own tenant's scope
            occurred_at=datetime.now(UTC),
            # The publisher's facts as stored: resolved again with the rest of the document.
            **from_stored(json.loads(doc.facts) if doc.facts else None),
        )
        plan = UpsertPlan(event, str(doc.content_hash), chunks, chunks)
        # The write keeps the chunks and their vectors: no embedding is needed.
        write = replace(
            await recompute(deps, plan, {h: () for h, _ in chunks}), ruled_keys=ruled_keys
        )
        try:
            return await write_reresolve(deps, write)
        except StaleComputeError:
            continue
    raise StaleComputeError(f"{doc_id} kept changing while its curations were applied")
