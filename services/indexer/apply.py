"""The write side: one transaction per event. Dedupe and ordering are decided again under the
document's row lock; then the diff is merged and the change log appended."""

from __future__ import annotations

from services.core.contracts import DocumentEvent
from services.core.errors import StaleComputeError
from services.indexer import graph_writer as gw
from services.indexer.compute import Computed, UpsertPlan
from services.indexer.deps import IndexerDeps, Outcome
from services.indexer.documents import (
    existing_chunk_hashes,
    mark_processed,
    record_token_usage,
    set_outcome,
    stored_doc,
    update_attributes,
    write_document,
)
from services.indexer.ordering import decide_delete, decide_upsert


async def commit_upsert(
    deps: IndexerDeps, plan: UpsertPlan, computed: Computed, published_at: float | None = None
) -> Outcome:
    """Apply a planned upsert; TransientError if the document moved since it was planned.
    ``published_at``: the Kafka record's timestamp (seconds), kept for freshness."""
    event = plan.event
    if plan.duplicate:
        return "duplicate"
    async with deps.engine.begin() as conn:
        if not await mark_processed(conn, event, "pending", published_at):
            return "duplicate"
        stored = await stored_doc(conn, event.doc_id, lock=True, max_skew_s=deps.max_clock_skew_s)
        decision = decide_upsert(stored, event, plan.doc_hash)
        if decision == "unchanged" and await update_attributes(conn, event):
            # Same content, new access rules or metadata: the row changes, the graph does not.
            await set_outcome(conn, event.event_id, "applied")
            return "applied"
        if decision != "apply":
            await set_outcome(conn, event.event_id, decision)
            return decision
        current = await existing_chunk_hashes(conn, event.doc_id)
        if any(h not in current and h not in computed.chunks for h, _ in plan.planned):
            # Another event for this document landed between planning and the lock.
            raise StaleComputeError(f"{event.doc_id} changed since it was planned; recomputing")
        await write_document(conn, event, plan.doc_hash, deleted=False)
        wanted = {h for h, _ in plan.planned}
        changes = gw.ChangeSet()
        ents, rels = await gw.remove_chunks(
            conn, [i for h, i in current.items() if h not in wanted]
        )
        await gw.reorder_chunks(
            conn,
            [
                (current[h], c.ord, c.start_char, c.end_char)
                for h, c in plan.planned
                if h in current
            ],
        )
        new_chunks = [
            gw.NewChunk(
                ord=c.ord,
                diff_hash=h,
                text=c.text,
                token_count=c.token_count,
                start_char=c.start_char,
                end_char=c.end_char,
                embedding=computed.chunks[h][0],
                extraction=computed.chunks[h][1],
            )
            for h, c in plan.planned
            if h not in current
        ]
        e2, r2 = await gw.add_chunks(
            conn,
            doc_id=event.doc_id,
            title=event.title,
            chunks=new_chunks,
            resolution=computed.resolution,
            changes=changes,
        )
        await record_token_usage(conn, event.doc_id, [c.extraction for c in new_chunks])
        # Last: the shared entity and relationship rows stay locked from here to commit.
        await gw.rebuild(conn, ents | e2, rels | r2, changes)
        await gw.log_changes(conn, changes, event.doc_id, event.event_id)
        await set_outcome(conn, event.event_id, "applied")
    deps.observer.chunks(reused=len(plan.planned) - len(new_chunks), embedded=len(new_chunks))
    return "applied"


async def apply_delete(
    deps: IndexerDeps, event: DocumentEvent, published_at: float | None = None
) -> Outcome:
    """Remove the document's chunks and everything only they evidenced; leave a tombstone."""
    async with deps.engine.begin() as conn:
        if not await mark_processed(conn, event, "pending", published_at):
            return "duplicate"
        stored = await stored_doc(conn, event.doc_id, lock=True, max_skew_s=deps.max_clock_skew_s)
        decision = decide_delete(stored, event)
        if decision != "apply":
            await set_outcome(conn, event.event_id, decision)
            return decision
        changes = gw.ChangeSet()
        current = await existing_chunk_hashes(conn, event.doc_id)
        ents, rels = await gw.remove_chunks(conn, list(current.values()))
        await write_document(conn, event, None, deleted=True)
        await gw.rebuild(conn, ents, rels, changes)
        await gw.log_changes(conn, changes, event.doc_id, event.event_id, erasure=True)
        await set_outcome(conn, event.event_id, "deleted")
    return "deleted"
