"""Curations: a person's corrections to entity resolution, kept as rules (issue 21).

A curation is a rule that resolution applies at every ingest, so it survives re-upserts,
deletes, replays and rebuilds (docs/curation.md). Kinds, by the normalised keys of the names
they were given:
- ``merge`` (a, b): mentions keyed ``b`` resolve to ``a``'s entity;
- ``alias`` (a, b): the same rule for a name that may not have been seen yet;
- ``block`` (a, b): ``a`` and ``b`` are never resolved to one entity;
- ``split`` (a, b): a block of a pair that was merged when it was made;
- ``rename`` (a, name): ``a``'s entities show ``name`` (and the name's key resolves to ``a``).

Rows are never deleted: an undo stamps ``undone_at``/``undone_by``. ``applied_at`` (and
``undo_applied_at``) say when the documents the rule touches were resolved again under it
(services/indexer/curation_apply.py). ``kg_meta['curation_version']`` counts rule changes: every
write transaction that resolves entities takes a shared advisory lock and checks the version
against the rules its plan was computed with, and a rule change takes it exclusively
(services/core/curations.py), so no event commits under rules older than a committed curation.

``curation_work``: the documents the apply still has to resolve again under the rules of
``version`` (``state`` todo, done or failed), so a run that stops goes on where it was.
``consolidation_verdicts``: the adjudicator's answer per pair of keys, so consolidation asks
about a pair once (services/maintenance/consolidation.py).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE curations ("
        " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " kind text NOT NULL CHECK (kind IN ('merge', 'alias', 'block', 'split', 'rename')),"
        " name_a text NOT NULL,"
        " key_a text NOT NULL,"
        " name_b text NOT NULL,"
        " key_b text NOT NULL,"
        " reason text NOT NULL DEFAULT '',"
        " created_by text NOT NULL,"
        " created_at timestamptz NOT NULL DEFAULT now(),"
        " applied_at timestamptz,"
        " undone_by text,"
        " undone_at timestamptz,"
        " undo_reason text,"
        " undo_applied_at timestamptz,"
        " CHECK (key_a <> key_b OR kind = 'rename'))"
    )
    op.execute("CREATE INDEX curations_active ON curations (key_a) WHERE undone_at IS NULL")
    op.execute("INSERT INTO kg_meta (key, value) VALUES ('curation_version', '0')")
    op.execute(
        "CREATE TABLE curation_work ("
        " doc_id text PRIMARY KEY,"
        " version bigint NOT NULL,"
        " state text NOT NULL DEFAULT 'todo' CHECK (state IN ('todo', 'done', 'failed')))"
    )
    op.execute(
        "CREATE TABLE consolidation_verdicts ("
        " key_short text NOT NULL,"
        " key_long text NOT NULL,"
        " same boolean NOT NULL,"
        " decided_at timestamptz NOT NULL DEFAULT now(),"
        " PRIMARY KEY (key_short, key_long))"
    )


def downgrade() -> None:
    op.execute("DROP TABLE consolidation_verdicts")
    op.execute("DROP TABLE curation_work")
    op.execute("DELETE FROM kg_meta WHERE key = 'curation_version'")
    op.execute("DROP TABLE curations")
