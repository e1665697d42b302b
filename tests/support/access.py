"""Drawn document access for the visibility properties: tenants and ACLs for documents, and
callers to hold them against; ``assign`` writes them, logging the change as the indexer does
so that a held graph follows it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.indexer.graph_store.changes import log_access

Access = tuple[str | None, list[str] | None]
GROUPS = ("g1", "g2")
TENANTS = (None, "t1")


def accesses(
    tenants: Sequence[str | None], groups: Sequence[str]
) -> st.SearchStrategy[tuple[str | None, list[str] | None]]:
    """A document's (tenant, ACL): no ACL, an empty one (admins only), or one or two groups."""
    return st.tuples(
        st.sampled_from(tenants),
        st.one_of(
            st.none(),
            st.just([]),
            st.lists(st.sampled_from(groups), min_size=1, max_size=2, unique=True),
        ),
    )


ACCESS = accesses(TENANTS, GROUPS)
CALLERS = st.builds(
    Caller, tenant=st.sampled_from(TENANTS), groups=st.frozensets(st.sampled_from(GROUPS))
)


async def assign(
    conn: AsyncConnection, access: Mapping[str, Access], *, logged: bool = False
) -> None:
    """Set these documents' tenants and ACLs; ``logged``: with their chunks' access changes in
    graph_changes (graph_store/changes.py ``log_access``), for a held graph to refresh from."""
    await conn.execute(
        text("UPDATE documents SET tenant = :t, acl = :a WHERE doc_id = :d"),
        [{"d": d, "t": t, "a": a} for d, (t, a) in access.items()],
    )
    if logged:
        for doc_id in sorted(access):
            await log_access(conn, doc_id, "test:access")
