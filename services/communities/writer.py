"""Writing a snapshot's rows to the side (the snapshot is still 'building', no reader looks at
it): communities with their reports, memberships and per-entity PageRank and community ids,
all with COPY; memberships and entities as binary COPY built with numpy, not per-row Python;
then their statistics, so the first reader of the snapshot is planned for its real size.

These tables have no foreign keys (migration 0009: checking ~840k memberships one by one was
most of the write at 1M edges). Instead the structure is checked as a whole before writing
(services/communities/integrity.py), all rows go in one transaction (a crash leaves none),
and that transaction holds the snapshot row locked while it is still 'building': a takeover
cannot mark it failed and pruning cannot delete it under the writer, so no row is orphaned."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
from psycopg.types.json import Jsonb
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.communities.integrity import check_structure
from services.communities.structure import Structure
from services.communities.summaries import Written
from services.core.db.engine import vector_literal
from services.core.db.snapshots import psycopg_connection

_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
_TRAILER = b"\xff\xff"
_INT8_OID = 20
# Statistics that know the new snapshot, committed with its rows. Until then the planner has
# never seen this snapshot_id, estimates one row per community, and plans the readers' per
# community checks (visibility in global mode) as joins over the whole snapshot re-run for
# every community: minutes on a few thousand memberships (issue 18, finding 0). ANALYZE in
# the writing transaction samples its own uncommitted rows.
_ANALYZE = text("ANALYZE communities, community_members, snapshot_entities")


async def write_rows(
    engine: AsyncEngine,
    snapshot_id: int,
    structure: Structure,
    written: Mapping[tuple[int, int], Written],
    reuse_from: tuple[int, str] | None,
) -> None:
    """All rows of the snapshot in one transaction. ``reuse_from`` = (published snapshot id,
    writer name): communities without a new report copy the report, rating and embedding of
    the published community with the same fingerprint and writer."""
    check_structure(structure)
    async with engine.begin() as conn:
        await lock_building(conn, snapshot_id)
        driver = await psycopg_connection(conn)
        async with driver.cursor() as cur:
            async with cur.copy(
                "COPY communities (snapshot_id, id, level, parent_id, size, fingerprint, title,"
                " summary, report, rating, embedding) FROM STDIN"
            ) as copy:
                for number, level in enumerate(structure.levels):
                    for label in range(len(level.ids)):
                        new = written.get((number, label))
                        parent = int(level.parent_ids[label])
                        await copy.write_row(
                            (
                                snapshot_id,
                                int(level.ids[label]),
                                number,
                                None if parent < 0 else parent,
                                int(level.sizes[label]),
                                level.fingerprints[label],
                                new.report.title if new else "",
                                new.report.summary if new else "",
                                Jsonb(new.report.as_json() if new else {}),
                                new.report.rating if new else None,
                                vector_literal(new.embedding) if new and new.embedding else None,
                            )
                        )
            async with cur.copy(
                "COPY community_members (snapshot_id, community_id, entity_id)"
                " FROM STDIN (FORMAT BINARY)"
            ) as copy:
                await copy.write(members_copy(snapshot_id, structure))
            async with cur.copy(
                "COPY snapshot_entities (snapshot_id, entity_id, pagerank, community_ids)"
                " FROM STDIN (FORMAT BINARY)"
            ) as copy:
                await copy.write(entities_copy(snapshot_id, structure))
        if reuse_from is not None:
            await conn.execute(
                text(
                    "UPDATE communities n SET title = o.title, summary = o.summary,"
                    " report = o.report, rating = o.rating, embedding = o.embedding"
                    " FROM (SELECT DISTINCT ON (fingerprint) fingerprint, title, summary, report,"
                    "   rating, embedding FROM communities"
                    "   WHERE snapshot_id = :old AND report->>'writer' = :writer"
                    "   ORDER BY fingerprint, id) o"
                    " WHERE n.snapshot_id = :new AND n.fingerprint = o.fingerprint"
                    " AND n.report = '{}'::jsonb"
                ),
                {"old": reuse_from[0], "writer": reuse_from[1], "new": snapshot_id},
            )
        await conn.execute(_ANALYZE)


async def lock_building(conn: AsyncConnection, snapshot_id: int) -> None:
    """Hold the snapshot row until the transaction ends; raise if it is no longer 'building'
    (another worker took over and marked it failed, or it is gone)."""
    found = await conn.scalar(
        text("SELECT id FROM snapshots WHERE id = :id AND status = 'building' FOR SHARE"),
        {"id": snapshot_id},
    )
    if found is None:
        raise RuntimeError(f"snapshot {snapshot_id} is no longer 'building'; rows not written")


def members_copy(snapshot_id: int, structure: Structure) -> bytes:
    """community_members rows of every level as one binary COPY stream."""
    parts = []
    for level in structure.levels:
        nodes = np.flatnonzero(level.labels >= 0)
        rows = _rows(3, len(nodes))
        rows["f0"] = snapshot_id
        rows["f1"] = level.ids[level.labels[nodes]]
        rows["f2"] = structure.graph.node_ids[nodes]
        parts.append(rows.tobytes())
    return _HEADER + b"".join(parts) + _TRAILER


def entities_copy(snapshot_id: int, structure: Structure) -> bytes:
    """snapshot_entities rows: PageRank and the community id at each level, top first. A
    node's communities form a prefix of the levels (children nest in parents), so nodes are
    grouped by depth and each group is one fixed-width numpy record array."""
    n = structure.graph.n
    ids = np.full((n, len(structure.levels)), -1, dtype=np.int64)
    for number, level in enumerate(structure.levels):
        member = level.labels >= 0
        ids[member, number] = level.ids[level.labels[member]]
    depth = (ids >= 0).sum(axis=1)
    parts = []
    for d in np.unique(depth).tolist():
        nodes = np.flatnonzero(depth == d)
        rows = np.zeros(len(nodes), dtype=_entity_dtype(d))
        rows["n"], rows["l0"], rows["l1"], rows["l2"] = 4, 8, 8, 8
        rows["snapshot"], rows["entity"] = snapshot_id, structure.graph.node_ids[nodes]
        rows["pagerank"] = structure.pagerank[nodes]
        rows["l3"] = 12 + (8 if d else 0) + 12 * d
        rows["ndim"], rows["elem"] = (1 if d else 0), _INT8_OID
        if d:
            rows["dim"], rows["lbound"] = d, 1
            for j in range(d):
                rows[f"len{j}"], rows[f"v{j}"] = 8, ids[nodes, j]
        parts.append(rows.tobytes())
    return _HEADER + b"".join(parts) + _TRAILER


def _rows(fields: int, count: int) -> npt.NDArray[np.void]:
    """Records of ``fields`` non-null bigint fields, lengths and field count filled in."""
    layout: list[tuple[str, str]] = [("n", ">i2")]
    for i in range(fields):
        layout += [(f"len{i}", ">i4"), (f"f{i}", ">i8")]
    rows = np.zeros(count, dtype=np.dtype(layout))
    rows["n"] = fields
    for i in range(fields):
        rows[f"len{i}"] = 8
    return rows


def _entity_dtype(depth: int) -> np.dtype:
    layout: list[tuple[str, str]] = [
        ("n", ">i2"),
        ("l0", ">i4"),
        ("snapshot", ">i8"),
        ("l1", ">i4"),
        ("entity", ">i8"),
        ("l2", ">i4"),
        ("pagerank", ">f8"),
        ("l3", ">i4"),
        ("ndim", ">i4"),
        ("hasnull", ">i4"),
        ("elem", ">i4"),
    ]
    if depth:
        layout += [("dim", ">i4"), ("lbound", ">i4")]
    for j in range(depth):
        layout += [(f"len{j}", ">i4"), (f"v{j}", ">i8")]
    return np.dtype(layout)
