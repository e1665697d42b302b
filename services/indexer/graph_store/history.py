"""What a new version, a change of access or metadata, or a delete replaces, kept for
``as_of`` reads (alembic 0025; services/retrieval/as_of.py): the documents row and the removed
chunks, each with the span ``[valid_from, valid_to)`` of the documents' own clock in which it
held. Written in the event's transaction, before the replacement, so a version is either
current or in history, never neither; pruned once it was replaced more than
KGSTREAM_HISTORY_DAYS ago, which moves ``history_horizon`` (the earliest ``as_of`` answered).

A span ends at the replacing event's ``occurred_at``, or where it began if that is earlier (a
delete without a version applies whatever its time: ordering rule 3, docs/ingest.md), so a
span is never negative: such a version held for no time at all."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.indexer.documents import ATTRIBUTES_CHANGE

_KEEP_DOCUMENT = (
    "INSERT INTO document_versions (doc_id, tenant, title, version, metadata, acl, valid_from,"
    " valid_to) SELECT d.doc_id, d.tenant, d.title, d.version, d.metadata, d.acl,"
    " d.occurred_at, GREATEST(d.occurred_at, :until) FROM documents d WHERE "
)
_KEEP_REPLACED = text(_KEEP_DOCUMENT + "d.doc_id = :d AND NOT d.deleted")
# update_attributes' own condition: only a row it is about to change.
_KEEP_CHANGED = text(_KEEP_DOCUMENT + ATTRIBUTES_CHANGE)
_KEEP_CHUNKS = text(
    "INSERT INTO chunk_history (id, doc_id, ord, text, embedding, valid_from, valid_to)"
    " SELECT id, doc_id, ord, text, embedding, born_at, GREATEST(born_at, :until)"
    " FROM chunks WHERE id = ANY(:ids) ON CONFLICT (id) DO NOTHING"
)
_PRUNE = tuple(
    text(f"DELETE FROM {table} WHERE valid_to < now() - make_interval(secs => :s)")  # noqa: S608 - constant names
    for table in ("chunk_history", "document_versions")
)
_FORGET = tuple(text(f"DELETE FROM {table}") for table in ("chunk_history", "document_versions"))  # noqa: S608 - constant names
# Complete from the later of when it began being kept and the pruning cut; NULL: none kept.
_HORIZON = text(
    "UPDATE history_horizon SET kept_since = CASE WHEN :s > 0 THEN"
    " GREATEST(coalesce(kept_since, now()), now() - make_interval(secs => :s)) END"
)
SWEEP_INTERVAL_S = 600.0  # pruning is bookkeeping: a day's retention is not minute-exact


async def keep_replaced(
    conn: AsyncConnection,
    doc_id: str,
    chunk_ids: Sequence[int],
    until: datetime,
    *,
    days: float,
) -> None:
    """Keep the live documents row and the chunks a new version or a delete at ``until``
    replaces."""
    if days > 0:
        await conn.execute(_KEEP_REPLACED, {"d": doc_id, "until": until})
        if chunk_ids:
            await conn.execute(_KEEP_CHUNKS, {"ids": list(chunk_ids), "until": until})


async def keep_changed_document(
    conn: AsyncConnection,
    doc_id: str,
    until: datetime,
    attributes: dict[str, object],
    *,
    days: float,
) -> None:
    """Keep the live documents row when ``attributes`` (``tn``, ``acl``, ``m``: tenant, ACL,
    metadata JSON) change it."""
    if days > 0:
        await conn.execute(_KEEP_CHANGED, {"d": doc_id, "until": until, **attributes})


async def prune(conn: AsyncConnection, days: float) -> None:
    """Forget what was replaced more than ``days`` ago (everything at 0) and move the horizon."""
    seconds = days * 86400.0
    for statement in _PRUNE if days > 0 else _FORGET:
        await conn.execute(statement, {"s": seconds})
    await conn.execute(_HORIZON, {"s": seconds})
