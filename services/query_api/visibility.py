"""Document visibility in SQL: ``Caller.can_see`` (services/core/access.py) as one predicate
over ``documents d``, and what follows from it. A chunk is visible when its document is; an
entity when some mention of it is in a visible document; a relationship when some evidence of
it is in a visible document and both ends are visible entities; a community when every document
that contributed to it is visible. Values are always bound (``:v_tenant``, ``:v_groups``); the
fragments are constants. Admin callers run the unfiltered statements, so the operator path
keeps its plans."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller

# The rule: same tenant (both NULL counts as the same), and no ACL or a shared group; an empty
# ACL array shares no group, so only admins (who skip this predicate) see it. Never NULL.
DOC_VISIBLE = (
    "(d.tenant IS NOT DISTINCT FROM CAST(:v_tenant AS text)"
    " AND (d.acl IS NULL OR d.acl && CAST(:v_groups AS text[])))"
)
VISIBLE_DOC_IDS = "SELECT d.doc_id FROM documents d WHERE " + DOC_VISIBLE  # noqa: S608 - DOC_VISIBLE is a constant


def entity_visible(entity: str) -> str:
    """SQL: the entity (a column expression) has a mention in a visible document."""
    return (
        "EXISTS (SELECT 1 FROM mentions vm JOIN documents d ON d.doc_id = vm.doc_id"  # noqa: S608 - column names from constants; values bound
        f" WHERE vm.entity_id = {entity} AND {DOC_VISIBLE})"
    )


def alias_visible(alias: str) -> str:
    """SQL: the alias row (table alias given) is the surface of a mention in a visible document,
    so a restricted caller finds an entity only by the names its visible documents use."""
    return (
        "EXISTS (SELECT 1 FROM mentions vm JOIN documents d ON d.doc_id = vm.doc_id"  # noqa: S608 - column names from constants; values bound
        f" WHERE vm.entity_id = {alias}.entity_id AND vm.surface = {alias}.alias"
        f" AND {DOC_VISIBLE})"
    )


def relationship_visible(rel: str, source: str, target: str) -> str:
    """SQL: the relationship has evidence in a visible document and both ends are visible."""
    return (
        "EXISTS (SELECT 1 FROM relationship_evidence vev JOIN documents d"  # noqa: S608 - column names from constants; values bound
        f" ON d.doc_id = vev.doc_id WHERE vev.relationship_id = {rel} AND {DOC_VISIBLE})"
        f" AND {ends_visible(source, target)}"
    )


def ends_visible(source: str, target: str) -> str:
    """SQL: both ends of a relationship are visible entities."""
    return f"{entity_visible(source)} AND {entity_visible(target)}"


def visible_evidence(rel: str) -> str:
    """SQL (a LATERAL subquery): weight ``w``, count ``n`` and description ``x`` of the
    relationship rebuilt from its evidence in visible documents (the indexer's rule)."""
    return (
        "(SELECT sum(vev.strength) AS w, count(*) AS n,"  # noqa: S608 - column names from constants; values bound
        " coalesce(left(string_agg(vev.sentence, ' ' ORDER BY vev.doc_id, vev.sentence), 2000),"
        " '') AS x FROM relationship_evidence vev JOIN documents d ON d.doc_id = vev.doc_id"
        f" WHERE vev.relationship_id = {rel} AND {DOC_VISIBLE})"
    )


def community_visible(community: str) -> str:
    """SQL: every document behind the community (mentions of its members, evidence of its
    internal edges) is visible, and there is at least one; and no member has changed since the
    snapshot (``:s``) through a document the caller cannot see now (a deleted or rewritten
    document may have written the summary). Statements using it bind ``:s``.

    Each check ends in ``OFFSET 0``, which keeps PostgreSQL from turning it into a join: it
    runs per community, from the (snapshot_id, community_id) key, so its cost is the
    community's size whatever the statistics say. As joins, a snapshot the statistics had not
    seen yet (estimated at one row) was planned as the whole snapshot's check re-run for every
    community: minutes at 300 documents (issue 18, finding 0)."""
    member = f"cm.snapshot_id = {community}.snapshot_id AND cm.community_id = {community}.id"
    hidden = "NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = {doc} AND " + DOC_VISIBLE + ")"  # noqa: S608 - DOC_VISIBLE is a constant
    return (
        "EXISTS (SELECT 1 FROM community_members cm JOIN mentions m ON m.entity_id = cm.entity_id"  # noqa: S608 - column names from constants; values bound
        f" WHERE {member} OFFSET 0)"
        " AND NOT EXISTS (SELECT 1 FROM community_members cm JOIN mentions m"
        f" ON m.entity_id = cm.entity_id WHERE {member} AND {hidden.format(doc='m.doc_id')}"
        " OFFSET 0)"
        " AND NOT EXISTS (SELECT 1 FROM community_members cm"
        " JOIN relationships r ON r.source_id = cm.entity_id"
        " JOIN community_members ct ON ct.snapshot_id = cm.snapshot_id"
        "  AND ct.community_id = cm.community_id AND ct.entity_id = r.target_id"
        " JOIN relationship_evidence ev ON ev.relationship_id = r.id"
        f" WHERE {member} AND {hidden.format(doc='ev.doc_id')} OFFSET 0)"
        f" AND NOT EXISTS (SELECT 1 FROM community_members cm WHERE {member}"
        "  AND cm.entity_id IN (SELECT g.ref_id FROM graph_changes g WHERE g.kind = 'node'"
        "  AND g.id > (SELECT sn.watermark FROM snapshots sn WHERE sn.id = :s)"
        "  AND NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = g.doc_id"
        "   AND NOT d.deleted AND " + DOC_VISIBLE + ")) OFFSET 0)"
    )


def params(caller: Caller) -> dict[str, object]:
    """The bound values of the predicate."""
    return {"v_tenant": caller.tenant, "v_groups": sorted(caller.groups)}


@dataclass(frozen=True)
class Filtered:
    """One read in two forms: as the operator runs it, and filtered for a restricted caller."""

    admin: TextClause
    restricted: TextClause

    @classmethod
    def of(cls, admin: str, restricted: str) -> Filtered:
        """Both forms from SQL text."""
        return cls(text(admin), text(restricted))

    def bind(
        self, caller: Caller, values: Mapping[str, object]
    ) -> tuple[TextClause, dict[str, object]]:
        """(statement, parameters) for the caller: ``conn.execute(*stmt.bind(caller, {...}))``."""
        if caller.admin:
            return self.admin, dict(values)
        return self.restricted, {**values, **params(caller)}


@dataclass(frozen=True)
class EntityFacts:
    """What a caller may read of an entity: for a restricted caller, rebuilt from the mentions
    in visible documents (name, type, count, description and aliases as the indexer builds
    them from all mentions)."""

    name: str
    type: str
    mentions: int
    description: str
    aliases: list[str]


_FACTS = Filtered.of(
    "SELECT e.id, e.name, e.type, e.mention_count, e.description,"
    " coalesce((SELECT array_agg(a.alias ORDER BY a.alias) FROM aliases a"
    "  WHERE a.entity_id = e.id), '{}') FROM entities e WHERE e.id = ANY(:e)",
    "WITH vm AS (SELECT m.entity_id, m.surface, m.type, m.doc_id, m.sentence FROM mentions m"  # noqa: S608 - DOC_VISIBLE is a constant
    "  JOIN documents d ON d.doc_id = m.doc_id WHERE m.entity_id = ANY(:e) AND "
    + DOC_VISIBLE
    + "),"
    " s AS (SELECT entity_id, surface, count(*) AS n FROM vm GROUP BY entity_id, surface),"
    " t AS (SELECT entity_id, mode() WITHIN GROUP (ORDER BY type) AS t FROM vm"
    "  GROUP BY entity_id),"
    " x AS (SELECT q.entity_id, left(string_agg(q.sentence, ' ' ORDER BY q.doc_id, q.sentence),"
    "  1500) AS x FROM (SELECT entity_id, doc_id, sentence, row_number() OVER (PARTITION BY"
    "  entity_id ORDER BY doc_id, sentence) AS i FROM (SELECT DISTINCT entity_id, doc_id,"
    "  sentence FROM vm) u) q WHERE q.i <= 5 GROUP BY q.entity_id)"
    " SELECT s.entity_id,"
    "  (array_agg(s.surface ORDER BY (s.surface LIKE '% %') DESC, s.n DESC, s.surface))[1],"
    "  t.t, sum(s.n), coalesce(x.x, ''), array_agg(s.surface ORDER BY s.surface)"
    " FROM s JOIN t USING (entity_id) LEFT JOIN x USING (entity_id)"
    " GROUP BY s.entity_id, t.t, x.x",
)


async def entity_facts(
    conn: AsyncConnection, caller: Caller, entity_ids: Sequence[int]
) -> dict[int, EntityFacts]:
    """Facts of the entities the caller can see (the others are absent)."""
    if not entity_ids:
        return {}
    rows = await conn.execute(*_FACTS.bind(caller, {"e": sorted(set(entity_ids))}))
    return {
        int(r[0]): EntityFacts(str(r[1]), str(r[2]), int(r[3]), str(r[4]), list(r[5]))
        for r in rows.all()
    }
