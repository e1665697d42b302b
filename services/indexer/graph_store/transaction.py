"""One event, one transaction: dedupe and ordering decided again under the document's row lock,
then the write plan merged into the graph and the change log appended. The order of the steps
is the order of graph_store/locks.py's rules."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.contracts import DocumentEvent
from services.core.curations import hold_rules, settle
from services.core.errors import StaleComputeError
from services.indexer.deps import IndexerDeps, Outcome
from services.indexer.documents import (
    changed_attributes,
    existing_chunk_hashes,
    mark_processed,
    record_token_usage,
    set_outcome,
    stored_doc,
    update_attributes,
    write_document,
)
from services.indexer.graph_store.changes import ChangeSet, log_access, log_changes
from services.indexer.graph_store.chunks import (
    AliasRow,
    clear_extraction,
    insert_chunks,
    insert_mentions,
    insert_times,
    move_chunks,
    remove_chunks,
)
from services.indexer.graph_store.entities import resolve_entities
from services.indexer.graph_store.history import keep_changed_document, keep_replaced
from services.indexer.graph_store.rebuild import rebuild
from services.indexer.graph_store.relationships import add_relationships
from services.indexer.ordering import decide_delete, decide_upsert, moves_access, moves_tenant
from services.indexer.write_plan import WritePlan


async def write_upsert(
    deps: IndexerDeps, plan: WritePlan, published_at: float | None = None
) -> Outcome:
    """Write an upsert's plan; StaleComputeError if the document or the graph moved in a way
    the plan cannot absorb. ``published_at``: the Kafka record's timestamp (seconds), kept for
    freshness."""
    event = plan.event
    if plan.duplicate:
        return "duplicate"
    async with deps.engine.begin() as conn:
        if not await mark_processed(conn, event, "pending", published_at):
            return "duplicate"
        # Rule 1: the document's row.
        stored = await stored_doc(conn, event.doc_id, lock=True, max_skew_s=deps.max_clock_skew_s)
        decision = decide_upsert(stored, event, plan.doc_hash)
        if decision == "unchanged":
            # Same content, new access rules or metadata: the row changes, the graph does not
            # (the row it replaces stays readable through as_of).
            await keep_changed_document(
                conn,
                event.doc_id,
                event.occurred_at,
                changed_attributes(event),
                days=deps.history_days,
            )
            if await update_attributes(conn, event):
                if moves_access(stored, event):
                    await log_access(conn, event.doc_id, event.event_id)
                await set_outcome(conn, event.event_id, "applied")
                return "applied"
        if decision != "apply":
            await set_outcome(conn, event.event_id, decision)
            return decision
        current = await existing_chunk_hashes(conn, event.doc_id)
        if not plan.holds_for(current, moved=moves_tenant(stored, event)):
            # Another event for this document landed between planning and the lock.
            raise StaleComputeError(f"{event.doc_id} changed since it was planned; recomputing")
        # A document that changes tenant loses every chunk, and gets them all anew.
        wanted = (
            set() if plan.moved else {h for h, _ in plan.kept} | {c.diff_hash for c in plan.new}
        )
        removed = [i for h, i in current.items() if h not in wanted]
        # What this version replaces stays readable through as_of (graph_store/history.py).
        await keep_replaced(conn, event.doc_id, removed, event.occurred_at, days=deps.history_days)
        await write_document(conn, event, plan.doc_hash, deleted=False)
        ents, rels = await remove_chunks(conn, removed)
        await move_chunks(
            conn, [(current[h], c.ord, c.start_char, c.end_char) for h, c in plan.kept]
        )
        changes = ChangeSet()
        if plan.new:
            await hold_rules(conn, plan.rules)
            chunk_ids = await insert_chunks(conn, event.doc_id, plan.new, event.occurred_at)
            # Rules 2 and 3: creation locks, then key-share locks on what it refers to.
            named, related, aliases = await _write_facts(conn, plan, chunk_ids, changes)
            ents |= named
            rels |= related
        else:
            aliases = []
        await record_token_usage(conn, event.doc_id, plan.tokens)
        # Rules 4 and 5, last: the shared rows stay locked from here to commit.
        await rebuild(conn, ents, rels, changes, removed_evidence=bool(removed), aliases=aliases)
        await log_changes(conn, changes, event.doc_id, event.event_id)
        if moves_access(stored, event):  # its kept chunks are seen by others now
            await log_access(conn, event.doc_id, event.event_id)
        await set_outcome(conn, event.event_id, "applied")
    deps.observer.chunks(reused=len(plan.kept), embedded=len(plan.new))
    return "applied"


async def write_delete(
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
        changes = ChangeSet()
        current = await existing_chunk_hashes(conn, event.doc_id)
        chunk_ids = list(current.values())
        await keep_replaced(
            conn, event.doc_id, chunk_ids, event.occurred_at, days=deps.history_days
        )
        ents, rels = await remove_chunks(conn, chunk_ids)
        await write_document(conn, event, None, deleted=True)
        await rebuild(conn, ents, rels, changes, removed_evidence=True)
        await log_changes(conn, changes, event.doc_id, event.event_id, erasure=True)
        await set_outcome(conn, event.event_id, "deleted")
    return "deleted"


async def write_reresolve(deps: IndexerDeps, plan: WritePlan) -> bool:
    """Resolve a stored document again under the curations in force (services/indexer/
    curation_apply.py): its chunks stay, their mentions and relationship evidence are written
    again from ``plan`` (every chunk ``new``, by diff hash) exactly as an ingest of the document
    would write them, and the shared rows are rebuilt; its apply work is marked done in the same
    transaction. False when the document is gone; StaleComputeError when it or the rules moved
    since the plan was made."""
    doc_id = plan.event.doc_id
    async with deps.engine.begin() as conn:
        stored = await stored_doc(conn, doc_id, lock=True, max_skew_s=deps.max_clock_skew_s)
        if stored is None or stored.deleted:
            await settle(conn, doc_id)
            return False
        current = await existing_chunk_hashes(conn, doc_id)
        if stored.content_hash != plan.doc_hash or set(current) != {c.diff_hash for c in plan.new}:
            raise StaleComputeError(f"{doc_id} changed since it was planned; recomputing")
        await hold_rules(conn, plan.rules)
        ents, rels = await clear_extraction(conn, sorted(current.values()))
        chunk_ids = {c.diff_hash: current[c.diff_hash] for c in plan.new}
        changes = ChangeSet()
        named, related, aliases = await _write_facts(conn, plan, chunk_ids, changes)
        ents |= named
        rels |= related
        await record_token_usage(conn, doc_id, plan.tokens)
        await rebuild(conn, ents, rels, changes, removed_evidence=True, aliases=aliases)
        await log_changes(conn, changes, doc_id, plan.event.event_id)
        await settle(conn, doc_id)
    return True


async def _write_facts(
    conn: AsyncConnection, plan: WritePlan, chunk_ids: Mapping[str, int], changes: ChangeSet
) -> tuple[set[int], set[int], list[AliasRow]]:
    """Resolve the plan's surfaces, then write its mentions, the times its sentences state and
    the evidence of its extracted and provided relations; return the entities and
    relationships they touched, and the aliases its mentions support (written by
    ``rebuild``, under the entities' locks)."""
    doc_id = plan.event.doc_id
    resolved = await resolve_entities(conn, plan)
    changes.nodes_added |= resolved.added
    changes.retype.update(resolved.retype)
    ents, aliases = await insert_mentions(conn, doc_id, plan.mentions, resolved.ids, chunk_ids)
    await insert_times(conn, doc_id, plan.times, chunk_ids)
    rels = await add_relationships(
        conn,
        doc_id=doc_id,
        relations=plan.relations,
        provided=plan.provided_relations,
        entity_ids=resolved.ids,
        chunk_ids=chunk_ids,
        changes=changes,
    )
    return ents, rels, aliases
