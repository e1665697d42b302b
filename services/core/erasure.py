"""Erasure of deleted documents from community summaries (docs/security.md, "Erasure").

A published snapshot's summaries were written from its members' descriptions, which quote the
documents that mentioned them. A delete rebuilds those descriptions at once (the indexer's
rebuild), but the snapshot's summaries stay as written. So a community is withheld from every
caller, admins included, from the commit of a delete that changed or removed one of its
members after the snapshot was read, until a snapshot built after the delete is published (the
communities worker recomputes for that reason on its next tick: services/communities/policy.py).

A delete writes its node changes to ``erasures`` under their graph_changes ids, in the
transaction that applies it, so the rule holds from the moment the delete is applied; and the
withheld set is read from the deletes since the snapshot alone (a primary-key range), however
many other changes there were. Membership comes from ``snapshot_entities`` (each entity's
community at every level, written with ``community_members``), read by primary key."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


def _erased_entities(snapshot: str) -> str:
    # An array, so snapshot_entities is read by its key for each of them, never scanned.
    return (
        "ARRAY(SELECT e.entity_id FROM erasures e"  # noqa: S608 - the snapshot expression is a constant
        f" WHERE e.change_id > (SELECT sn.watermark FROM snapshots sn WHERE sn.id = {snapshot}))"
    )


def _withheld(snapshot: str) -> str:
    return (
        "SELECT DISTINCT c.id FROM snapshot_entities se,"  # noqa: S608 - constants
        " unnest(se.community_ids) AS c(id)"
        f" WHERE se.snapshot_id = {snapshot} AND se.entity_id = ANY({_erased_entities(snapshot)})"
    )


def withheld_count(snapshot: str) -> str:
    """SQL (integer): how many of the snapshot's (an SQL expression giving its id) communities
    are withheld for a delete."""
    return f"(SELECT count(*) FROM ({_withheld(snapshot)}) AS w)"  # noqa: S608 - constants


_WITHHELD = text(_withheld(":s"))
# Erasure rows are never updated or removed, and a later read sees every row an earlier one
# saw: the count and the newest id past the watermark change whenever a delete commits, even
# one whose ids are below a row already seen (ids are drawn before commit, in any order).
_KEY = text(
    "SELECT count(*), coalesce(max(e.change_id), 0) FROM erasures e"
    " WHERE e.change_id > (SELECT sn.watermark FROM snapshots sn WHERE sn.id = :s)"
)


async def withheld_communities(conn: AsyncConnection, snapshot_id: int) -> list[int]:
    """Ids of the snapshot's communities no caller may read: a member was changed or removed
    by a delete applied after the snapshot was read (their summaries may quote it)."""
    rows = await conn.scalars(_WITHHELD, {"s": snapshot_id})
    return sorted(int(r) for r in rows)


@dataclass
class WithheldCache:
    """The withheld set of the newest (snapshot, deletes since it) asked about, so a request
    that finds neither changed pays for one index-only count of the deletes since the
    snapshot."""

    _key: tuple[int, int, int] | None = None
    _ids: tuple[int, ...] = field(default=())

    async def get(self, conn: AsyncConnection, snapshot_id: int) -> list[int]:
        """``withheld_communities`` as ``conn``'s transaction sees them."""
        count, newest = (await conn.execute(_KEY, {"s": snapshot_id})).one()
        key = (snapshot_id, int(count), int(newest))
        if key == self._key:
            return list(self._ids)
        ids = await withheld_communities(conn, snapshot_id)
        self._key, self._ids = key, tuple(ids)
        return ids
