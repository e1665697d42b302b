"""The lock-ordering rules of the graph store, stated once, and every statement that takes a
lock. Several indexers write one graph; each event is one transaction. Its rows (document,
chunks, mentions, evidence) are its own; entities and relationships are shared by its
tenant's documents (a hub entity is named by many documents). The rules, in the order a
transaction meets them:

1. **The document's row first** (``FOR UPDATE``, ``services/indexer/documents.stored_doc``):
   events of one document apply one at a time; dedupe (processed_events) and ordering are
   decided again under it.
2. **Entity-creation locks, one per name key and tenant**, before creating or retyping an
   entity (``lock_names``): transaction-scoped advisory locks on the keys the document creates
   and its short forms of them (they become aliases another writer resolves by), in its
   tenant's scope (services/indexer/scope.py: entities are per tenant), in hash order (two
   writers never wait for each other's), then resolution looks again. Resolution reads what
   other transactions committed, so without them a name created by two writers at the same
   moment would become two entities; with them the second sees the first's entity and merges
   into it. Writers creating different names do not wait for each other; events whose names
   all exist take none. Not covered: near-duplicate names (similar, not equal, keys) created
   by two writers at the same moment stay two entities.
3. **Key-share locks on the shared rows an event refers to**, until commit: the entities it
   resolved to (``hold_entities``; one deleted since it was read makes the plan stale) and the
   relationships that exist already (``EXISTING_RELATIONSHIPS``). A key-share lock keeps the
   row from being deleted under the event and blocks no update, so other writers' weight and
   count updates go on. The foreign-key checks of the event's own rows take the same lock,
   which is why rows are written in the order of the shared rows they refer to: entities
   inserted by key, relationships by (source, target, type), mentions by entity id, evidence
   by relationship id.
4. **Update locks on the shared rows, last, in id order: relationships, then entities**
   (``lock_relationships``, then ``lock_entities``): every writer that added or removed
   evidence of a row rebuilds that row and locks it first, so no two writers deadlock here
   and each rebuild sees the evidence of every writer that held the lock before (no lost
   update). A hub is locked only for the event's last statements. An entity's aliases (the
   surfaces its mentions use) are deleted and inserted under this lock too: an alias inserted
   earlier could be found present by one writer and then deleted by another that locked the
   entity first and could not see the first writer's uncommitted mention.
5. **A row left without evidence is deleted unless another writer holds a key-share lock on
   it** (``unsupported_relationships``, ``orphan_entities``: ``SKIP LOCKED``): that writer is
   adding evidence to it and rebuilds it after this commit; waiting for it here would deadlock
   on the update locks of rule 4. (Only an event that removed evidence looks for such rows:
   graph_store/rebuild.py.)

Nothing outside the graph store takes a lock on these tables, and no outside call (model,
adjudicator) happens while they are held: the compute phase made them before the transaction
(services/indexer/write_plan.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.errors import StaleComputeError
from services.indexer.scope import scoped_name

# Rule 2: two-key advisory locks in their own namespace (the communities' RECOMPUTE_LOCK_KEY
# is a one-key lock).
ENTITY_KEY_LOCK_SPACE = 0x6B67  # "kg"
_KEY_LOCKS = text(
    "SELECT pg_advisory_xact_lock(:space, h) FROM unnest(CAST(:hashes AS int[]))"
    " WITH ORDINALITY AS u(h, i) ORDER BY i"
)
# Rule 3.
_HOLD_ENTITIES = text("SELECT id FROM entities WHERE id = ANY(:ids) ORDER BY id FOR KEY SHARE")
EXISTING_RELATIONSHIPS = text(
    "SELECT r.id, r.source_id, r.target_id, r.type FROM relationships r"
    " JOIN unnest(CAST(:s AS bigint[]), CAST(:t AS bigint[]), CAST(:y AS text[])) AS u(s, t, y)"
    " ON (r.source_id, r.target_id, r.type) = (u.s, u.t, u.y) ORDER BY r.id FOR KEY SHARE OF r"
)
# Rule 4.
_LOCK_RELATIONSHIPS = text(
    "SELECT id FROM relationships WHERE id = ANY(:ids) ORDER BY id FOR NO KEY UPDATE"
)
_LOCK_ENTITIES = text("SELECT id FROM entities WHERE id = ANY(:ids) ORDER BY id FOR NO KEY UPDATE")
# Rule 5.
_UNSUPPORTED_RELATIONSHIPS = text(
    "DELETE FROM relationships WHERE id IN (SELECT r.id FROM relationships r"
    " WHERE r.id = ANY(:ids) AND NOT EXISTS"
    "  (SELECT 1 FROM relationship_evidence v WHERE v.relationship_id = r.id)"
    " ORDER BY r.id FOR UPDATE SKIP LOCKED) RETURNING id"
)
_ORPHAN_ENTITIES = text(
    "SELECT e.id FROM entities e WHERE e.id = ANY(:ids) AND NOT EXISTS"
    " (SELECT 1 FROM mentions m WHERE m.entity_id = e.id)"
    " ORDER BY e.id FOR UPDATE OF e SKIP LOCKED"
)


def key_hash(key: str) -> int:
    """A stable signed 32-bit hash of a name key (the advisory lock's second key)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), signed=True)


async def lock_names(conn: AsyncConnection, tenant: str | None, keys: Sequence[str]) -> None:
    """Rule 2: take the creation locks of ``keys`` in ``tenant``'s scope until commit, in hash
    order."""
    if keys:
        hashes = sorted({key_hash(scoped_name(tenant, k)) for k in keys})
        await conn.execute(_KEY_LOCKS, {"space": ENTITY_KEY_LOCK_SPACE, "hashes": hashes})


async def hold_entities(conn: AsyncConnection, entity_ids: Iterable[int]) -> None:
    """Rule 3: key-share lock the entities a document resolved to, so none is deleted before
    its mentions are in; one deleted since it was read means the plan is stale:
    StaleComputeError, and the event is computed again."""
    ids = sorted(set(entity_ids))
    if not ids:
        return
    held = await conn.execute(_HOLD_ENTITIES, {"ids": ids})
    gone = set(ids) - {int(r[0]) for r in held.all()}
    if gone:
        raise StaleComputeError(f"entities {sorted(gone)} were deleted since they were resolved")


async def lock_relationships(conn: AsyncConnection, rel_ids: Sequence[int]) -> None:
    """Rule 4, first: update locks on the relationships, in id order (sorted by the caller)."""
    await conn.execute(_LOCK_RELATIONSHIPS, {"ids": list(rel_ids)})


async def lock_entities(conn: AsyncConnection, entity_ids: Sequence[int]) -> None:
    """Rule 4, after the relationships: update locks on the entities, in id order (sorted by
    the caller)."""
    await conn.execute(_LOCK_ENTITIES, {"ids": list(entity_ids)})


async def unsupported_relationships(conn: AsyncConnection, rel_ids: Sequence[int]) -> set[int]:
    """Rule 5: delete those of ``rel_ids`` left without evidence that no other writer holds;
    return their ids."""
    gone = await conn.execute(_UNSUPPORTED_RELATIONSHIPS, {"ids": list(rel_ids)})
    return {int(r[0]) for r in gone.all()}


async def orphan_entities(conn: AsyncConnection, entity_ids: Sequence[int]) -> list[int]:
    """Rule 5: those of ``entity_ids`` left without mentions that no other writer holds,
    locked for deletion, in id order."""
    rows = await conn.execute(_ORPHAN_ENTITIES, {"ids": list(entity_ids)})
    return sorted(int(r[0]) for r in rows.all())
