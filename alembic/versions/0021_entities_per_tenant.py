"""Entity resolution per tenant (issue 30, finding 4): ``entities.tenant``.

Entities were shared by every tenant (one per key and type group), so one tenant's documents
steered how another's resolved: an alias its publisher gave, a key it used first, a trigram
candidate, a wildcard it narrowed, its mention counts in the tie-break. Now an entity belongs
to the scope of the documents that mention it: a tenant, or NULL for the untenanted documents
(a scope of their own). Resolution reads and creates entities of the document's scope only
(services/indexer/graph_store/entities.py), so no statement of it sees another tenant's
entities, their aliases or their names.

- ``entities.tenant``; the unique key becomes (key, type_group, tenant) NULLS NOT DISTINCT,
  key first so the look-up by key stays an index scan.
- Aliases, mentions and relationships need no column: an alias and a relationship belong to
  their entities, a mention to its document.

Existing databases: every entity takes the scope of its oldest mention's document, and an
entity that documents of several scopes mention is **split**, in SQL, in this transaction: a
copy per other scope (same key, type group and name embedding) takes that scope's mentions
and the aliases they use; each relationship's evidence moves to the relationship between its
document's scope's copies; counts, names, types, descriptions and weights are rebuilt from the
evidence as the indexer rebuilds them, rows left without evidence are removed, and the change
is logged in graph_changes (so the communities are recomputed). From then on no tenant sees
another's mentions in an entity's counts, aliases or description.

The split reads every mention once and rewrites the mentions, aliases and evidence of the
shared entities, holding writes to the graph's tables until it commits: run the migration job
with the indexers stopped (its time grows with the mentions of shared entities; it has not
been measured at scale).

Chosen over re-resolving the documents because it needs no model and no topic, and cannot
fail half-way. What it cannot undo is what resolution decided before with another tenant's
entities in view: a name merged into another tenant's similar name keeps that entity's key,
a wildcard narrowed by another tenant's typed mention keeps the type group, a short form
read by another tenant's alias stays read so. For each tenant's graph to be exactly what its
documents alone give, rebuild from the topic after upgrading (docs/operations.md,
"Re-indexing from the topic"); a deployment with one tenant (or none) has nothing to split.

Downgrade merges the copies back: one entity per (key, type_group), the oldest, takes the
others' mentions, aliases and evidence, aggregates rebuilt the same way; then the old unique
key and no column.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# Every (entity, scope of a document that mentions it).
_SCOPES = (
    "CREATE TEMP TABLE scopes_0021 ON COMMIT DROP AS"
    " SELECT DISTINCT m.entity_id, d.tenant FROM mentions m JOIN documents d"
    " ON d.doc_id = m.doc_id"
)
# remap_0021 (entity_id, tenant, new_id): the mentions of entity_id in documents of tenant go
# to new_id, and with them that scope's aliases and relationship evidence.
_REMAP = (
    "CREATE TEMP TABLE remap_0021 (entity_id bigint, tenant text, new_id bigint) ON COMMIT DROP"
)
_OWN_SCOPE = (
    "UPDATE entities e SET tenant = f.tenant FROM (SELECT DISTINCT ON (m.entity_id)"
    "  m.entity_id, d.tenant FROM mentions m JOIN documents d ON d.doc_id = m.doc_id"
    "  ORDER BY m.entity_id, m.id) f"
    " WHERE e.id = f.entity_id AND e.tenant IS DISTINCT FROM f.tenant"
)
_SPLIT = (
    "INSERT INTO remap_0021 (entity_id, tenant) SELECT s.entity_id, s.tenant"
    " FROM scopes_0021 s JOIN entities e ON e.id = s.entity_id"
    " WHERE s.tenant IS DISTINCT FROM e.tenant"
)
_COPIES = (
    "WITH c AS (INSERT INTO entities (key, name, type, type_group, description, embedding,"
    "  tenant) SELECT e.key, e.name, e.type, e.type_group, e.description, e.embedding, r.tenant"
    "  FROM remap_0021 r JOIN entities e ON e.id = r.entity_id ORDER BY e.id, r.tenant"
    "  RETURNING id, key, type_group, tenant)"
    " UPDATE remap_0021 r SET new_id = c.id FROM entities e, c"
    " WHERE e.id = r.entity_id AND (c.key, c.type_group) = (e.key, e.type_group)"
    "  AND c.tenant IS NOT DISTINCT FROM r.tenant"
)
_MERGE = (
    "INSERT INTO remap_0021 (entity_id, tenant, new_id) SELECT s.entity_id, s.tenant, k.keep"
    " FROM scopes_0021 s JOIN entities e ON e.id = s.entity_id JOIN (SELECT key, type_group,"
    "  min(id) AS keep FROM entities GROUP BY key, type_group HAVING count(*) > 1) k"
    " ON (k.key, k.type_group) = (e.key, e.type_group) WHERE e.id <> k.keep"
)
_LOG = (
    "INSERT INTO graph_changes (kind, ref_id, op, event_id)"
    " SELECT kind, ref_id, op, 'migration:0021' FROM {source} ORDER BY kind, ref_id"
)
# The repointing, in statement order (the same in both directions).
_REPOINT = (
    "UPDATE mentions m SET entity_id = r.new_id FROM documents d, remap_0021 r"
    " WHERE d.doc_id = m.doc_id AND r.entity_id = m.entity_id"
    " AND r.tenant IS NOT DISTINCT FROM d.tenant",
    "INSERT INTO aliases (entity_id, alias, alias_key) SELECT DISTINCT r.new_id, a.alias,"
    " a.alias_key FROM remap_0021 r JOIN aliases a ON a.entity_id = r.entity_id"
    " WHERE EXISTS (SELECT 1 FROM mentions m WHERE m.entity_id = r.new_id"
    "  AND m.surface = a.alias) ORDER BY 1, 2 ON CONFLICT DO NOTHING",
    # Each piece of evidence whose ends moved in its document's scope, to the edge between
    # the new ends (a co-occurrence is stored once, lower id first).
    "CREATE TEMP TABLE moved_0021 ON COMMIT DROP AS SELECT v.id AS evidence_id,"
    " r.id AS old_id, r.type, coalesce(rs.new_id, r.source_id) AS s,"
    " coalesce(rt.new_id, r.target_id) AS t FROM relationship_evidence v"
    " JOIN relationships r ON r.id = v.relationship_id JOIN documents d ON d.doc_id = v.doc_id"
    " LEFT JOIN remap_0021 rs ON rs.entity_id = r.source_id"
    "  AND rs.tenant IS NOT DISTINCT FROM d.tenant"
    " LEFT JOIN remap_0021 rt ON rt.entity_id = r.target_id"
    "  AND rt.tenant IS NOT DISTINCT FROM d.tenant"
    " WHERE rs.new_id IS NOT NULL OR rt.new_id IS NOT NULL",
    "UPDATE moved_0021 SET s = least(s, t), t = greatest(s, t) WHERE type = 'co_occurs'",
    "CREATE TEMP TABLE changes_0021 (kind text, ref_id bigint, op text) ON COMMIT DROP",
    "WITH n AS (INSERT INTO relationships (source_id, target_id, type)"
    " SELECT DISTINCT s, t, type FROM moved_0021 ORDER BY 1, 2, 3"
    " ON CONFLICT (source_id, target_id, type) DO NOTHING RETURNING id)"
    " INSERT INTO changes_0021 SELECT 'edge', id, 'add' FROM n",
    "CREATE TEMP TABLE edges_0021 ON COMMIT DROP AS SELECT DISTINCT old_id AS id FROM moved_0021",
    "WITH v AS (UPDATE relationship_evidence v SET relationship_id = n.id FROM moved_0021 mv"
    " JOIN relationships n ON (n.source_id, n.target_id, n.type) = (mv.s, mv.t, mv.type)"
    " WHERE v.id = mv.evidence_id RETURNING v.relationship_id)"
    " INSERT INTO edges_0021 SELECT DISTINCT relationship_id FROM v",
    # What no evidence supports any more: relationships, then entities (their aliases go with
    # them), then the aliases no mention uses.
    "WITH gone AS (DELETE FROM relationships r WHERE NOT EXISTS"
    " (SELECT 1 FROM relationship_evidence v WHERE v.relationship_id = r.id)"
    " AND (r.id IN (SELECT old_id FROM moved_0021) OR r.source_id IN (SELECT entity_id"
    "  FROM remap_0021) OR r.target_id IN (SELECT entity_id FROM remap_0021)) RETURNING id)"
    " INSERT INTO changes_0021 SELECT 'edge', id, 'remove' FROM gone",
    "WITH gone AS (DELETE FROM entities e WHERE e.id IN (SELECT entity_id FROM remap_0021)"
    " AND NOT EXISTS (SELECT 1 FROM mentions m WHERE m.entity_id = e.id)"
    " AND NOT EXISTS (SELECT 1 FROM relationships r WHERE e.id IN (r.source_id, r.target_id))"
    " RETURNING id) INSERT INTO changes_0021 SELECT 'node', id, 'remove' FROM gone",
    "DELETE FROM aliases a WHERE a.entity_id IN (SELECT entity_id FROM remap_0021"
    " UNION SELECT new_id FROM remap_0021) AND NOT EXISTS (SELECT 1 FROM mentions m"
    " WHERE m.entity_id = a.entity_id AND m.surface = a.alias)",
    # Aggregates, as services/indexer/graph_store/rebuild.py writes them.
    "UPDATE relationships r SET weight = s.w, evidence_count = s.n, description = s.x"
    " FROM (SELECT relationship_id, sum(strength) AS w, count(*) AS n,"
    "  left(string_agg(sentence, ' ' ORDER BY doc_id, sentence), 2000) AS x"
    "  FROM relationship_evidence WHERE relationship_id IN (SELECT id FROM edges_0021)"
    "  GROUP BY relationship_id) s WHERE r.id = s.relationship_id",
    "UPDATE entities e SET mention_count = s.n, type = s.t, name = coalesce((SELECT c.name_b"
    "  FROM curations c WHERE c.key_a = e.key AND c.kind = 'rename' AND c.undone_at IS NULL"
    "  ORDER BY c.id DESC LIMIT 1), s.nm),"
    " description = s.x, updated_at = now()"
    " FROM (SELECT entity_id, count(*) AS n,"
    "  mode() WITHIN GROUP (ORDER BY type) AS t,"
    "  (SELECT m3.surface FROM mentions m3 WHERE m3.entity_id = m.entity_id"
    "   GROUP BY m3.surface ORDER BY (m3.surface LIKE '% %') DESC, count(*) DESC,"
    "   m3.surface LIMIT 1) AS nm,"
    "  (SELECT left(string_agg(q.sentence, ' ' ORDER BY q.doc_id, q.sentence), 1500)"
    "   FROM (SELECT DISTINCT m2.doc_id, m2.sentence FROM mentions m2"
    "         WHERE m2.entity_id = m.entity_id ORDER BY m2.doc_id, m2.sentence"
    "         LIMIT 5) q) AS x"
    "  FROM mentions m WHERE m.entity_id IN (SELECT entity_id FROM remap_0021"
    "   UNION SELECT new_id FROM remap_0021) GROUP BY m.entity_id) s"
    " WHERE e.id = s.entity_id",
    "INSERT INTO changes_0021 SELECT 'node', new_id, 'add' FROM remap_0021"
    " WHERE new_id NOT IN (SELECT entity_id FROM remap_0021) AND EXISTS"
    " (SELECT 1 FROM entities e WHERE e.id = new_id) AND NOT EXISTS (SELECT 1 FROM scopes_0021 s"
    "  WHERE s.entity_id = new_id)",
    "INSERT INTO changes_0021 SELECT DISTINCT 'node', id, 'change' FROM (SELECT new_id AS id"
    " FROM remap_0021 UNION SELECT entity_id FROM remap_0021) x WHERE EXISTS"
    " (SELECT 1 FROM entities e WHERE e.id = x.id) AND x.id NOT IN"
    " (SELECT ref_id FROM changes_0021 WHERE kind = 'node')",
    "INSERT INTO changes_0021 SELECT DISTINCT 'edge', id, 'change' FROM edges_0021"
    " WHERE id NOT IN (SELECT ref_id FROM changes_0021 WHERE kind = 'edge')",
    _LOG.format(source="changes_0021"),
)


def _repoint() -> None:
    op.execute("ANALYZE remap_0021")  # often empty (one tenant or none): let the plans know
    for statement in _REPOINT:
        op.execute(statement)


def upgrade() -> None:
    op.execute("ALTER TABLE entities ADD COLUMN tenant text")
    op.execute("ALTER TABLE entities DROP CONSTRAINT entities_key_group")
    op.execute(
        "ALTER TABLE entities ADD CONSTRAINT entities_key_group_tenant"
        " UNIQUE NULLS NOT DISTINCT (key, type_group, tenant)"
    )
    op.execute(_SCOPES)
    op.execute(_REMAP)
    op.execute(_OWN_SCOPE)
    op.execute(_SPLIT)
    op.execute(_COPIES)
    _repoint()


def downgrade() -> None:
    op.execute(_SCOPES)
    op.execute(_REMAP)
    op.execute(_MERGE)
    _repoint()
    op.execute("ALTER TABLE entities DROP CONSTRAINT entities_key_group_tenant")
    op.execute("ALTER TABLE entities ADD CONSTRAINT entities_key_group UNIQUE (key, type_group)")
    op.execute("ALTER TABLE entities DROP COLUMN tenant")
