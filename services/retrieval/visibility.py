"""Document visibility in SQL: ``Caller.can_see`` (services/core/access.py) as one predicate
over ``documents d``, and what follows from it. A chunk is visible when its document is; an
entity when some mention of it is in a visible document; a relationship when some evidence of
it is in a visible document and both ends are visible entities; a community when every document
that contributed to it is visible. Values are always bound (``:v_tenant``, ``:v_groups``); the
fragments are constants. Admin callers run the unfiltered statements, so the operator path
keeps its plans.

A query's document scope (its ``filters``: services/core/doc_scope.py) is stated in the same
place: each read written with ``DOC_VISIBLE`` has scoped forms in which the predicate becomes
"visible and in scope" (``DOC_MATCHES``; for an admin or whole-corpus caller, "in scope"), so
an entity is reached through a mention in a matching document, a relationship through evidence
in one, a passage when its document matches. Reads of communities (``scoped=False``) keep their
own visibility (every contributing document visible): their passages are scoped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller

# The rule: same tenant (both NULL counts as the same), and no ACL or a shared group; an empty
# ACL array shares no group, so only admins (who skip this predicate) see it. Never NULL.
_SAME_TENANT = "d.tenant IS NOT DISTINCT FROM CAST(:v_tenant AS text)"
DOC_VISIBLE = f"({_SAME_TENANT} AND (d.acl IS NULL OR d.acl && CAST(:v_groups AS text[])))"
# The statements run with the tenant test in the form the planner can estimate from the
# column's statistics (its share of NULLs, its common values): IS NOT DISTINCT FROM with a
# parameter is estimated at 0.5% of the rows whatever the data, so a caller who sees most
# documents was planned as one who sees a handful (nested loops from `documents`, no HNSW).
_TENANT_FORMS = {True: "d.tenant IS NULL", False: "d.tenant = CAST(:v_tenant AS text)"}
VISIBLE_DOC_IDS = "SELECT d.doc_id FROM documents d WHERE " + DOC_VISIBLE  # noqa: S608 - DOC_VISIBLE is a constant
# The document scope (services/core/doc_scope.py; kgstream_doc_matches: alembic 0022; fact
# times: 0023). Bound NULLs fold away in the plans of an unbounded side.
DOC_MATCHES = (
    "(d.occurred_at >= coalesce(CAST(:f_from AS timestamptz), '-infinity'::timestamptz)"
    " AND d.occurred_at < coalesce(CAST(:f_until AS timestamptz), 'infinity'::timestamptz)"
    # The indexable pre-filter first (documents_metadata_path, alembic 0024), then the rule.
    " AND (CAST(:f_path AS jsonpath) IS NULL OR d.metadata @? CAST(:f_path AS jsonpath))"
    " AND (CAST(:f_meta AS jsonb) IS NULL"
    " OR kgstream_doc_matches(d.metadata, CAST(:f_meta AS jsonb)))"
    # A fact-time window: the document states a fact that held in it (alembic 0023). An empty
    # window (its end before its start) admits nothing, as an empty occurred_at window.
    " AND (NOT CAST(:f_held AS boolean) OR (coalesce(CAST(:f_held_from AS date)"
    "  < CAST(:f_held_until AS date), true) AND EXISTS (SELECT 1 FROM fact_times ft"
    "  WHERE ft.doc_id = d.doc_id AND ft.holds && daterange(CAST(:f_held_from AS date),"
    "  CAST(:f_held_until AS date), '[)')))))"
)


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


def _changed_through_unseen(member: str, doc_live: str) -> str:
    """SQL: a member changed since the snapshot (``:s``) through a document that is not live
    and visible now (``doc_live``: a predicate over ``documents d``).

    The changes since the snapshot are read once per statement, each change's document probed
    by its key (the inner ``OFFSET 0``): the planner cannot know the watermark when it plans,
    estimated a third of all changes, and hashed every live document to anti-join them (a
    scan of 370,000 documents, 255 ms a global query at 1M entities, for no change at all;
    issue 20). Probing costs one key lookup per change since the snapshot, which the change
    ratio bounds (communities are recomputed past 10%)."""
    return (
        f"NOT EXISTS (SELECT 1 FROM community_members cm WHERE {member}"  # noqa: S608 - constants
        "  AND cm.entity_id IN (SELECT g.ref_id FROM graph_changes g WHERE g.kind = 'node'"
        "  AND g.id > (SELECT sn.watermark FROM snapshots sn WHERE sn.id = :s)"
        "  AND NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = g.doc_id"
        f" AND {doc_live} OFFSET 0))"
        " OFFSET 0)"
    )


def _members(community: str) -> str:
    return f"cm.snapshot_id = {community}.snapshot_id AND cm.community_id = {community}.id"


def _has_mentions(member: str) -> str:
    return (
        "EXISTS (SELECT 1 FROM community_members cm JOIN mentions m ON m.entity_id = cm.entity_id"  # noqa: S608 - constants
        f" WHERE {member} OFFSET 0)"
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
    member = _members(community)
    hidden = "NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = {doc} AND " + DOC_VISIBLE + ")"  # noqa: S608 - DOC_VISIBLE is a constant
    by_mentions = (
        "NOT EXISTS (SELECT 1 FROM community_members cm JOIN mentions m"  # noqa: S608 - constants
        f" ON m.entity_id = cm.entity_id WHERE {member} AND {hidden.format(doc='m.doc_id')}"
        " OFFSET 0)"
    )
    by_evidence = (
        "NOT EXISTS (SELECT 1 FROM community_members cm"  # noqa: S608 - constants
        " JOIN relationships r ON r.source_id = cm.entity_id"
        " JOIN community_members ct ON ct.snapshot_id = cm.snapshot_id"
        "  AND ct.community_id = cm.community_id AND ct.entity_id = r.target_id"
        " JOIN relationship_evidence ev ON ev.relationship_id = r.id"
        f" WHERE {member} AND {hidden.format(doc='ev.doc_id')} OFFSET 0)"
    )
    changed = _changed_through_unseen(member, "NOT d.deleted AND " + DOC_VISIBLE)
    return f"{_has_mentions(member)} AND {by_mentions} AND {by_evidence} AND {changed}"


def community_visible_to_all(community: str) -> str:
    """``community_visible`` for a whole-corpus caller, who sees every live document: the
    checks over the mentions and evidence of live documents hold by definition, what remains
    is that some member still has a mention and that no member changed since the snapshot
    through a document deleted since (the same rule, with nothing else to hide)."""
    member = _members(community)
    return _has_mentions(member) + " AND " + _changed_through_unseen(member, "NOT d.deleted")


def params(caller: Caller) -> dict[str, object]:
    """The bound values of the predicate."""
    return {"v_tenant": caller.tenant, "v_groups": sorted(caller.groups)}


@dataclass(frozen=True)
class Filtered:
    """One read in its forms: as the operator runs it, filtered for a restricted caller, and
    for a whole-corpus caller (the operator's form unless a read differs for them: community
    summaries, which may quote a document deleted since the snapshot); and, for a read written
    with ``DOC_VISIBLE``, scoped to a query's documents (None: the read is not scoped)."""

    admin: TextClause
    untenanted: TextClause  # filtered, for a caller without a tenant
    tenanted: TextClause  # filtered, for a caller of a tenant
    whole: TextClause
    scoped_all: TextClause | None = None  # in scope, for an admin or whole-corpus caller
    scoped_untenanted: TextClause | None = None  # visible and in scope
    scoped_tenanted: TextClause | None = None

    @classmethod
    def of(
        cls, admin: str, restricted: str, whole: str | None = None, *, scoped: bool = True
    ) -> Filtered:
        """The forms from SQL text (``restricted`` written with ``DOC_VISIBLE``); ``scoped``
        False for a read a document scope leaves as it is (community summaries)."""
        in_scope = restricted.replace(DOC_VISIBLE, f"({DOC_VISIBLE} AND {DOC_MATCHES})")
        return cls(
            text(admin),
            text(restricted.replace(_SAME_TENANT, _TENANT_FORMS[True])),
            text(restricted.replace(_SAME_TENANT, _TENANT_FORMS[False])),
            text(admin if whole is None else whole),
            *(
                (
                    text(restricted.replace(DOC_VISIBLE, DOC_MATCHES)),
                    text(in_scope.replace(_SAME_TENANT, _TENANT_FORMS[True])),
                    text(in_scope.replace(_SAME_TENANT, _TENANT_FORMS[False])),
                )
                if scoped and DOC_VISIBLE in restricted
                else (None, None, None)
            ),
        )

    def bind(
        self, caller: Caller, values: Mapping[str, object]
    ) -> tuple[TextClause, dict[str, object]]:
        """(statement, parameters) for the caller: ``conn.execute(*stmt.bind(caller, {...}))``."""
        scope = caller.scope
        if scope is not None and self.scoped_all is not None:
            if caller.admin or caller.whole_corpus:
                return self.scoped_all, {**values, **scope.params()}
            form = self.scoped_untenanted if caller.tenant is None else self.scoped_tenanted
            assert form is not None  # noqa: S101 - built with scoped_all
            return form, {**values, **params(caller), **scope.params()}
        if caller.admin:
            return self.admin, dict(values)
        if caller.whole_corpus:
            return self.whole, dict(values)
        filtered = self.untenanted if caller.tenant is None else self.tenanted
        return filtered, {**values, **params(caller)}


