"""What one event did to the graph: the change set the graph store collects while it writes,
appended to graph_changes (the change ratio and the communities' incremental work read it), and
to erasures for a delete's nodes (services/core/erasure.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.db.bulk import BulkInsert, bind, insert_rows

_CHANGES = BulkInsert(
    "graph_changes",
    (
        ("kind", "text"),
        ("ref_id", "bigint"),
        ("op", "text"),
        ("doc_id", "text"),
        ("event_id", "text"),
    ),
)

# A delete's node changes are also kept in erasures under their change ids, so the communities
# withheld for it are found from the deletes alone (services/core/erasure.py).
_LOG_ERASURE = text(
    f"WITH c AS ({_CHANGES.statement().text} RETURNING id, kind, ref_id)"  # noqa: S608 - constants
    " INSERT INTO erasures (change_id, entity_id) SELECT id, ref_id FROM c WHERE kind = 'node'"
)


@dataclass
class ChangeSet:
    """What one event did to the graph, for graph_changes and for the caller's report."""

    nodes_added: set[int] = field(default_factory=set)
    nodes_removed: set[int] = field(default_factory=set)
    nodes_changed: set[int] = field(default_factory=set)
    edges_added: set[int] = field(default_factory=set)
    edges_removed: set[int] = field(default_factory=set)
    edges_changed: set[int] = field(default_factory=set)
    # Wildcard entities a typed mention narrows (id -> type group), written by rebuild.
    retype: dict[int, str] = field(default_factory=dict)


async def log_changes(
    conn: AsyncConnection, changes: ChangeSet, doc_id: str, event_id: str, *, erasure: bool = False
) -> int:
    """Append every node/edge added, removed or changed to graph_changes; return the count.
    ``erasure``: the event is a delete, whose node changes also go to erasures."""
    rows = [
        (kind, ref, op, doc_id, event_id)
        for kind, op, refs in (
            ("node", "add", changes.nodes_added),
            ("node", "remove", changes.nodes_removed),
            ("node", "change", changes.nodes_changed),
            ("edge", "add", changes.edges_added),
            ("edge", "remove", changes.edges_removed),
            ("edge", "change", changes.edges_changed),
        )
        for ref in sorted(refs)
    ]
    if erasure and rows:
        await conn.execute(_LOG_ERASURE, bind(_CHANGES, rows))
    else:
        await insert_rows(conn, _CHANGES, rows)
    return len(rows)


# The chunks of a document whose tenant or ACL changed: the query processes' held graphs
# re-read their access class (services/retrieval/graph_memory.py). Not a change of the graph:
# the change ratio and the communities count nodes and edges only.
_LOG_ACCESS = text(
    "INSERT INTO graph_changes (kind, ref_id, op, doc_id, event_id)"
    " SELECT 'access', id, 'change', doc_id, :e FROM chunks WHERE doc_id = :d"
)


async def log_access(conn: AsyncConnection, doc_id: str, event_id: str) -> None:
    """Log an access change for every chunk the document has now."""
    await conn.execute(_LOG_ACCESS, {"d": doc_id, "e": event_id})
