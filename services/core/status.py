"""What is in the database, for `kgstream status` and the API's /v1/status."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.activity import activity
from services.core.change_state import read_change_state
from services.core.indexer_health import end_offsets, health, read_progress
from services.core.processes import live_processes

_COUNTS = {
    "documents": "SELECT count(*) FROM documents WHERE NOT deleted",
    "deleted_documents": "SELECT count(*) FROM documents WHERE deleted",
    "chunks": "SELECT count(*) FROM chunks",
    "entities": "SELECT count(*) FROM entities",
    "relationships": "SELECT count(*) FROM relationships",
    "mentions": "SELECT count(*) FROM mentions",
    "evidence": "SELECT count(*) FROM relationship_evidence",
    "processed_events": "SELECT count(*) FROM processed_events",
    "dead_letters": "SELECT count(*) FROM dead_letters WHERE replayed_at IS NULL",
    "graph_changes": "SELECT count(*) FROM graph_changes",
}


_CURATIONS = text(
    "SELECT count(*) FILTER (WHERE undone_at IS NULL) AS in_force,"
    " count(*) FILTER (WHERE applied_at IS NULL OR (undone_at IS NOT NULL"
    "  AND undo_applied_at IS NULL)) AS pending,"
    " extract(epoch FROM now() - min(CASE WHEN applied_at IS NULL THEN created_at"
    "  ELSE undone_at END) FILTER (WHERE"
    "  applied_at IS NULL OR (undone_at IS NOT NULL AND undo_applied_at IS NULL)))"
    "  AS oldest_pending_s FROM curations"
)


async def curation_counts(conn: AsyncConnection) -> dict[str, Any]:
    """Curations in force, rule changes the indexer has not applied to the stored documents
    yet, and how long the oldest of those has waited (seconds; None when none waits)."""
    row = (await conn.execute(_CURATIONS)).one()
    oldest = None if row.oldest_pending_s is None else round(float(row.oldest_pending_s), 1)
    return {"in_force": int(row.in_force), "pending": int(row.pending), "oldest_pending_s": oldest}


async def database_status(
    engine: AsyncEngine,
    *,
    bootstrap: str | None = None,
    stall_after_s: float = 120.0,
    recompute_threshold: float = 0.10,
    freshness_window_s: float = 600.0,
) -> dict[str, Any]:
    """Row counts (integers) read in one snapshot, the published community snapshot, the
    indexer's progress per partition (with lag when the broker at ``bootstrap`` answers), and
    recent activity (services/core/activity.py: throughput, freshness, dead letters by reason,
    change ratio against ``recompute_threshold``, snapshot history, token use), and the
    running processes with their metrics addresses."""
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            out: dict[str, Any] = {
                name: int(await conn.scalar(text(sql)) or 0) for name, sql in _COUNTS.items()
            }
            state = await read_change_state(conn)
            out["change_ratio"] = state.ratio
            # published communities no caller may read until the next snapshot (a delete)
            out["withheld_communities"] = state.withheld
            out.update(
                await activity(
                    conn,
                    change_ratio=out["change_ratio"],
                    threshold=recompute_threshold,
                    freshness_window_s=freshness_window_s,
                )
            )
            out["curations"] = await curation_counts(conn)
            progress = await read_progress(conn)
            processes = await live_processes(conn)
            snap = (
                await conn.execute(
                    text(
                        "SELECT id, published_at, communities, levels, reports_reused,"
                        " reports_generated FROM snapshots WHERE status = 'published'"
                    )
                )
            ).first()
    out["snapshot"] = (
        None
        if snap is None
        else {
            "id": snap.id,
            "published_at": snap.published_at.isoformat(),
            "communities": snap.communities,
            "levels": snap.levels,
            "reports_reused": snap.reports_reused,
            "reports_generated": snap.reports_generated,
        }
    )
    ends = {}
    if bootstrap and progress:
        ends = await asyncio.to_thread(
            end_offsets, bootstrap, [(p.topic, p.partition) for p in progress]
        )
    out["indexer"] = health(progress, ends, stall_after_s)
    out["processes"] = processes  # running kgstream processes and their metrics addresses
    return out
