"""Erasure of deleted documents from community summaries (docs/security.md, "Erasure").

A published snapshot's summaries were written from its members' descriptions, which quote the
documents that mentioned them. A delete rebuilds those descriptions at once (the indexer's
rebuild), but the snapshot's summaries stay as written. So a community is withheld from every
caller, admins included, from the commit of a delete that changed or removed one of its
members after the snapshot was read, until a snapshot built after the delete is published (the
communities worker recomputes for that reason on its next tick: services/communities/policy.py).

A delete's graph changes and its ``deleted`` outcome commit in one transaction, so the rule
holds from the moment the delete is applied. Membership comes from ``snapshot_entities``
(each entity's community at every level, written with ``community_members``)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


def erased_entities(snapshot: str) -> str:
    """SQL: ids of the entities that a delete applied after the snapshot (an SQL expression
    giving its id) was read changed or removed."""
    return (
        "SELECT g.ref_id FROM graph_changes g WHERE g.kind = 'node'"  # noqa: S608 - the snapshot expression is a constant
        f" AND g.id > (SELECT sn.watermark FROM snapshots sn WHERE sn.id = {snapshot})"
        " AND EXISTS (SELECT 1 FROM processed_events p WHERE p.event_id = g.event_id"
        "  AND p.outcome = 'deleted')"
    )


def erasure_pending(snapshot: str) -> str:
    """SQL (boolean): some community of the snapshot is withheld for a delete."""
    return (
        "EXISTS (SELECT 1 FROM snapshot_entities se WHERE se.snapshot_id = "  # noqa: S608 - constants
        f"{snapshot} AND cardinality(se.community_ids) > 0"
        f" AND se.entity_id IN ({erased_entities(snapshot)}))"
    )


_WITHHELD = text(
    "SELECT DISTINCT unnest(se.community_ids) FROM snapshot_entities se"  # noqa: S608 - constants
    f" WHERE se.snapshot_id = :s AND se.entity_id IN ({erased_entities(':s')})"
)


async def withheld_communities(conn: AsyncConnection, snapshot_id: int) -> list[int]:
    """Ids of the snapshot's communities no caller may read: a member was changed or removed
    by a delete applied after the snapshot was read (their summaries may quote it)."""
    rows = await conn.scalars(_WITHHELD, {"s": snapshot_id})
    return sorted(int(r) for r in rows)
