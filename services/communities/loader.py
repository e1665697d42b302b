"""Reading the graph for a recompute: one consistent database snapshot whose watermark is
exact, and the rows packed by the server into a few bytea values of fixed-width binary
records that become numpy arrays with one ``frombuffer`` (no ORM objects, no per-row Python:
a binary COPY arrives as one message per row, and reading 1M of those through the async
driver cost ~2 s at 1M edges).

The exact snapshot and the packed reads are services/core/db/snapshots.py's (shared with the
query process's in-memory graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.communities.graph import GraphRows
from services.communities.structure import PreviousSnapshot
from services.core.db.snapshots import fetch_packed

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"

# Records as the server packs them (int8send/float8send are big-endian): one bytea value per
# group of at most 2^20 ids, so no value nears the 1 GB limit of a bytea.
_ENTITY_ROW = np.dtype([("id", ">i8"), ("digest", "V16")])
_REL_ROW = np.dtype(
    [("id", ">i8"), ("src", ">i8"), ("dst", ">i8"), ("weight", ">f8"), ("digest", "V16")]
)
_MEMBER_ROW = np.dtype([("community", ">i8"), ("entity", ">i8")])

ENTITIES_PACKED = (
    "SELECT count(*), string_agg(int8send(id)"
    " || decode(md5(name || chr(31) || type || chr(31) || description), 'hex'), ''::bytea)"
    " FROM entities GROUP BY id >> 20"
)
RELATIONSHIPS_PACKED = (
    "SELECT count(*), string_agg(int8send(id) || int8send(source_id) || int8send(target_id)"
    " || float8send(weight) || decode(md5(type || chr(31) || description), 'hex'), ''::bytea)"
    " FROM relationships GROUP BY id >> 20"
)
MEMBERS_PACKED = (
    "SELECT count(*), string_agg(int8send(community_id) || int8send(entity_id), ''::bytea)"
    " FROM community_members WHERE snapshot_id = %s GROUP BY entity_id >> 20"
)


@dataclass(frozen=True)
class PreviousReports:
    """The published snapshot: its id, its communities for the engine, and which report each
    fingerprint had (title, summary, writer) so unchanged communities reuse it."""

    snapshot_id: int
    structure: PreviousSnapshot
    by_fingerprint: dict[str, tuple[str, str, str]]


async def load_graph_rows(conn: AsyncConnection) -> GraphRows:
    """All entities and relationships, as arrays."""
    entities = await fetch_packed(conn, ENTITIES_PACKED, _ENTITY_ROW)
    rels = await fetch_packed(conn, RELATIONSHIPS_PACKED, _REL_ROW)
    return GraphRows(
        entity_ids=entities["id"].astype(np.int64),
        entity_digests=entities["digest"].copy(),
        rel_ids=rels["id"].astype(np.int64),
        rel_src=rels["src"].astype(np.int64),
        rel_dst=rels["dst"].astype(np.int64),
        rel_weight=rels["weight"].astype(np.float64),
        rel_digests=rels["digest"].copy(),
    )


async def load_previous(conn: AsyncConnection) -> PreviousReports | None:
    """The published snapshot's communities, or None before the first one."""
    snapshot_id = await conn.scalar(text("SELECT id FROM snapshots WHERE status = 'published'"))
    if snapshot_id is None:
        return None
    # One row of arrays (one sort serves every aggregate), not a Python row per community.
    packed = (
        await conn.execute(
            text(
                "SELECT array_agg(id ORDER BY id), array_agg(level ORDER BY id),"
                " array_agg(size ORDER BY id), array_agg(coalesce(parent_id, -1) ORDER BY id),"
                " array_agg(fingerprint ORDER BY id), array_agg(title ORDER BY id),"
                " array_agg(summary ORDER BY id),"
                " array_agg(coalesce(report->>'writer', '') ORDER BY id)"
                " FROM communities WHERE snapshot_id = :s"
            ),
            {"s": snapshot_id},
        )
    ).one()
    ids, levels, sizes, parents, prints, titles, summaries, writers = (
        column or [] for column in packed
    )
    members = await fetch_packed(conn, MEMBERS_PACKED, _MEMBER_ROW, (int(snapshot_id),))
    structure = PreviousSnapshot(
        member_community=members["community"].astype(np.int64),
        member_entity=members["entity"].astype(np.int64),
        community_ids=np.array(ids, dtype=np.int64),
        community_levels=np.array(levels, dtype=np.int64),
        community_sizes=np.array(sizes, dtype=np.int64),
        community_parents=np.array(parents, dtype=np.int64),
        community_fingerprints=list(prints),
    )
    reports = {
        fp: (title, summary, writer)
        for fp, title, summary, writer in zip(prints, titles, summaries, writers, strict=True)
    }
    return PreviousReports(int(snapshot_id), structure, reports)


async def next_community_id(conn: AsyncConnection) -> int:
    """Ids never used by any stored snapshot start here."""
    return int(await conn.scalar(text("SELECT coalesce(max(id), 0) + 1 FROM communities")) or 1)


def parse_binary_copy(data: bytes, row: np.dtype) -> npt.NDArray[np.void]:
    """Rows of a PostgreSQL binary COPY stream with fixed-width, non-null fields."""
    if not data.startswith(_SIGNATURE):
        raise ValueError("not a binary COPY stream")
    extension = int.from_bytes(data[15:19], "big")
    body = data[19 + extension : -2]
    if data[-2:] != b"\xff\xff" or len(body) % row.itemsize:
        raise ValueError("binary COPY stream does not have the expected row layout")
    rows = np.frombuffer(body, dtype=row)
    fields = row.fields
    if fields is None:
        raise TypeError("row must be a structured dtype")
    names = [name for name in fields if name != "n"]
    if len(rows) and np.any(rows["n"] != len(names) // 2):
        raise ValueError("binary COPY rows have an unexpected number of fields")
    for length, value in zip(names[::2], names[1::2], strict=True):
        if len(rows) and np.any(rows[length] != fields[value][0].itemsize):
            raise ValueError(f"binary COPY field {value!r} is null or not of the expected width")
    return rows