# Whether a caller sees every live document, from the index of live documents by tenant and
# ACL digest (migrations 0013, 0019) without reading every document: no live document of
# another tenant, and every distinct ACL of the caller's tenant shares a group with the caller.
# The ACLs are walked one index probe each, in digest order (the ACL itself is read from the
# row the probe lands on: the index holds 32 bytes whatever the ACL's size), stopping at the
# first the caller does not share; past WHOLE_CORPUS_ACL_PROBES of them the walk gives up (the
# caller keeps the filtered reads), which bounds the check at that many probes (~0.05 ms each)
# in a corpus with a distinct ACL per document, a small part of a query's budget. Each probe
# orders by the index's own columns, tenant first: PostgreSQL does not take "tenant IS NULL"
# as fixing the first column, so ordering by the digest alone sorted every live document
# (48 ms a query at 370k documents, docs/BENCHMARKS.md, issue 32 step 5) instead of one probe.
WHOLE_CORPUS_ACL_PROBES = 64
_OTHER_TENANT = {
    True: "EXISTS (SELECT 1 FROM documents d WHERE NOT d.deleted AND d.tenant IS NOT NULL)",
    False: (
        "EXISTS (SELECT 1 FROM documents d WHERE NOT d.deleted AND d.tenant IS NULL)"
        " OR EXISTS (SELECT 1 FROM documents d WHERE NOT d.deleted AND d.tenant < :v_tenant)"
        " OR EXISTS (SELECT 1 FROM documents d WHERE NOT d.deleted AND d.tenant > :v_tenant)"
    ),
}
_IN_TENANT = {True: "d.tenant IS NULL", False: "d.tenant = :v_tenant"}
_DIGEST = "kgstream_acl_digest(d.acl)"


