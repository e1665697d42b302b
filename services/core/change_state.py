"""How much the graph changed since the published snapshot (docs/architecture.md, "Communities and
snapshots"): distinct (kind, ref_id) in graph_changes past the snapshot's watermark, divided by the
nodes + edges the snapshot was built from. Before the first snapshot the ratio is 1.0 when the graph
has anything in it, else 0.0."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.erasure import withheld_count

REQUEST_KEY = "recompute_requested_at"


def change_ratio(changed: int, snapshot_size: int | None, graph_empty: bool) -> float:
    """``snapshot_size`` is nodes + edges of the published snapshot, None when there is none.
    A snapshot of an empty graph has no denominator: any change then counts as all of it."""
    if snapshot_size is None:
        return 0.0 if graph_empty else 1.0
    if snapshot_size <= 0:
        return 1.0 if changed > 0 else 0.0
    return changed / snapshot_size


@dataclass(frozen=True)
class ChangeState:
    """What the scheduler decides on; ages are seconds by the database clock."""

    snapshot_id: int | None
    changed: int
    snapshot_size: int | None
    graph_empty: bool
    since_publish_s: float | None  # age of the published snapshot
    since_last_run_s: float | None  # age of the newest snapshot row, whatever its status
    requested: bool  # a `kgstream recompute` request no snapshot has answered yet
    # communities of the snapshot a delete since it touched a member of: withheld from every
    # caller until a new snapshot (services/core/erasure.py)
    withheld: int = 0

    @property
    def erased(self) -> bool:
        """Some community is withheld for a delete."""
        return self.withheld > 0

    @property
    def ratio(self) -> float:
        return change_ratio(self.changed, self.snapshot_size, self.graph_empty)


_STATE = text(
    f"""
    WITH pub AS (
        SELECT id, watermark, nodes + edges AS size, published_at
        FROM snapshots WHERE status = 'published'
    ), last_run AS (
        SELECT max(created_at) AS at FROM snapshots
    ), req AS (
        SELECT value::timestamptz AS at FROM kg_meta WHERE key = :request_key
    )
    SELECT
        (SELECT id FROM pub) AS snapshot_id,
        (SELECT size FROM pub) AS size,
        (SELECT count(*) FROM (
            SELECT DISTINCT kind, ref_id FROM graph_changes
            WHERE id > coalesce((SELECT watermark FROM pub), 0) AND kind IN ('node', 'edge')
        ) AS c) AS changed,
        NOT EXISTS (SELECT 1 FROM entities) AS graph_empty,
        extract(epoch FROM now() - (SELECT published_at FROM pub)) AS since_publish,
        extract(epoch FROM now() - (SELECT at FROM last_run)) AS since_last_run,
        EXISTS (
            SELECT 1 FROM req WHERE NOT EXISTS (
                SELECT 1 FROM snapshots s
                WHERE s.created_at >= req.at AND s.status IN ('published', 'retired')
            )
        ) AS requested,
        coalesce((SELECT {withheld_count("pub.id")} FROM pub), 0) AS withheld
    """  # noqa: S608 - withheld_count is built from constants
)


async def read_change_state(conn: AsyncConnection) -> ChangeState:
    """One statement, so every field comes from the same database snapshot."""
    row = (await conn.execute(_STATE, {"request_key": REQUEST_KEY})).one()
    return ChangeState(
        snapshot_id=row.snapshot_id,
        changed=int(row.changed),
        snapshot_size=None if row.size is None else int(row.size),
        graph_empty=bool(row.graph_empty),
        since_publish_s=None if row.since_publish is None else float(row.since_publish),
        since_last_run_s=None if row.since_last_run is None else float(row.since_last_run),
        requested=bool(row.requested),
        withheld=int(row.withheld),
    )