def _whole_corpus_sql(no_tenant: bool) -> TextClause:
    own = _IN_TENANT[no_tenant]
    return text(
        "WITH RECURSIVE walk(digest, acl, step) AS ("  # noqa: S608 - constants; values bound
        f" (SELECT {_DIGEST}, d.acl, 1 FROM documents d WHERE NOT d.deleted AND {own}"
        f"   AND {_DIGEST} IS NOT NULL ORDER BY d.tenant, {_DIGEST} LIMIT 1)"
        " UNION ALL"
        " SELECT n.digest, n.acl, w.step + 1 FROM walk w CROSS JOIN LATERAL"
        f" (SELECT {_DIGEST} AS digest, d.acl FROM documents d WHERE NOT d.deleted AND {own}"
        f"   AND {_DIGEST} > w.digest ORDER BY d.tenant, {_DIGEST} LIMIT 1) n"
        " WHERE w.acl && CAST(:v_groups AS text[]) AND w.step < :probes)"
        f" SELECT NOT ({_OTHER_TENANT[no_tenant]})"
        " AND NOT EXISTS (SELECT 1 FROM walk"
        "  WHERE NOT acl && CAST(:v_groups AS text[]) OR step >= :probes)"
    )


_WHOLE_CORPUS = {flag: _whole_corpus_sql(flag) for flag in (True, False)}


async def widened(conn: AsyncConnection, caller: Caller) -> Caller:
    """The caller for the reads of ``conn``'s transaction: marked whole-corpus when every live
    document is visible to it in that transaction's snapshot (checked by ``can_see``'s rule
    over the distinct tenants and ACLs of live documents), so its reads take the unfiltered
    statements and plans; otherwise, and for admins, as given. Run inside the read
    transaction, so the decision and the reads see the same documents."""
    if caller.admin or caller.whole_corpus:
        return caller
    values = {**params(caller), "probes": WHOLE_CORPUS_ACL_PROBES}
    if await conn.scalar(_WHOLE_CORPUS[caller.tenant is None], values):
        return replace(caller, whole_corpus=True)
    return caller


# A restricted caller's name of an entity: its most used visible surface, a full name (one with
# a space) first, over ``s`` (entity_id, surface, n: visible mentions of that surface).
_VISIBLE_NAME = (
    "(array_agg(s.surface ORDER BY (s.surface LIKE '% %') DESC, s.n DESC, s.surface))[1]"
)


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
    " SELECT s.entity_id, "
    + _VISIBLE_NAME
    + ", t.t, sum(s.n), coalesce(x.x, ''), array_agg(s.surface ORDER BY s.surface)"
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


# Name and mention count only (what local mode shows and weighs), by entity_facts' rule for a
# restricted caller; without its description (the first five visible sentences, read and
# sorted over every visible mention: hundreds of ms for an entity with thousands of mentions
# at 1M entities, docs/BENCHMARKS.md, issue 32 step 4) and its aliases.
_NAMES = Filtered.of(
    "SELECT id, name, mention_count FROM entities WHERE id = ANY(:e)",
    "WITH s AS (SELECT m.entity_id, m.surface, count(*) AS n FROM mentions m"  # noqa: S608 - DOC_VISIBLE is a constant
    "  JOIN documents d ON d.doc_id = m.doc_id WHERE m.entity_id = ANY(:e) AND "
    + DOC_VISIBLE
    + "  GROUP BY m.entity_id, m.surface)"
    " SELECT s.entity_id, " + _VISIBLE_NAME + ", sum(s.n) FROM s GROUP BY s.entity_id",
)


async def entity_names(
    conn: AsyncConnection, caller: Caller, entity_ids: Sequence[int]
) -> dict[int, tuple[str, int]]:
    """(name, mention count) of the entities the caller can see (the others are absent), as
    ``entity_facts`` gives them."""
    if not entity_ids:
        return {}
    rows = await conn.execute(*_NAMES.bind(caller, {"e": sorted(set(entity_ids))}))
    return {int(r[0]): (str(r[1]), int(r[2])) for r in rows.all()}


# Name, type and mention count (what a typed graph plan's rows show and filter on), by
# entity_facts' rule for a restricted caller, without its description and aliases: the
# description's sorted sentences cost hundreds of ms for a hub at 1M entities.
_KINDS = Filtered.of(
    "SELECT id, name, type, mention_count FROM entities WHERE id = ANY(:e)",
    "WITH vm AS (SELECT m.entity_id, m.surface, m.type FROM mentions m"  # noqa: S608 - DOC_VISIBLE is a constant
    "  JOIN documents d ON d.doc_id = m.doc_id WHERE m.entity_id = ANY(:e) AND "
    + DOC_VISIBLE
    + "),"
    " s AS (SELECT entity_id, surface, count(*) AS n FROM vm GROUP BY entity_id, surface),"
    " t AS (SELECT entity_id, mode() WITHIN GROUP (ORDER BY type) AS t FROM vm"
    "  GROUP BY entity_id)"
    " SELECT s.entity_id, " + _VISIBLE_NAME + ", t.t, sum(s.n)"
    " FROM s JOIN t USING (entity_id) GROUP BY s.entity_id, t.t",
)


async def entity_kinds(
    conn: AsyncConnection, caller: Caller, entity_ids: Sequence[int]
) -> dict[int, EntityFacts]:
    """Name, type and mention count of the entities the caller can see (the others are
    absent), as ``entity_facts`` gives them; description and aliases left empty."""
    if not entity_ids:
        return {}
    rows = await conn.execute(*_KINDS.bind(caller, {"e": sorted(set(entity_ids))}))
    return {int(r[0]): EntityFacts(str(r[1]), str(r[2]), int(r[3]), "", []) for r in rows.all()}
